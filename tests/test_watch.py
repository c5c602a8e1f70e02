"""Live mode (`inlet watch`): events and reconciliation keep the store current, each micro-batch an ingest run."""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest

from flows.watch import Batch, Watcher, route_events, watch_loop
from query import search
from runtime.artifacts import prune_run_folders
from runtime.watch import Pending, Schedule
from schemas.config import LEAN_MEMORY_ENV, load_config
from schemas.errors import ConfigError, StoreBusyError
from store.maintenance import LIVE_FLOOR_ROWS, LIVE_MAX_FRAGMENTS, LIVE_MAX_ROWS, live_exclusions, thinned_tags
from tests.test_real_server import BATCH_STAGES, _read_settled, _stage_counts, prefect_server

ROOT = Path(__file__).resolve().parent.parent
# Validation off where it is not what a test asserts (which runs, what they found, the worker's environment, the
# store's lock): each watcher worker then neither imports nor warms great-expectations (~5 s of CPU a process, taken
# from the tests beside it). The watcher's runs on a real server keep it on: their validate stage is counted there.
NOT_THE_POINT = {"enabled": False}
WORD = "quokkaferry"  # in no sample document


def _wait(what: Callable[[], bool], timeout: float = 60, why: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, f"timed out waiting: {why}"
        time.sleep(0.1)


def _found(config: Path, word: str) -> bool:
    return any(word in hit.text for hit in search(word, k=3, mode="fulltext", config=config))


# --- the pure parts -------------------------------------------------------------------------------------------


def test_events_route_to_the_sources_whose_files_they_touch_and_a_removed_folder_to_its_source(tmp_path,
                                                                                           write_config):
    docs, other = tmp_path / "docs", tmp_path / "other"
    (docs / "sub").mkdir(parents=True)
    other.mkdir()
    (docs / "notes.md").write_text("# a\n")
    (docs / "image.png").write_bytes(b"png")
    config = write_config(docs, sources=[
        {"name": "docs", "path": str(docs), "include": ["**/*.md"]},
        {"name": "other", "path": str(other), "include": ["**/*.md", "**/*.pdf"], "exclude": ["drafts/**"]}])
    route = route_events(load_config(config))
    assert route(str(docs / "notes.md")) == {"docs"}
    assert route(str(docs / "deleted.md")) == {"docs"}, "a vanished file a source takes"
    assert route(str(docs / "image.png")) == set(), "a file no source takes starts no run"
    assert route(str(docs / ".notes.md.swp")) == set(), "an editor's swap file neither"
    assert route(str(docs / "gone-folder")) == {"docs"}, "a folder removed whole took its files with it"
    assert route(str(other / "drafts" / "x.md")) == set(), "excluded"
    assert route(str(other / "paper.pdf")) == {"other"}
    assert route(str(tmp_path / "elsewhere.md")) == set()


def test_pending_keeps_each_sources_first_reason_the_oldest_notice_and_the_paths_events_named():
    pending = Pending()
    assert pending.take(0.01) == ({}, None, {})
    before = time.monotonic()
    pending.add(["a"], "events", {"a": {"/d/x.md"}})
    pending.add(["a", "c"], "events", {"a": {"/d/y.md"}, "c": {"/e/z.md"}})
    pending.add(["b"], "poll")
    pending.add(["c"], "retry")
    due, first, paths = pending.take(0)
    assert due == {"a": "events", "b": "poll", "c": "events"} and first is not None and first >= before
    assert paths == {"a": {"/d/x.md", "/d/y.md"}, "b": None, "c": None}, "marked without paths: listed whole"
    assert pending.take(0) == ({}, None, {}), "taken means cleared"


def test_a_pending_take_wakes_as_soon_as_another_thread_adds():
    pending = Pending()
    threading.Timer(0.1, lambda: pending.add(["a"], "events")).start()
    begin = time.monotonic()
    due, _, _ = pending.take(10)
    assert due == {"a": "events"} and time.monotonic() - begin < 5


def test_a_schedule_names_what_fell_due_and_moves_it_a_period_on():
    schedule = Schedule(now=100.0)
    schedule.every("reconcile", 10)
    schedule.every("poll:web", 3, first=100.0)
    assert schedule.due(100.0) == ["poll:web"]
    assert schedule.wait(100.0) == 3.0
    assert schedule.due(110.0) == ["reconcile", "poll:web"]
    schedule.reset("reconcile", 112.0)
    assert schedule.due(120.0) == ["poll:web"]


def test_thinning_keeps_recent_run_tags_and_the_last_tag_of_each_older_hour():
    t0 = datetime(2026, 11, 27, 10, 0, tzinfo=UTC)
    stamps = {1: t0 + timedelta(minutes=5), 2: t0 + timedelta(minutes=50), 3: t0 + timedelta(minutes=70),
              4: t0 + timedelta(minutes=80), 5: t0 + timedelta(minutes=175)}
    versions = [{"version": v, "timestamp": t} for v, t in stamps.items()]
    tags = {f"run-{v}": {"version": v} for v in stamps} | {"published": {"version": 5}}
    dropped = thinned_tags(tags, versions, recent=t0 + timedelta(minutes=170))
    assert dropped == ["run-1", "run-3"], "the last of 10:00-11:00 and of 11:00-12:00 stay; recent ones all stay"


def test_live_maintenance_falls_due_by_micro_batches_or_a_quiet_spell_waits_for_a_gap_and_not_for_ever(
        corpus, write_config):
    config = write_config(corpus)
    watcher = Watcher(str(config), load_config(config), threading.Event())
    now = 1000.0
    watcher.last_maintenance = watcher.last_batch = now - 1
    assert not watcher.maintenance_due(now), "no micro-batch since the last maintenance: nothing to do"
    watcher.since_maintenance = 1
    assert not watcher.maintenance_due(now), "one micro-batch a second ago: not yet"
    watcher.last_batch = now - 10
    assert watcher.maintenance_due(now), "quiet for maintain_quiet_s: its rows go into the indexes now"
    assert not watcher.maintenance_due(now, waiting=True), "a change waits: it goes first"
    watcher.last_batch = now - 1
    watcher.since_maintenance = 20
    assert watcher.maintenance_due(now) and not watcher.maintenance_due(now, waiting=True)
    watcher.since_maintenance = 40
    assert watcher.maintenance_due(now, waiting=True), "a stream with no gap still gets it at twice the batches"


def test_live_compaction_merges_new_fragments_in_tiers_and_leaves_large_old_ones_alone():
    bulk = (1, 50_000, 50_000)
    assert live_exclusions([bulk, (2, 400, 400), (3, 10, 10), (4, 12, 12)]) == [1], "the small new ones merge"
    assert live_exclusions([bulk, (2, 5_000, 5_000), (3, 3_000, 3_000), (4, 12, 12)]) == [1, 2, 3], \
        "3,000 rows wait until as many newer rows come after them"
    assert live_exclusions([bulk, (2, 5_000, 5_000), (3, 3_000, 3_000), (4, 3_000, 3_000)]) == [1], \
        "two equal tiers merge, and the merged one takes the next tier along"
    assert live_exclusions([(1, 40_000, 50_000), (2, 5_000, 5_000), (3, 12, 12)]) == [2], \
        "a fragment a fifth deleted is rewritten on its own"
    huge = (1, LIVE_MAX_ROWS, 2 * LIVE_MAX_ROWS)
    assert live_exclusions([huge, (2, LIVE_FLOOR_ROWS - 1, LIVE_FLOOR_ROWS - 1)]) == [1], "the nightly run's work"
    scattered = [(i, 3_000 if i % 2 else 150, 3_000 if i % 2 else 150) for i in range(LIVE_MAX_FRAGMENTS + 1)]
    assert live_exclusions([huge, *[(i + 2, r, p) for i, r, p in scattered]]) == [1], \
        "small files left among larger ones by deletions: past the bound, everything under the largest merges"


def test_live_compaction_bounds_fragments_and_rewrites_over_a_day_of_micro_batches():
    fragments: list[tuple[int, int, int]] = [(0, 30_000, 30_000)]
    rewritten = next_id = 0
    for _ in range(4_000):  # a day at one maintenance per 20 micro-batches of ~15 rows each
        fragments.append((next_id := next_id + 1, 300, 300))
        excluded = set(live_exclusions(fragments))
        merged = [f for f in fragments if f[0] not in excluded]
        rewritten += sum(f[1] for f in merged)
        fragments = [f for f in fragments if f[0] in excluded] + [(next_id := next_id + 1, sum(f[1] for f in merged),
                                                                   sum(f[1] for f in merged))]
        fragments.sort(key=lambda f: f[0] if f[0] in excluded else next_id)
    written = 4_000 * 300
    below_max = [f for f in fragments if f[1] < LIVE_MAX_ROWS]
    assert len(below_max) <= 8, fragments
    assert rewritten <= 8 * written, "each row rewritten a few times (log2 of the tiers), not once per maintenance"


def test_run_folder_pruning_keeps_the_newest_runs_and_nothing_else_is_touched(tmp_path):
    names = [f"run-20261127T1000{i:02d}-abcde{i}" for i in range(5)] + ["plan-20261127T100010-ffffff"]
    for name in [*names, "batch-jobs", "inflight"]:
        (tmp_path / name).mkdir()
    deleted = prune_run_folders(tmp_path, keep=2)
    assert deleted == names[:4]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["batch-jobs", "inflight", names[4], names[5]])


