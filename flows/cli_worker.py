"""The warm process of `inlet server`: runs the `inlet ingest` and `inlet query` that commands hand it (runtime/warm.py).

Started through runtime/worker.py (worker_main) with the config `inlet server` was given: it loads Prefect, LanceDB,
the models and great-expectations once, then runs each request as the command would have in its own process (the
same flow, the same search), sending log lines and progress back to the command as events while it runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from flows.watch_worker import warm_up
from runtime.worker import emit, serve
from schemas.config import InletConfig, load_config
from schemas.errors import InletError, PublishHeldError
from store.tables import live_cache_bounds


class _Forward(logging.Handler):
    """Send each log record at level or above, formatted as this process's console shows it, to the command's terminal.

    Every flow run a record names is announced once as ("run", id) whatever its level: what `inlet server` marks
    Crashed if the run is stopped.
    """

    def __init__(self, level: int, formatter: logging.Formatter | None) -> None:
        super().__init__(logging.NOTSET)
        self.shown = level
        self.runs: set[str] = set()
        self.setFormatter(formatter or logging.Formatter("%(asctime)s | %(levelname)-7s | %(name)s - %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            run_id = getattr(record, "flow_run_id", None)
            if run_id is not None and str(run_id) not in self.runs:
                self.runs.add(str(run_id))
                emit(("run", str(run_id)))
            if record.levelno >= self.shown:
                emit(("log", record.levelno, self.format(record)))
        except Exception:  # noqa: BLE001 - a log line that cannot be sent must not fail the run
            self.handleError(record)


@contextlib.contextmanager
def forwarded_logs(quiet: bool) -> Iterator[None]:
    """While the block runs, the command's terminal gets the log lines its own process would have printed."""
    root = logging.getLogger()
    # The console handler Prefect configures (logging.yml) is root's: its formatter is what a user knows.
    formatter = next((h.formatter for h in root.handlers if h.formatter is not None), None)
    handler = _Forward(logging.WARNING if quiet else logging.INFO, formatter)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


def run_ingest(kwargs: dict[str, Any]) -> dict[str, Any]:
    """One `inlet ingest`: the run's summary and flow run id, or why it was held or failed."""
    from prefect.settings import get_current_settings

    from flows.ingest import ingest
    from runtime.progress import forwarded_bars

    quiet, bars = kwargs.pop("quiet"), kwargs.pop("bars")
    try:
        load_config(kwargs["config_path"])  # a bad config fails before any flow run, as in the command's own process
    except InletError as exc:
        return {"error": str(exc)}
    shown = forwarded_bars(emit) if bars else contextlib.nullcontext()
    with forwarded_logs(quiet), shown:
        state = ingest(**kwargs, return_state=True)
    answer: dict[str, Any] = {"flow_run_id": str(state.state_details.flow_run_id),
                              "ui": get_current_settings().ui_url}  # the UI of the API `inlet server` set
    try:
        answer["summary"] = state.result()
    except PublishHeldError as exc:  # committed and reported, not published
        answer.update(summary=exc.summary, held=str(exc))
    except InletError as exc:
        answer["error"] = str(exc)
    return answer


def run_query(kwargs: dict[str, Any]) -> dict[str, Any]:
    """One `inlet query`: its results, or why it could not be answered."""
    from query import search

    with forwarded_logs(quiet=True):
        try:
            return {"results": search(**kwargs)}
        except InletError as exc:
            return {"error": str(exc)}


def handle(request: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """Run one request: ("ingest", kwargs) or ("query", kwargs)."""
    command, kwargs = request
    if command == "ingest":
        return run_ingest(dict(kwargs))
    if command == "query":
        return run_query(dict(kwargs))
    raise ValueError(f"unknown request {command!r}")


def warm_queries(config_path: str) -> float:
    """Answer one search, so that the first real one finds the table open and the query model loaded."""
    import time

    from query import search

    from providers.embedders import make_embedder, query_embedder, resolve_embedding

    begin = time.perf_counter()
    try:
        search("warm up", k=1, config=config_path)
    except InletError:  # no store yet: load the query model the first run's table will name
        embedding, _ = resolve_embedding(load_config(config_path).embedding)
        if embedding.kind != "gemini":  # a remote model has nothing to load
            query_embedder(make_embedder(embedding).fingerprint, embedding).embed(["warm up"])
    return round(time.perf_counter() - begin, 3)


def reads_other_formats(cfg: InletConfig, limit: int = 20_000) -> bool:
    """Whether a local folder source holds a file that is not Markdown (looking at no more than limit files)."""
    from tasks.extract import MARKDOWN

    seen = 0
    for source in cfg.sources:
        if source.kind != "folder" or source.path is None or source.uri is not None:
            continue
        for _, _, files in os.walk(source.path):
            for name in files:
                if not name.startswith(".") and os.path.splitext(name)[1].lower() not in MARKDOWN:
                    return True
                seen += 1
                if seen >= limit:
                    return False
    return False


def start_extraction(cfg: InletConfig, wait: bool) -> bool:
    """Start the extraction workers where the sources hold files they would read; wait: until one has its parsers.

    Started first and waited for last: they import unstructured on the other core while this process loads the rest.
    """
    from tasks.extract import start_workers

    if not reads_other_formats(cfg):
        return False  # a Markdown-only knowledge base never pays for them
    return start_workers(cfg.extraction, wait=wait)


def wait_for_api(timeout_s: float = 180.0) -> None:
    """Return once the Prefect API answers (`inlet server` starts its server and this process together)."""
    import time

    from prefect import get_client

    deadline = time.monotonic() + timeout_s
    while True:
        with get_client(sync_client=True) as client:
            failed = client.api_healthcheck()
        if failed is None:
            return
        if time.monotonic() > deadline:
            raise failed
        time.sleep(0.25)


def worker_main(args: list[str]) -> None:
    """Warm up for this config (args: [config path]), then run the requests `inlet server` passes on."""
    config_path = args[0]

    def init() -> dict:
        import time

        cfg = load_config(config_path)
        live_cache_bounds()  # long-lived: LanceDB's caches would otherwise grow with every version it opens
        extraction = start_extraction(cfg, wait=False)
        warmed: dict[str, float | None] = warm_up(cfg, api=False)
        warmed["query"] = warm_queries(config_path)
        for name, step in (("extraction workers", lambda: extraction and start_extraction(cfg, wait=True)),
                           ("prefect api", wait_for_api)):
            begin = time.perf_counter()
            step()
            warmed[name] = round(time.perf_counter() - begin, 3)  # what was left to wait for once the rest was done
        return {"warmed": warmed}

    serve(init, handle)
