"""Live mode: a watcher and its warm worker keep the store current, an ordinary ingest run per settled set of changes.

events | polls | reconciliation -> settled set of sources -> worker: ingest flow run (sources=...) -> published version
                                                            -> (idle) worker: live maintenance flow run

The watcher (this module) notices, settles and schedules; the worker process (flows/watch_worker.py) holds the
models and connections warm and runs the flows. A worker that has grown is replaced by a warmed spare between
two micro-batches (runtime/worker.py says why), so the watcher's memory stays bounded over days.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from prefect import flow
from prefect.settings import get_current_settings

from runtime.watch import Pending, Schedule, start_following
from runtime.worker import WarmWorker
from schemas.config import DEFAULT_CONFIG, InletConfig, SourceConfig, load_config
from schemas.errors import StoreBusyError, WorkerDiedError
from store.tables import watcher_lock
from tasks.crawl import path_filter

RUN_PREFIX = "watch-"  # every micro-batch run's name starts so: the UI filters on it, a restart finds its dead runs
CHANGED_EVENT = "inlet.sources.changed"  # what `inlet watch --emit-only` emits instead of running
RECONCILE = "reconcile"
MAINTAIN = "maintain"
log = logging.getLogger("inlet.watch")


@dataclass
class Batch:
    """What one micro-batch did: its run, the sources and why they were due, and how long it took."""

    sources: list[str]
    why: dict[str, str]
    started: datetime
    seconds: float  # the flow run, start to return
    since_notice: float | None  # first notice of the change to the published version
    summary: dict | None = None
    error: str | None = None
    kind: str = "ingest"  # ingest | emit | maintenance | worker (a worker replaced by its spare)
    detail: dict | None = None  # what a worker line reports

    def line(self) -> dict:
        """One JSON-able line for logs, `inlet watch --json` and the freshness benchmark."""
        s = self.summary or {}
        keys = ("run_id", "docs_new", "docs_changed", "docs_unchanged", "docs_deleted", "docs_quarantined", "chunks_added",
                "chunks_removed", "texts_embedded", "texts_enriched", "texts_embed_cached")
        return {"kind": self.kind, "sources": self.sources, "why": sorted(set(self.why.values())),
                "at": self.started.isoformat(), "seconds": round(self.seconds, 3),
                "since_notice": None if self.since_notice is None else round(self.since_notice, 3),
                "error": self.error, **{k: s[k] for k in keys if k in s},
                "version": (s.get("versions") or {}).get("chunks"),
                "slowest": dict(sorted((s.get("stage_seconds") or {}).items(), key=lambda kv: -kv[1])[:3]),
                **({"detail": self.detail} if self.detail else {})}


def local_roots(cfg: InletConfig) -> list[Path]:
    """What file-system events are watched under: each local folder source, each bundle file's folder."""
    roots = []
    for src in cfg.sources:
        if src.kind == "folder" and src.path is not None:
            roots.append(src.path)
        elif src.kind == "bundle" and src.path is not None:
            roots.append(src.path.parent)
    return list(dict.fromkeys(roots))


def polled_sources(cfg: InletConfig) -> dict[str, float]:
    """The sources events cannot see (object storage, web), with their poll intervals in seconds."""
    return {s.name: s.poll_s or cfg.watch.poll_s for s in cfg.sources
            if s.kind == "web" or (s.kind == "folder" and s.uri is not None)}


def _router(src: SourceConfig) -> Callable[[str], bool]:
    """Whether an event's path may change this source's documents."""
    if src.kind == "bundle":
        bundle = str(src.path)
        return lambda path: path == bundle
    root = str(src.path).rstrip(os.sep) + os.sep
    taken = path_filter(src.include, src.exclude)

    def routes(path: str) -> bool:
        if not path.startswith(root):
            return False
        rel = path[len(root):].replace(os.sep, "/")
        if taken(rel):
            return True
        # A folder moved or removed as a whole reports only the folder: its files went with it.
        return not os.path.isfile(path) and not os.path.splitext(path)[1] and not rel.startswith(".")

    return routes


