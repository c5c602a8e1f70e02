"""Crash proof: a run killed with SIGKILL at any stage boundary or inside a commit, then run again, ends with the
tables an uninterrupted run makes, and no model call is repeated for work that was committed before the kill."""

from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lancedb
import pytest
import yaml

from flows.ingest import ingest
from query import search
from runtime.failpoints import POINTS
from schemas.arrow import PUBLISHED_TAG
from schemas.config import load_config
from tests.conftest import run_artifact
from tests.zygote import Zygote

pytestmark = pytest.mark.usefixtures("prefect_harness")

TOPICS = ["rigging", "sails", "hull", "engine", "safety", "navigation", "mooring", "winter storage"]


def _page(topic: str, n: int) -> str:
    """A Markdown page of a few sections about one topic, different in every word that matters."""
    sections = [f"## {topic.title()} part {i}\n\n" + " ".join(
        f"The {topic} checklist item {i}-{j} says to inspect, clean and log the {topic} fittings {n}." for j in range(6))
        for i in range(3)]
    return f"# {topic.title()} guide {n}\n\n" + "\n\n".join(sections) + "\n"


@pytest.fixture
def pages(tmp_path: Path) -> Path:
    """Eight Markdown pages: four batches of two documents, every batch its own commit group."""
    folder = tmp_path / "pages"
    folder.mkdir()
    for n, topic in enumerate(TOPICS):
        (folder / f"{topic.replace(' ', '-')}.md").write_text(_page(topic, n), encoding="utf-8")
    return folder


def _config(write_config, folder: Path, store: str):
    # One document a batch and one batch a commit group: every commit point is passed more than once.
    return write_config(folder, name=f"{store}.yaml", store=store, sources=[
        {"name": "pages", "path": str(folder), "include": ["**/*.md"]}],
        execution={"batch_docs": 1, "commit_rows": 1, "workers": 2})


def _edit(folder: Path) -> None:
    """One page changed, one added, one deleted: work for every kind of commit."""
    (folder / "rigging.md").write_text(_page("rigging", 0).replace("inspect, clean", "inspect, grease"),
                                       encoding="utf-8")
    (folder / "anchoring.md").write_text(_page("anchoring", 9), encoding="utf-8")
    (folder / "engine.md").unlink()


def _tables(config: Path) -> tuple[list[tuple], list[tuple], list[str], list[tuple]]:
    """What a run's result is: chunk rows (ids, texts, enrichment, vectors, positions), document rows, quarantine,
    and the kept extractions (which document, which bytes, which elements)."""
    cfg = load_config(config)
    db = lancedb.connect(str(cfg.store.uri))
    chunks = db.open_table("chunks").to_arrow()
    docs = db.open_table("documents").to_arrow()
    chunk_rows = sorted(zip(*(chunks[c].to_pylist() for c in (
        "chunk_id", "doc_id", "chunk_index", "total_chunks", "prev_chunk_id", "next_chunk_id", "text",
        "enrichment", "embed_key", "vector"))))
    doc_rows = sorted(zip(*(docs[c].to_pylist() for c in (
        "doc_id", "content_hash", "status", "total_chunks", "title", "settings_fp"))))
    names = db.list_tables()
    quarantined = (sorted(db.open_table("quarantine").to_arrow()["doc_id"].to_pylist())
                   if "quarantine" in getattr(names, "tables", names) else [])
    kept = db.open_table("extractions").to_arrow()
    kept_rows = sorted(zip(*(kept[c].to_pylist() for c in ("doc_id", "content_hash", "extraction_fp", "elements"))))
    return chunk_rows, doc_rows, quarantined, kept_rows


def _committed_keys(config: Path) -> tuple[set[str], set[str]]:
    cfg = load_config(config)
    table = lancedb.connect(str(cfg.store.uri)).open_table("chunks").to_arrow()
    return set(table["embed_key"].to_pylist()), set(table["enrich_key"].to_pylist())


def _killed_runs(configs: dict[str, Path]) -> dict[str, tuple[int, str]]:
    """Run the flow once per point, in a forked process that kills itself with SIGKILL there; codes and logs.

    Two zygotes side by side, each importing the flow once and forking a fresh process per point.
    """
    from prefect.settings import PREFECT_API_URL

    # The session's Prefect server: a killed run would leave an ephemeral server of its own behind.
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}

    def run_all(points: list[str]) -> dict[str, tuple[int, str]]:
        done = {}
        with Zygote(env) as zygote:
            for point in points:
                log = configs[point].with_suffix(".log")  # a file, not a pipe: nothing a dead process leaves holds us up
                done[point] = zygote.run(configs[point], {"INLET_FAILPOINT": point}, log), log.read_text()
        return done

    points = list(configs)
    with ThreadPoolExecutor(2) as pool:
        halves = list(pool.map(run_all, [points[0::2], points[1::2]]))
    return {**halves[0], **halves[1]}