def test_a_listing_of_named_paths_takes_files_and_whole_folders_with_the_full_listings_checks(tmp_path):
    from tasks.crawl import matching_files

    (tmp_path / "guide" / "deep").mkdir(parents=True)
    for rel in ("a.md", "b.md", "notes.txt", "guide/c.md", "guide/deep/d.md", "guide/.hidden.md"):
        (tmp_path / rel).write_text("# x\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.md"
    outside.write_text("# secret\n")
    (tmp_path / "link.md").symlink_to(outside)
    include = ("**/*.md",)
    full = {rel for rel, _, _ in matching_files(tmp_path, include, ())}
    named = ["a.md", "notes.txt", "guide", "gone.md", "link.md", "a.md"]
    refused: list[str] = []
    rels = [rel for rel, _, _ in matching_files(tmp_path, include, (), outside=refused, only=named)]
    assert rels == ["a.md", "guide/c.md", "guide/deep/d.md"], "no excluded, hidden, vanished or outside file; no twice"
    assert set(rels) <= full and refused == ["link.md"]


def test_a_scoped_detection_deletes_only_what_its_paths_held_and_keeps_the_deletion_guard(tmp_path):
    import pyarrow as pa

    from tasks.detect import classify_documents, held_deletions

    known = pa.table({"doc_id": ["s:a.md", "s:b.md", "s:g/c.md", "s:g/d.md", "t:x.md"], "source": ["s"] * 4 + ["t"],
                      "size": [1] * 5, "mtime_ns": [1] * 5, "validator": [None] * 5, "content_hash": ["h"] * 5,
                      "status": ["ok"] * 5, "settings_fp": ["f/e"] * 5, "meta_hash": ["m"] * 5})
    from schemas.arrow import LISTING_SCHEMA

    empty = LISTING_SCHEMA.empty_table()
    docs = classify_documents(empty, known, "f/e", sources={"s", "t"}, scope={"s": ["a.md"], "t": ["y.md"]})
    assert sorted(docs["doc_id"].to_pylist()) == ["s:a.md"], "b.md, the folder g and t's x.md were not named"
    assert held_deletions(empty, known, {}, {"s": 0.5}, {"s": ["a.md"]}) == {}, "one named file gone is no empty listing"
    held = held_deletions(empty, known, {}, {"s": 0.5}, {"s": ["g", "a.md"]})
    assert "it would delete 3 of its 4 documents" in held["s"], "a folder taking most of the source is held"


def test_an_ingest_run_over_a_source_the_config_lacks_names_the_source(corpus, write_config):
    from flows.ingest import only_sources

    cfg = load_config(write_config(corpus))
    with pytest.raises(ConfigError, match="no source named nope"):
        only_sources(cfg, ["nope"], "inlet.yaml")
    assert only_sources(cfg, ["sample"], "inlet.yaml").sources == cfg.sources


# --- the watcher in this process, against the session's Prefect server ----------------------------------------


class Running:
    """A watch_loop in a thread; batches collected as they end."""

    def __init__(self, config: Path, **options: object) -> None:
        self.stop = threading.Event()
        self.batches: list[Batch] = []
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.info: dict = {}

        def started(info: dict) -> None:
            self.info = info
            self.ready.set()

        def run() -> None:
            try:
                watch_loop(config, stop=self.stop, on_batch=self.batches.append, on_ready=started, **options)
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                self.error = exc
                self.ready.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self.ready.wait(120) and self.error is None, self.error

    def ingested(self) -> list[dict]:
        return [b.line() for b in self.batches if b.kind == "ingest" and b.error is None]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()


@pytest.fixture
def watching() -> Iterator[Callable[..., Running]]:
    """Start watch loops in threads; each is stopped when the test ends."""
    started: list[Running] = []

    def start(config: Path, **options: object) -> Running:
        started.append(Running(config, **options))
        return started[-1]

    yield start
    for running in started:
        running.close()


def test_a_new_file_an_edit_and_a_delete_are_each_searchable_after_their_own_micro_batch(
        prefect_harness, markdown_corpus, write_config, watching):
    corpus = markdown_corpus  # formats play no part: a PDF would start extraction workers in the watcher's worker
    config = write_config(corpus, watch={"settle_ms": 50}, quality=NOT_THE_POINT)
    w = watching(config)
    _wait(lambda: len(w.ingested()) >= 1, why="the start's reconciliation")
    assert w.ingested()[0]["why"] == ["reconcile"] and w.ingested()[0]["docs_new"] == 1

    page = corpus / "ferry.md"
    page.write_text(f"# Ferry\n\nThe {WORD} leaves the north pontoon at nine.\n", encoding="utf-8")
    _wait(lambda: _found(config, WORD), why="the new file")
    edited = WORD + "late"
    page.write_text(f"# Ferry\n\nThe {edited} leaves the north pontoon at ten.\n", encoding="utf-8")
    _wait(lambda: _found(config, edited), why="the edit")
    assert not _found(config, WORD + " "), "the old text went with the edit"
    page.unlink()
    _wait(lambda: not _found(config, edited), why="the delete")
    # Readers see a version as soon as it is published, a moment before its run returns.
    _wait(lambda: sum(r.get("docs_deleted", 0) for r in w.ingested()) == 1, why="the delete's run to end")

    runs = w.ingested()[1:]
    assert {tuple(r["why"]) for r in runs} == {("events",)}, "no reconciliation was needed"
    assert sum(r.get("docs_new", 0) for r in runs) == 1 and sum(r.get("docs_deleted", 0) for r in runs) == 1
    assert all(r["since_notice"] is not None for r in runs)
    assert all(r["docs_unchanged"] == 0 for r in runs), "an event's run lists the paths it named, not the folder"
    assert len({r["run_id"] for r in runs}) == len(runs), "each micro-batch is a run of its own"


def test_with_events_off_the_reconciliation_crawl_alone_converges(prefect_harness, markdown_corpus, write_config,
                                                                  watching):
    """Lost events (a network file system, a full event queue): the periodic stat/hash crawl still finds it all.

    Markdown alone: the formats play no part, and a PDF, DOCX or HTML file would start extraction workers in the
    watcher's worker (~10 s of CPU taken from the tests beside it).
    """
    corpus = markdown_corpus
    gone = corpus / "guides" / "tides.md"
    gone.write_text("# Tides\n\nHigh water at the north pontoon comes an hour after the harbour's.\n", encoding="utf-8")
    config = write_config(corpus, watch={"reconcile_s": 1, "events": True}, quality=NOT_THE_POINT)
    w = watching(config, events=False)
    _wait(lambda: len(w.ingested()) >= 1, why="the start's reconciliation")
    assert w.ingested()[0]["docs_new"] == 2
    (corpus / "ferry.md").write_text(f"# Ferry\n\nThe {WORD} timetable.\n", encoding="utf-8")
    gone.unlink()
    _wait(lambda: _found(config, WORD), why="reconciliation to find the new file")
    _wait(lambda: sum(r.get("docs_deleted", 0) for r in w.ingested()) == 1, why="reconciliation to find the delete")
    assert {tuple(r["why"]) for r in w.ingested()} == {("reconcile",)}


def test_the_worker_starts_with_the_lean_memory_switches_unless_the_environment_sets_them(
        prefect_harness, markdown_corpus, write_config, watching, monkeypatch):
    corpus = markdown_corpus  # the worker's environment is the point, not what it reads
    assert load_config(write_config(corpus)).watch.worker_env == LEAN_MEMORY_ENV, "on by default"
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setenv("INLET_TEST_SWITCH", "the user's")
    config = write_config(corpus, watch={"worker_env": {"MALLOC_ARENA_MAX": "2", "INLET_TEST_SWITCH": "config's"}},
                          quality=NOT_THE_POINT)
    w = watching(config, events=False)
    env = psutil.Process(w.info["worker_pid"]).environ()
    assert env["MALLOC_ARENA_MAX"] == "2" and env["INLET_TEST_SWITCH"] == "the user's"


def test_a_second_watcher_on_the_same_store_is_refused_at_once(prefect_harness, markdown_corpus, write_config,
                                                               watching):
    config = write_config(markdown_corpus, quality=NOT_THE_POINT)
    watching(config)
    with pytest.raises(StoreBusyError, match="already watched"):
        watch_loop(config, stop=threading.Event())


def test_live_maintenance_keeps_versions_tags_and_run_folders_bounded_and_readers_on_the_published_version(
        prefect_harness, corpus, write_config):
    from flows.ingest import ingest
    from flows.maintenance import live_maintenance
    from store.tables import connect

    config = write_config(corpus, watch={"keep_versions_s": 0, "keep_run_folders": 2})
    ingest(config_path=str(config))
    page = corpus / "ferry.md"
    for i in range(4):
        page.write_text(f"# Ferry\n\nThe {WORD}{i} timetable.\n", encoding="utf-8")
        ingest(config_path=str(config))
    cfg = load_config(config)
    chunks = connect(cfg.store.uri).open_table(cfg.store.chunks_table)
    before = len(chunks.list_versions())
    run_tags = [t for t in chunks.tags.list() if t.startswith("run-")]
    assert len(run_tags) == 5

    report = live_maintenance(config_path=str(config))
    chunks = connect(cfg.store.uri).open_table(cfg.store.chunks_table)
    after = report["tables"][cfg.store.chunks_table]["after"]
    assert after["versions"] < before and after["fragments"] <= 2, report["tables"][cfg.store.chunks_table]
    assert all(c["unindexed"] == 0 for c in report["indexes"][cfg.store.chunks_table].values()), \
        "every new row folded into the indexes: searches do not scan unindexed rows"
    kept = [t for t in chunks.tags.list() if t.startswith("run-")]
    assert len(kept) == 1, "five runs within one hour: the hour's last tag stays"
    assert report["run_folders_pruned"] == 3
    assert len([p for p in Path(cfg.store.artifacts).iterdir() if p.name.startswith("run-")]) == 2
    assert _found(config, f"{WORD}3") and not _found(config, f"{WORD}2")
    assert search(f"{WORD}3", k=1, mode="fulltext", config=config, as_of=kept[0]), "as_of the kept tag"


# --- `inlet watch` as a user runs it, against a real Prefect server --------------------------------------------


class Watch:
    """`inlet watch --json` in a process of its own; its JSON lines read as they come."""

    def __init__(self, env: dict[str, str], config: Path, **extra_env: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "inlet.cli", "watch", "--json", "--config", str(config)],
                                     env={**env, **extra_env}, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[dict] = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))

    def next(self, kind: str = "ingest", timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                stderr = self.proc.stderr.read()[-3000:] if self.proc.poll() is not None and self.proc.stderr else ""
                raise AssertionError(f"no {kind} line in {timeout} s (exit {self.proc.poll()}): {stderr}") from None
            self.seen.append(line)
            if line["kind"] == kind:
                return line

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A real Prefect server of each test's own: a watcher starting reads every watch- run its server holds."""
    with prefect_server(tmp_path) as env:
        yield env


async def _watch_runs(url: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url}):
        async with get_client() as client:
            return await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="watch-")))