def route_events(cfg: InletConfig) -> Callable[[str], set[str]]:
    """Map an event's path to the sources whose documents it may change (none for a file no source takes)."""
    routers = [(s.name, _router(s)) for s in cfg.sources
               if s.path is not None and s.kind in ("folder", "bundle") and s.uri is None]
    return lambda path: {name for name, routes in routers if routes(path)}


def crash_dead_runs(cfg: InletConfig, config_path: str) -> list[str]:
    """Mark this store's micro-batch runs a killed watcher left Running as Crashed; return their names.

    Called while holding the watcher lock: no other watcher of this store is alive, so any such run is dead.
    """
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterName, \
        FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    crashed = []
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["ingest", "maintenance-live"])),
                                     flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(like_=RUN_PREFIX),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING]))))
        for run in runs:
            if str(run.parameters.get("config_path")) != config_path:
                continue
            client.set_flow_run_state(run.id, Crashed(message="its `inlet watch` process was killed; the "
                                                      "restarted watcher's reconciliation redid its work"), force=True)
            crashed.append(run.name)
    return crashed


def emit_changed(cfg: InletConfig, config_path: str, sources: list[str], why: dict[str, str]) -> None:
    """Emit the event that triggers the ingest deployment (prefect.yaml's triggers) instead of running here."""
    from prefect.events import emit_event

    from flows.publishing import store_resource

    emit_event(event=CHANGED_EVENT, resource=store_resource(cfg),
               payload={"config_path": config_path, "sources": sources, "why": sorted(set(why.values()))})


def run_name(kind: str = "") -> str:
    """A micro-batch's (or live maintenance's) flow run name: watch-[kind-]<UTC time to the microsecond>."""
    return f"{RUN_PREFIX}{kind + '-' if kind else ''}{datetime.now(UTC):%Y%m%dT%H%M%S%f}"