MATRIX = [*POINTS, "batch-embedded@2", "group-committed@2", "chunks-committed@3"]


def test_a_run_killed_at_every_stage_boundary_and_inside_the_upsert_converges_without_repeated_model_calls(
        pages, write_config, tmp_path):
    reference = _config(write_config, pages, "reference")
    ingest(config_path=str(reference))
    before = tmp_path / "before"
    shutil.copytree(tmp_path / "reference", before)  # the store before the edits, for every crash below
    _edit(pages)
    ingest(config_path=str(reference))
    expected = _tables(reference)
    assert len({row[0] for row in expected[0]}) == len(expected[0]), "no duplicate chunk id"

    configs = {}
    for n, point in enumerate(MATRIX):
        store = f"crash{n}"
        shutil.copytree(before, tmp_path / store)
        configs[point] = _config(write_config, pages, store)
    killed = _killed_runs(configs)  # each store is its own

    for point in MATRIX:
        config = configs[point]
        code, log = killed[point]
        assert code == -9, f"{point}: the run was not killed there (exit {code}):\n{log[-3000:]}"
        embed_keys, enrich_keys = _committed_keys(config)
        summary = ingest(config_path=str(config))
        assert _tables(config) == expected, f"killed at {point}: the tables differ from an uninterrupted run's"
        run_dir = Path(load_config(config).store.artifacts) / summary["run_id"]
        done = run_artifact(run_dir, "embedded_chunks")
        if done.num_rows:
            again = {k for k, now in zip(done["embed_key"].to_pylist(), done["embedded_now"].to_pylist()) if now}
            assert not again & embed_keys, f"killed at {point}: committed vectors were embedded again"
            again = {k for k, now in zip(done["enrich_key"].to_pylist(), done["enriched_now"].to_pylist()) if now}
            assert not again & enrich_keys, f"killed at {point}: committed enrichments were made again"
        table = lancedb.connect(str(load_config(config).store.uri)).open_table("chunks")
        assert table.tags.get_version(PUBLISHED_TAG) == table.version, "the re-run published its last version"


def test_a_run_killed_between_its_last_commits_leaves_the_quarantine_list_of_an_uninterrupted_run(
        pages, write_config, tmp_path):
    # A page that failed is fixed and another fails: the list loses one and gains the other. Each is its own
    # commit group (draft first); the kills fall after the first or the second group's quarantine or documents
    # commit. With the quarantine list committed after the documents rows, a kill in between left the fixed
    # page listed, or the failed one unlisted, for good: their documents rows already held their new hashes.
    (pages / "draft.md").write_text("", encoding="utf-8")
    reference = _config(write_config, pages, "reference")
    ingest(config_path=str(reference))
    assert _tables(reference)[2] == ["pages:draft.md"]
    before = tmp_path / "before"
    shutil.copytree(tmp_path / "reference", before)
    (pages / "draft.md").write_text(_page("draft", 10), encoding="utf-8")
    (pages / "sails.md").write_text("", encoding="utf-8")
    ingest(config_path=str(reference))
    expected = _tables(reference)
    assert expected[2] == ["pages:sails.md"]

    configs = {}
    for n, point in enumerate(("quarantine-committed", "quarantine-committed@2", "documents-committed",
                               "documents-committed@2")):
        shutil.copytree(before, tmp_path / f"q{n}")
        configs[point] = _config(write_config, pages, f"q{n}")
    killed = _killed_runs(configs)
    for point, config in configs.items():
        code, log = killed[point]
        assert code == -9, f"{point}: the run was not killed there (exit {code}):\n{log[-3000:]}"
        ingest(config_path=str(config))
        assert _tables(config) == expected, f"killed at {point}: the tables differ from an uninterrupted run's"