def test_each_micro_batch_is_a_flow_run_with_every_stage_a_task_run_on_a_real_server(server,
                                                                                        markdown_corpus, write_config):
    corpus = markdown_corpus  # every stage runs for Markdown too; a PDF would start extraction workers in the worker
    config = write_config(corpus, watch={"settle_ms": 50})
    watcher = Watch(server, config)
    try:
        assert watcher.next("ready")["events"] is True
        assert watcher.next()["docs_new"] == 1
        guide = corpus / "guides" / "boat-maintenance.md"
        guide.write_text(guide.read_text() + f"\nThe {WORD} calls at the fuel dock.\n")
        edit = watcher.next()
        assert edit["why"] == ["events"] and edit["docs_changed"] == 1 and edit["error"] is None
    finally:
        assert watcher.stop() == 0, "SIGTERM ends the watcher cleanly"
    url = server["PREFECT_API_URL"]
    runs = sorted(asyncio.run(_watch_runs(url)), key=lambda r: r.start_time)
    assert len(runs) == 2 and all(r.state.is_completed() for r in runs)
    edit_run = runs[-1]
    expected = {"crawl": 1, "detect": 1, **dict.fromkeys(BATCH_STAGES, 1), "upsert": 1, "publish": 1, "report": 1}
    _, tasks, artifacts, _ = _read_settled(url, edit_run.id, 1 + sum(expected.values()))
    assert _stage_counts(tasks) == expected
    assert any(a.key == "ingest-run-summary" for a in artifacts)
    # Dependent systems are told: each publish is an event automations can trigger on.
    published = _published_events(url)
    assert len(published) == 2, published
    latest = max(published, key=lambda e: e["occurred"])
    assert latest["resource"]["prefect.resource.id"].startswith("inlet.store.")
    assert latest["payload"]["run_id"] == edit["run_id"] and latest["payload"]["version"] == edit["version"]
    assert latest["payload"]["documents_changed"] == 1
    assert latest["payload"]["changed"] == ["sample:guides/boat-maintenance.md"]