@dataclass
class Watcher:
    """The live loop's state: what is due, when periodic work falls due, and how it is going."""

    config_path: str
    cfg: InletConfig
    stop: threading.Event
    emit_only: bool = False
    on_batch: Callable[[Batch], None] = lambda batch: None
    worker: WarmWorker | None = None  # runs the flows; None in emit-only mode
    pending: Pending = field(default_factory=Pending)
    failures: int = 0
    since_maintenance: int = 0  # micro-batches since live maintenance last ran
    last_batch: float = 0.0  # monotonic time the last micro-batch ended
    last_maintenance: float = field(default_factory=time.monotonic)
    events_on: bool = False

    def source_names(self) -> list[str]:
        """The names of every configured source, in config order."""
        return [s.name for s in self.cfg.sources]

    def step(self, schedule: Schedule) -> None:
        """Wait for the next due work and do it: a micro-batch, an emitted event, or maintenance when idle."""
        due, first, paths = self.pending.take(schedule.wait(time.monotonic()))
        now = time.monotonic()
        periodic = schedule.due(now)
        if RECONCILE in periodic or RECONCILE in due.values():
            due = dict.fromkeys(self.source_names(), RECONCILE) | {k: v for k, v in due.items() if v != "events"}
            paths = {}
            schedule.reset(RECONCILE, now)
        polled = {name.removeprefix("poll:"): "poll" for name in periodic if name.startswith("poll:")}
        due |= polled
        # Paths only for sources that events alone made due; the others are listed whole.
        scoped = sorted(p for name, named in paths.items() if named and name not in polled and due.get(name) == "events"
                        for p in named)
        if due:
            self._ingest(due, first if first is not None else now, scoped)
            self.last_batch = time.monotonic()
        elif self.worker is not None:
            self.worker.hand_over()  # a spare warmed during the last micro-batches takes over now, not at the next
        if (due or MAINTAIN in periodic) and self.maintenance_due(time.monotonic(), self.pending.waiting()):
            self._maintain()
            self.last_maintenance = time.monotonic()

    def maintenance_due(self, now: float, waiting: bool = False) -> bool:
        """Whether live maintenance should run now: due (enough micro-batches, or long enough), and no change waits.

        waiting: a change is pending; maintenance then waits for the next gap, for a change waits the length of a
        maintenance run otherwise. Never a gap (a steady stream of changes) for twice the batches that make it
        due, it runs anyway: the bounds on versions and files must hold under any load.
        """
        w = self.cfg.watch
        if self.emit_only or not self.since_maintenance:
            return False
        if self.since_maintenance >= 2 * w.maintain_every:
            return True
        quiet = now - self.last_batch
        due = (self.since_maintenance >= w.maintain_every or now - self.last_maintenance >= w.maintain_max_s
               or quiet >= w.maintain_quiet_s)
        return due and not waiting and quiet >= w.maintain_idle_s

    def _ingest(self, due: dict[str, str], first: float, paths: list[str]) -> None:
        names = [n for n in self.source_names() if n in due]
        started = datetime.now(UTC)
        begin = time.monotonic()
        batch = Batch(names, due, started, 0.0, None, kind="emit" if self.emit_only else "ingest")
        try:
            if self.emit_only:
                emit_changed(self.cfg, self.config_path, names, due)
            else:
                assert self.worker is not None
                batch.summary = self.worker.call(
                    ("ingest", None if len(names) == len(self.source_names()) else names, paths or None))
            self.failures = 0
            self.since_maintenance += 1
        except StoreBusyError as exc:  # another writer (a scheduled run, maintenance): its turn first, then ours
            batch.error = str(exc)
            self.pending.add(names, "busy")  # whole sources: simpler than keeping the paths, and rare
            self.stop.wait(1.0)
        except Exception as exc:  # noqa: BLE001 - the watcher outlives any one run's failure (a broken config too)
            batch.error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, WorkerDiedError):
                self.crashed()
            self.failures += 1
            self.pending.add(names, "retry")
            self.stop.wait(min(60.0, 2.0 ** self.failures))  # a broken config or store: back off, then try again
        batch.seconds = time.monotonic() - begin
        batch.since_notice = time.monotonic() - first
        self.on_batch(batch)

    def _maintain(self) -> None:
        started = datetime.now(UTC)
        begin = time.monotonic()
        batch = Batch([], {}, started, 0.0, None, kind="maintenance")
        try:
            assert self.worker is not None
            batch.summary = self.worker.call(("maintain",))
            self.since_maintenance = 0
        except StoreBusyError as exc:
            batch.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - maintenance failing must not stop the store being kept fresh
            batch.error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, WorkerDiedError):
                self.crashed()
        batch.seconds = time.monotonic() - begin
        self.on_batch(batch)

    def on_worker_replaced(self, info: dict) -> None:
        """Report a worker handing over to its spare as a line of its own."""
        self.on_batch(Batch([], {}, datetime.now(UTC), 0.0, None, kind="worker", detail=info))

    def crashed(self) -> None:
        """The worker died mid-run: mark its run Crashed now (the next micro-batch redoes its work)."""
        try:
            for name in crash_dead_runs(self.cfg, self.config_path):
                log.warning("the worker died during %s: marked Crashed; its sources are redone", name)
        except Exception as exc:  # noqa: BLE001 - the API may be down too; the next start marks it then
            log.warning("could not mark the dead worker's run Crashed (%s: %s)", type(exc).__name__, exc)

    def on_events_failed(self, exc: Exception) -> None:
        """File-system events stopped: say so, and let reconciliation (and a catch-up run now) carry on."""
        log.warning("file-system events stopped (%s: %s); changes are found by reconciliation every %g s",
                    type(exc).__name__, exc, self.cfg.watch.reconcile_s)
        self.events_on = False
        self.pending.add(self.source_names(), "events lost")