def test_searches_during_a_run_see_the_previous_run_or_the_new_one_never_part_of_it(pages, write_config,
                                                                                     monkeypatch):
    config = _config(write_config, pages, "store")
    ingest(config_path=str(config))
    for topic in ("sails", "hull", "safety"):  # three documents, three batches, three commit groups
        page = pages / f"{topic}.md"
        page.write_text(page.read_text(encoding="utf-8") + "\nThe zanzibar knot holds.\n", encoding="utf-8")

    import tasks.load

    groups = []

    def slow_group(name: str) -> None:  # widen the window between commit groups so searches land inside it
        if name == "group-committed":
            groups.append(time.monotonic())
            time.sleep(0.4)

    monkeypatch.setattr(tasks.load, "failpoint", slow_group)
    outcome: dict[str, object] = {}
    runner = threading.Thread(target=lambda: outcome.update(summary=ingest(config_path=str(config))))
    seen: list[tuple[float, int]] = []
    runner.start()
    while runner.is_alive():
        hits = search("zanzibar knot", k=10, mode="fulltext", config=config)
        seen.append((time.monotonic(), len({h.doc_id for h in hits})))
    runner.join()
    assert outcome["summary"]["docs_changed"] == 3 and len(groups) >= 3
    during = [n for at, n in seen if groups[0] <= at <= groups[-1]]
    assert during, "some searches ran between the run's first and last commit"
    assert {n for _, n in seen} <= {0, 3}, f"a search saw part of a run: {sorted({n for _, n in seen})}"
    assert len({h.doc_id for h in search("zanzibar knot", k=10, mode="fulltext", config=config)}) == 3


def test_a_file_put_back_after_a_run_was_killed_mid_commit_gets_its_old_chunks_back(pages, write_config):
    # Killed between its chunk and documents commits, a run leaves the edit's chunks under the old documents
    # row. With the file back to its old bytes the hash matches that row again: only the run's marker
    # (store/inflight.py) says the document must be done again.
    from prefect.settings import PREFECT_API_URL

    from store import inflight

    config = _config(write_config, pages, "store")
    ingest(config_path=str(config))
    expected = _tables(config)
    original = (pages / "rigging.md").read_bytes()
    (pages / "rigging.md").write_text(_page("rigging", 0).replace("inspect, clean", "inspect, grease"),
                                      encoding="utf-8")
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    log = config.with_suffix(".log")
    with Zygote(env) as zygote:
        code = zygote.run(config, {"INLET_FAILPOINT": "chunks-committed"}, log)
    assert code == -9, f"the run was not killed there (exit {code}):\n{log.read_text()[-3000:]}"
    cfg = load_config(config)
    markers = inflight.left(inflight.folder(cfg.store.artifacts, cfg.store.uri, cfg.store.chunks_table))
    assert len(markers) == 1 and [len(ids) for ids in markers.values()] == [1], markers
    assert next(iter(markers.values()))[0].endswith("rigging.md"), markers
    (pages / "rigging.md").write_bytes(original)
    summary = ingest(config_path=str(config))
    assert summary["docs_changed"] == 1, "the put-back file is done again"
    assert _tables(config) == expected, "the edit's chunks stayed"
    assert inflight.left(inflight.folder(cfg.store.artifacts, cfg.store.uri, cfg.store.chunks_table)) == {}, "marker settled"


def test_a_marker_counts_for_its_own_store_only(pages, write_config, tmp_path):
    # Two stores share one artifact root. A marker one of them left names rigging.md: the other store's run does
    # not take it (nor settle it); its own store's run does the page again and settles it.
    from store import inflight

    staging = _config(write_config, pages, "staging")
    data = yaml.safe_load(staging.read_text(encoding="utf-8"))
    data["store"]["uri"] = str(tmp_path / "production" / "lancedb")  # the artifact root stays staging's
    production = tmp_path / "production.yaml"
    production.write_text(yaml.safe_dump(data), encoding="utf-8")
    for config in (staging, production):
        ingest(config_path=str(config))
    mine = load_config(staging)
    marker = inflight.mark(inflight.folder(mine.store.artifacts, mine.store.uri, mine.store.chunks_table), "run-x",
                           ["pages:rigging.md"])
    assert ingest(config_path=str(production))["docs_changed"] == 0, "another store's marker is not this store's"
    assert Path(marker).exists(), "nor does that store settle it"
    assert ingest(config_path=str(staging))["docs_changed"] == 1
    assert not Path(marker).exists(), "settled by its own store's run"


# --- paid model work: the model cache keeps what a killed run was answered ------------------------------------

KEY = "AIza-crash-key-must-never-leak-3"
FAST_POLLING = {"poll_initial_s": 0.05, "poll_max_s": 0.2}


def _gemini_config(write_config, folder: Path, store: str, server, batch_mode: bool = False) -> Path:
    # One batch, committed only at the end: a kill anywhere in it loses the run's commit, never its paid answers.
    # Four texts a call, so that enrichment and embedding each take several calls.
    batch = {"batch": {"mode": "always", **FAST_POLLING}} if batch_mode else {}
    return write_config(folder, name=f"{store}.yaml", store=store, sources=[
        {"name": "pages", "path": str(folder), "include": ["**/*.md"]}],
        enrichment={"provider": "gemini", "kind": "questions", "base_url": server.base_url, "batch_size": 4,
                    **batch},
        embedding={"kind": "gemini", "dim": 32, "base_url": server.base_url, "batch_size": 4, **batch},
        execution={"batch_docs": 100, "commit_rows": 100_000, "workers": 1})