def _published_events(url: str) -> list[dict]:
    """inlet.store.published events the server has recorded (they arrive asynchronously)."""
    import httpx

    deadline = time.monotonic() + 30
    while True:
        answer = httpx.post(f"{url}/events/filter", json={"filter": {"event": {"name": ["inlet.store.published"]}},
                                                          "limit": 50}, timeout=10)
        events = answer.json()["events"]
        if len(events) >= 2 or time.monotonic() > deadline:
            return events
        time.sleep(0.5)


def test_a_worker_killed_mid_commit_is_replaced_and_a_killed_watcher_restarted_loses_nothing_and_repays_nothing(
        server, markdown_corpus, write_config):
    import psutil

    from store.tables import connect

    # Orchestration is the point, not the formats: a Markdown corpus is read in the worker's own process, so none of
    # its three workers (the killed one, its replacement, the second watcher's) starts extraction workers.
    corpus = markdown_corpus
    config = write_config(corpus, watch={"settle_ms": 50}, quality=NOT_THE_POINT)
    first = Watch(server, config, INLET_FAILPOINT="chunks-committed@2")  # the worker's second commit kills it
    first.next("ready")
    first.next()
    (corpus / "ferry.md").write_text(f"# Ferry\n\nThe {WORD} leaves at nine.\n", encoding="utf-8")
    died = first.next()
    assert "WorkerDiedError" in died["error"], "killed inside its commit"
    retry = first.next()
    assert retry["why"] == ["retry"] and retry["error"] is None, "a new worker redid the dead one's sources"
    assert retry["texts_embedded"] == 0, "the vector paid for before the kill came from the model cache"
    workers = psutil.Process(first.proc.pid).children()
    assert workers, "the watcher runs its flows in a worker process"
    first.proc.kill()
    assert first.proc.wait(30) == -signal.SIGKILL
    # The worker runs at nice +10 (watch.worker_nice): on a machine busy with other tests it may wait seconds for
    # the CPU it needs to notice and exit (a make test run once left it running after 10 s).
    gone, alive = psutil.wait_procs(workers, timeout=60)
    # A zombie has exited (no locks, no open files): where no init reaps orphans, as in some containers, it stays.
    alive = [p for p in alive if _still_running(p)]
    assert alive == [], "a killed watcher's worker exits with it: no second writer outlives it"

    second = Watch(server, config)
    try:
        ready = second.next("ready")
        assert ready["crashed"] == [], "the dead worker's run was marked Crashed when it died"
        redo = second.next()
        assert redo["why"] == ["reconcile"] and redo["error"] is None and redo["docs_changed"] == 0
    finally:
        second.stop()
    assert _found(config, WORD)
    cfg = load_config(config)
    ids = connect(cfg.store.uri).open_table(cfg.store.chunks_table).to_arrow()["chunk_id"].to_pylist()
    assert len(ids) == len(set(ids)), "no chunk twice"
    runs = asyncio.run(_watch_runs(server["PREFECT_API_URL"]))
    states = sorted(r.state.type.value for r in runs if not r.name.startswith("watch-maintenance"))
    assert states == ["COMPLETED", "COMPLETED", "COMPLETED", "CRASHED"]


def _still_running(proc: psutil.Process) -> bool:
    """Whether proc still runs: not gone and not a zombie waiting to be reaped."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