def watch_loop(config_path: str | Path = DEFAULT_CONFIG, *, events: bool | None = None, emit_only: bool = False,
               stop: threading.Event | None = None, on_batch: Callable[[Batch], None] | None = None,
               on_ready: Callable[[dict], None] | None = None) -> None:
    """Keep the store current until stop is set: reconcile at start, then run each settled set of changes.

    events (default watch.events) turns file-system events on or off; off, reconciliation every
    watch.reconcile_s and polling alone find changes. emit_only: emit CHANGED_EVENT for a worker's ingest
    deployment to run instead of running here.
    """
    config_path = str(Path(config_path).resolve())
    cfg = load_config(config_path)
    stop = stop or threading.Event()
    watcher = Watcher(config_path, cfg, stop, emit_only, on_batch or (lambda batch: None))
    with watcher_lock(cfg.store.uri), contextlib.ExitStack() as stack:
        crashed = [] if emit_only else crash_dead_runs(cfg, config_path)
        warmed: dict = {}
        if not emit_only:
            watcher.worker = start_worker(cfg, config_path, watcher.on_worker_replaced)
            stack.callback(watcher.worker.close)
            warmed = watcher.worker.start()["warmed"]
        now = time.monotonic()
        schedule = Schedule(now)
        schedule.every(RECONCILE, cfg.watch.reconcile_s)
        for name, seconds in polled_sources(cfg).items():
            schedule.every(f"poll:{name}", seconds)
        schedule.every(MAINTAIN, max(1.0, min(5.0, cfg.watch.maintain_idle_s)))  # due by time, or after an idle wait
        roots = local_roots(cfg)
        if (cfg.watch.events if events is None else events) and roots:
            start_following(roots, route_events(cfg), watcher.pending, stop, settle_ms=cfg.watch.settle_ms,
                            max_wait_ms=cfg.watch.max_wait_ms, on_failure=watcher.on_events_failed)
            watcher.events_on = True
        watcher.pending.add(watcher.source_names(), RECONCILE)  # the first run reconciles whatever changed while down
        if on_ready is not None:
            on_ready({"events": watcher.events_on, "roots": [str(r) for r in roots], "warmed": warmed,
                      "crashed": crashed, "polled": polled_sources(cfg), "reconcile_s": cfg.watch.reconcile_s,
                      "worker_pid": watcher.worker.pid() if watcher.worker else None})
        while not stop.is_set():
            watcher.step(schedule)


def worker_env(configured: dict[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """What watch.worker_env adds to the worker's environment: what the watcher's own environment leaves unset."""
    return {name: value for name, value in configured.items() if name not in environ}


def start_worker(cfg: InletConfig, config_path: str, on_replaced: Callable[[dict], None]) -> WarmWorker:
    """The worker that runs this watcher's flows, with this process's Prefect settings (API URL and all)."""
    # As Prefect's own runner hands settings to the processes it starts: a test's or profile's in-process
    # settings reach the worker too, not only what the environment says.
    env = {**worker_env(cfg.watch.worker_env, os.environ),
           **get_current_settings().to_environment_variables(exclude_unset=True)}
    return WarmWorker("flows.watch_worker", [config_path], env=env, growth_mb=cfg.watch.worker_growth_mb,
                      settle_calls=cfg.watch.worker_settle_runs, nice=cfg.watch.worker_nice,
                      on_replaced=on_replaced)


@flow(name="watch", log_prints=True)
def watch(config_path: str = str(DEFAULT_CONFIG), events: bool | None = None, emit_only: bool = False) -> None:
    """Live mode as a deployment: keep the store current until cancelled, each micro-batch an ingest run of its own."""
    from prefect import get_run_logger

    logger = get_run_logger()
    watch_loop(config_path, events=events, emit_only=emit_only,
               on_batch=lambda b: logger.info("%s", b.line()),
               on_ready=lambda info: logger.info("watching: %s", info))