def _paid(server) -> dict[str, int]:
    """What the Gemini test server was asked so far: texts enriched and embedded, online and by batch job."""
    calls = server.traffic.calls
    return {"generate": calls.get("generateContent", 0), "embed": sum(server.traffic.embed_batch_sizes),
            "jobs": calls.get("batchGenerateContent", 0) + calls.get("asyncBatchEmbedContent", 0)}


def _cached(config: Path) -> dict[str, int]:
    """Distinct texts the store's model cache holds answers for, by kind."""
    store = load_config(config).store
    db = lancedb.connect(str(store.uri))
    names = db.list_tables()
    if store.cache_table not in getattr(names, "tables", names):
        return {"enrich": 0, "embed": 0}
    rows = db.open_table(store.cache_table).to_arrow()
    return {kind: len({k for k, kd in zip(rows["key"].to_pylist(), rows["kind"].to_pylist()) if kd == kind})
            for kind in ("enrich", "embed")}


GEMINI_KILLS = {  # failpoint -> what the cache holds after the kill: (enrich, embed) texts, "all" for every one
    "enrich-cached@2": (8, 0),  # two calls of four answered, the rest of enrichment not asked
    "embed-cached@2": ("all", 8),  # enrichment done, two embedding calls of four answered
    "batch-validated": ("all", "all"),  # every model call made, nothing committed
}


def test_a_run_killed_inside_enrichment_embedding_or_before_its_commit_pays_again_only_for_unanswered_texts(
        pages, write_config, tmp_path, monkeypatch):
    from prefect.settings import PREFECT_API_URL

    from tests.gemini_server import GeminiServer

    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    server = GeminiServer().start()
    try:
        reference = _gemini_config(write_config, pages, "gemini-reference", server)
        ingest(config_path=str(reference))
        expected, total = _tables(reference), _paid(server)
        keys = _committed_keys(reference)
        assert (total["embed"], total["generate"]) == (len(keys[0]), len(keys[1])), "each text paid once"
        full = {"enrich": total["generate"], "embed": total["embed"]}
        env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
        cases = [(point, False) for point in GEMINI_KILLS] + [("batch-validated", True)]
        with Zygote(env) as zygote:
            for n, (point, batch_mode) in enumerate(cases):
                config = _gemini_config(write_config, pages, f"gemini-kill{n}", server, batch_mode)
                before = _paid(server)
                code = zygote.run(config, {"INLET_FAILPOINT": point}, config.with_suffix(".log"))
                log = config.with_suffix(".log").read_text()
                assert code == -9, f"{point}: not killed there (exit {code}):\n{log[-3000:]}"
                killed, cached = _paid(server), _cached(config)
                want = dict(zip(("enrich", "embed"), GEMINI_KILLS[point]))
                assert cached == {k: full[k] if v == "all" else v for k, v in want.items()}, f"{point}: {cached}"
                if not batch_mode:  # nothing in flight at these points: every answered call is in the cache
                    assert (killed["generate"] - before["generate"], killed["embed"] - before["embed"]) == (
                        cached["enrich"], cached["embed"]), point
                summary = ingest(config_path=str(config))
                again = _paid(server)
                assert (again["generate"] - killed["generate"], again["embed"] - killed["embed"]) == (
                    full["enrich"] - cached["enrich"], full["embed"] - cached["embed"]), \
                    f"killed at {point}{' (Batch Mode)' * batch_mode}: the re-run paid for answered texts again"
                assert again["jobs"] == killed["jobs"], "no batch job is submitted again"
                assert (summary["texts_enrich_cached"], summary["texts_embed_cached"]) == (
                    cached["enrich"], cached["embed"])
                assert _tables(config) == expected, f"killed at {point}: the tables differ from an uninterrupted run's"
                print(f"{point}{' (Batch Mode)' * batch_mode}: killed run paid enrich/embed "  # the closing note's counts
                      f"{killed['generate'] - before['generate']}/{killed['embed'] - before['embed']}, cached "
                      f"{cached['enrich']}/{cached['embed']}; re-run paid {again['generate'] - killed['generate']}/"
                      f"{again['embed'] - killed['embed']} of {full['enrich']}/{full['embed']}; batch jobs submitted "
                      f"{killed['jobs'] - before['jobs']}, then {again['jobs'] - killed['jobs']}")
    finally:
        server.stop()
