"""The ingest flow end to end on a real Prefect server, real LanceDB and real unstructured."""

from __future__ import annotations

import shutil
from pathlib import Path

import lancedb
import pytest

import store.commit
from flows.ingest import ingest
from providers.embedders import HashingEmbedder
from query import search
from runtime.extraction import open_pools
from schemas.config import load_config
from tests.conftest import run_artifact

pytestmark = pytest.mark.usefixtures("prefect_harness")

GUIDE = "guides/boat-maintenance.md"
OLD_PARAGRAPH = "Small chips are filled with gelcoat paste mixed with 2% hardener."
NEW_PARAGRAPH = "Small chips are filled with epoxy filler mixed with 3% hardener, never with plain gelcoat."


def _tables(config: Path) -> tuple[list[dict], list[dict]]:
    """Return (documents, chunks) rows sorted by id, without timestamps and run ids."""
    db = lancedb.connect(str(load_config(config).store.uri))
    docs = db.open_table("documents").to_arrow().drop_columns(["updated_at", "first_run_id", "last_run_id"])
    chunks = db.open_table("chunks").to_arrow().drop_columns(["run_id"])
    return (sorted(docs.to_pylist(), key=lambda r: r["doc_id"]),
            sorted(chunks.to_pylist(), key=lambda r: r["chunk_id"]))


def _chunks_by_id(config: Path) -> dict[str, dict]:
    return {r["chunk_id"]: r for r in _tables(config)[1]}


@pytest.fixture
def embedded_texts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every text the hashing embedder is asked to embed (the real embedder still runs)."""
    seen: list[str] = []
    original = HashingEmbedder.embed

    def spy(self: HashingEmbedder, texts: list[str], titles: list[str | None] | None = None):
        seen.extend(texts)
        return original(self, texts, titles)

    monkeypatch.setattr(HashingEmbedder, "embed", spy)
    return seen


def test_rerun_of_unchanged_corpus_does_no_model_work_and_writes_no_chunk(corpus, write_config, embedded_texts):
    config = write_config(corpus)
    first = ingest(config_path=str(config))
    assert first["docs_new"] == 5 and first["docs_quarantined"] == 0
    assert first["texts_embedded"] == first["chunks_added"] > 0
    assert len(embedded_texts) == first["texts_embedded"]
    before = _tables(config)

    embedded_texts.clear()
    second = ingest(config_path=str(config))
    assert second["docs_unchanged"] == 5
    assert (second["texts_embedded"], second["texts_enriched"], second["chunks_written"]) == (0, 0, 0)
    assert embedded_texts == []
    assert _tables(config) == before


def _artifact_keys(state) -> set[str]:
    """The keys of the artifacts a flow run (by its final state) posted."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    return {a.key for a in found}


def test_a_run_with_nothing_to_report_posts_its_summary_but_no_quarantine_report(corpus, write_config):
    config = write_config(corpus)
    ingest(config_path=str(config))
    guide = corpus / GUIDE
    guide.write_text(guide.read_text().replace(OLD_PARAGRAPH, NEW_PARAGRAPH))
    edited = ingest(config_path=str(config), return_state=True)  # checked, every check passed, no notice
    assert edited.result()["docs_changed"] == 1 and not edited.result()["notices"]
    assert len(edited.result()["validation"]) == 13 and not any(v["failed"] for v in edited.result()["validation"])
    keys = _artifact_keys(edited)
    assert "ingest-run-summary" in keys and "ingest-run-quarantine" not in keys
    again = ingest(config_path=str(config), return_state=True)  # a no-op: nothing checked
    assert again.result()["docs_unchanged"] == 5
    keys = _artifact_keys(again)
    assert "ingest-run-summary" in keys and "ingest-run-quarantine" not in keys
    (corpus / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    bad = ingest(config_path=str(config), return_state=True)
    assert bad.result()["docs_quarantined"] == 1
    assert {"ingest-run-summary", "ingest-run-quarantine"} <= _artifact_keys(bad)


def test_touched_file_with_same_bytes_is_unchanged(corpus, write_config):
    config = write_config(corpus)
    ingest(config_path=str(config))
    guide = corpus / GUIDE
    guide.write_bytes(guide.read_bytes())  # new mtime, same content
    summary = ingest(config_path=str(config))
    assert summary["docs_unchanged"] == 5 and summary["texts_embedded"] == 0


def test_edited_paragraph_reembeds_only_the_new_chunk_texts(corpus, write_config, embedded_texts):
    config = write_config(corpus)
    ingest(config_path=str(config))
    before = _chunks_by_id(config)

    guide = corpus / GUIDE
    guide.write_text(guide.read_text().replace(OLD_PARAGRAPH, NEW_PARAGRAPH))
    embedded_texts.clear()
    summary = ingest(config_path=str(config))

    assert (summary["docs_changed"], summary["docs_unchanged"]) == (1, 4)
    run_dir = Path(load_config(config).store.artifacts) / summary["run_id"]
    assert run_artifact(run_dir, "extracted")["doc_id"].to_pylist() == [f"sample:{GUIDE}"]
    after = _chunks_by_id(config)
    new_ids = set(after) - set(before)
    assert new_ids and all(after[i]["doc_id"] == f"sample:{GUIDE}" for i in new_ids)
    assert any(NEW_PARAGRAPH in after[i]["text"] for i in new_ids)
    expected_inputs = sorted(f"{after[i]['text']}\n\n{after[i]['enrichment']}" for i in new_ids)
    assert sorted(embedded_texts) == expected_inputs
    assert summary["texts_embedded"] == len(new_ids) == summary["chunks_added"]
    for chunk_id in set(before) & set(after):
        assert after[chunk_id]["vector"] == before[chunk_id]["vector"]
    assert summary["chunks_removed"] == len(set(before) - set(after)) == 1


def test_deleted_document_loses_its_chunks_and_added_one_is_searchable(corpus, write_config):
    config = write_config(corpus)
    ingest(config_path=str(config))
    (corpus / "harbour-faq.txt").unlink()
    (corpus / "guides" / "knots.md").write_text(
        "# Knots\n\n## Bowline\n\nThe bowline makes a fixed loop at the end of a line that will not slip "
        "or jam, and it is untied easily after carrying a load.\n")
    summary = ingest(config_path=str(config))
    assert (summary["docs_deleted"], summary["docs_new"]) == (1, 1)
    docs, chunks = _tables(config)
    assert "sample:harbour-faq.txt" not in {d["doc_id"] for d in docs}
    assert not [c for c in chunks if c["doc_id"] == "sample:harbour-faq.txt"]
    hits = search("bowline fixed loop that will not slip", k=1, config=config)
    assert hits[0].doc_id == "sample:guides/knots.md"
    assert hits[0].citation.heading_path == ("Knots", "Bowline")


def test_crash_between_chunk_and_document_commit_converges(corpus, write_config, tmp_path, monkeypatch):
    config = write_config(corpus)
    ingest(config_path=str(config))
    guide = corpus / GUIDE
    guide.write_text(guide.read_text().replace(OLD_PARAGRAPH, NEW_PARAGRAPH))
    (corpus / "guides" / "knots.md").write_text("# Knots\n\nThe reef knot joins two ends of one line.\n")

    def crash(*_args, **_kwargs):
        raise RuntimeError("injected crash after the chunk commit")

    with monkeypatch.context() as patch:
        patch.setattr(store.commit, "commit_documents", crash)
        with pytest.raises(RuntimeError, match="injected crash"):
            ingest(config_path=str(config))
    recovered = ingest(config_path=str(config))
    assert recovered["texts_embedded"] == 0, "vectors committed before the crash must be reused"

    reference = write_config(corpus, name="reference.yaml", store="reference")
    ingest(config_path=str(reference))
    got_docs, got_chunks = _tables(config)
    ref_docs, ref_chunks = _tables(reference)
    assert got_chunks == ref_chunks
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("mtime_ns",)} for r in rows]
    assert strip(got_docs) == strip(ref_docs)
    assert len({c["chunk_id"] for c in got_chunks}) == len(got_chunks)


def test_new_document_crashed_between_its_commits_then_edited_leaves_no_chunk_of_its_first_text(
        corpus, write_config, monkeypatch):
    # Its chunks are stored but it has no documents row: the next commit must look for them to delete them.
    config = write_config(corpus)
    ingest(config_path=str(config))
    knots = corpus / "guides" / "knots.md"
    knots.write_text("# Knots\n\nThe reef knot joins two ends of one line.\n")
    with monkeypatch.context() as patch:
        patch.setattr(store.commit, "commit_documents", lambda *_a, **_k: (_ for _ in ()).throw(RuntimeError("crash")))
        with pytest.raises(RuntimeError, match="crash"):
            ingest(config_path=str(config))
    assert [c for c in _tables(config)[1] if c["doc_id"] == "sample:guides/knots.md"], "the crash left its chunks"
    knots.write_text("# Knots\n\nThe bowline makes a fixed loop that will not slip.\n")
    ingest(config_path=str(config))

    reference = write_config(corpus, name="reference.yaml", store="reference")
    ingest(config_path=str(reference))
    assert _tables(config)[1] == _tables(reference)[1]
    texts = [c["text"] for c in _tables(config)[1] if c["doc_id"] == "sample:guides/knots.md"]
    assert not any("reef knot" in t for t in texts)


def test_sample_question_finds_its_document_with_citation(corpus, write_config):
    config = write_config(corpus, embedding={"kind": "minilm", "dim": None})
    ingest(config_path=str(config))
    hits = search("How do I winterize the outboard engine?", k=3, config=config)
    top = hits[0]
    assert top.doc_id == f"sample:{GUIDE}"
    assert top.citation.title == "Boat maintenance guide"
    assert top.citation.heading_path == ("Boat maintenance guide", "Engine winterization")
    assert top.citation.uri == (corpus / GUIDE).as_uri()
    assert "fogging oil" in top.text and "Keywords:" not in top.text

    pdf_hit = search("How much surplus did the regatta make?", k=1, config=config)[0]
    assert pdf_hit.doc_id == "sample:reports/regatta-report-2025.pdf"
    assert (pdf_hit.citation.heading_path, pdf_hit.citation.pages) == (("Finances",), (2, 2))


BAD_FILES = {
    "pdf_encrypted/unstructured__password.pdf": "encrypted",
    "office_encrypted/tika__protected_normal_case.docx": "encrypted",
    "office_corrupt/tika__testWORD_truncated.docx": "corrupt",
    "empty_or_whitespace/unstructured__empty.txt": "empty",
    "pdf_no_text_layer/ocrmypdf__blank.pdf": "no_text",
}


def test_bad_files_are_quarantined_while_good_ones_are_indexed(corpus, write_config, shared_corpora):
    bad_dir = corpus / "incoming"
    bad_dir.mkdir()
    for rel in BAD_FILES:
        shutil.copy(shared_corpora / "bad" / rel, bad_dir / Path(rel).name)
    config = write_config(corpus)
    summary = ingest(config_path=str(config))

    reasons = {q["doc_id"].split("/")[-1]: q["reason"] for q in summary["quarantined"]}
    assert reasons == {Path(rel).name: reason for rel, reason in BAD_FILES.items()}
    assert all(q["message"] for q in summary["quarantined"])
    db = lancedb.connect(str(load_config(config).store.uri))
    assert db.open_table("quarantine").count_rows() == len(BAD_FILES)
    docs = {d["doc_id"]: d for d in db.open_table("documents").to_arrow().to_pylist()}
    assert sum(d["status"] == "ok" for d in docs.values()) == 5
    assert {d["doc_id"] for d in docs.values() if d["status"] == "ok"} == {
        r["doc_id"] for r in db.open_table("chunks").to_arrow().select(["doc_id"]).to_pylist()}

    # Unchanged broken files are not retried; a fixed one is picked up again.
    again = ingest(config_path=str(config))
    assert again["docs_quarantined"] == 0 and again["docs_unchanged"] == 5 + len(BAD_FILES)
    (bad_dir / "unstructured__empty.txt").write_text("The empty file now explains the harbour tide table.\n")
    fixed = ingest(config_path=str(config))
    assert fixed["docs_changed"] == 1 and fixed["docs_quarantined"] == 0
    assert db.open_table("quarantine").count_rows() == len(BAD_FILES) - 1
    assert search("harbour tide table", k=1, config=config)[0].doc_id == "sample:incoming/unstructured__empty.txt"


def test_a_later_run_in_the_same_process_reuses_the_extraction_workers(corpus, write_config):
    # Starting them costs seconds of imports each; a notebook or a test session ingesting again should not pay it.
    ingest(config_path=str(write_config(corpus)))
    started = open_pools()
    assert len(started) == 1 and all(pool.is_running() for pool in started.values()), "workers kept after the run"
    second = ingest(config_path=str(write_config(corpus, name="other.yaml", store="other")))
    assert second["docs_new"] == 5 and second["docs_quarantined"] == 0
    assert open_pools() == started, "the second run used the same workers"


def test_a_text_met_again_in_a_later_batch_before_any_commit_is_embedded_once(tmp_path, write_config, embedded_texts):
    # Three copies of one page, one batch each, committed together at the end: the later batches take the
    # vectors the first one embedded from its artifact instead of asking the model again.
    folder = tmp_path / "copies"
    folder.mkdir()
    page = (Path(__file__).resolve().parent.parent / "data" / "sample" / GUIDE).read_text()
    for name in ("a.md", "b.md", "c.md"):
        (folder / name).write_text(page)
    config = write_config(folder, execution={"batch_docs": 1, "workers": 1, "commit_rows": 1_000_000})
    summary = ingest(config_path=str(config))
    assert summary["docs_new"] == 3 and summary["docs_quarantined"] == 0
    chunks = _tables(config)[1]
    assert len(chunks) == 3 * len({c["text"] for c in chunks}) > 3
    assert len(embedded_texts) == len(set(embedded_texts)) == summary["texts_embedded"] == len(chunks) // 3


def test_a_one_group_run_commits_and_indexes_before_its_last_batch_and_still_finds_it(tmp_path, write_config):
    # Five pages, two a batch, one commit group: the writer commits the first two batches and builds the
    # full-text index while the third runs; the third's row is then found without the index.
    folder = tmp_path / "pages"
    folder.mkdir()
    words = ["quokka", "narwhal", "axolotl", "pangolin", "okapi"]
    for i, word in enumerate(words):
        (folder / f"{i}.md").write_text(f"# Page {i}\n\nThis page is about the {word} and nothing else.\n")
    config = write_config(folder, execution={"batch_docs": 2, "workers": 1, "commit_rows": 1_000_000})
    summary = ingest(config_path=str(config))
    assert summary["docs_new"] == 5 and summary["chunks_written"] == 5
    assert "index" in summary["stage_seconds"], "the index was built before the last batch was committed"
    assert summary["indexes"]["fulltext"] == {"indexed": 4, "unindexed": 1}
    table = lancedb.connect(str(load_config(config).store.uri)).open_table("chunks")
    assert len(table.list_versions()) <= 6, "a handful of versions, not one per batch"
    for i, word in enumerate(words):
        assert search(word, k=1, mode="fulltext", config=config)[0].doc_id == f"sample:{i}.md", word


@pytest.fixture
def task_names(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the name of every Prefect task run started, called or submitted to a task runner (the real one runs)."""
    import prefect.task_engine

    seen: list[str] = []
    original = prefect.task_engine.run_task_sync

    def spy(*args, **kwargs):
        seen.append((kwargs.get("task") or args[0]).name)
        return original(*args, **kwargs)

    monkeypatch.setattr(prefect.task_engine, "run_task_sync", spy)
    return seen


EVERY_STAGE = ["crawl", "detect", "batch", "extract", "chunk", "refresh enrichment", "enrich", "embed", "validate",
               "upsert", "publish", "report"]


def test_every_stage_is_a_task_run_in_every_run_even_with_nothing_to_do(corpus, write_config, task_names, caplog):
    """The Prefect UI shows the same DAG for a run of any size: a stage with nothing to do runs and says so."""
    config = write_config(corpus)
    first = ingest(config_path=str(config))
    assert task_names == EVERY_STAGE, "one batch: every stage once, in the order the DAG runs them"
    assert first["docs_new"] == 5

    task_names.clear()
    noop = ingest(config_path=str(config))
    assert task_names == ["crawl", "detect", "upsert", "publish", "report"], "no batch: no batch stages"
    assert noop["docs_unchanged"] == 5 and "nothing to commit" in caplog.text and "nothing new to publish" in caplog.text

    task_names.clear()
    off = write_config(corpus, name="off.yaml", store="off", enrichment={"enabled": False}, quality={"enabled": False})
    summary = ingest(config_path=str(off))
    assert task_names == EVERY_STAGE, "enrichment and validation off: their task runs still show, doing nothing"
    assert summary["docs_new"] == first["docs_new"] and summary["validation"] == []
    assert summary["chunks_written"] == first["chunks_written"] > 0
    chunks = _tables(off)[1]
    assert {c["enrichment"] for c in chunks} == {None}, "enrichment off: the column stays empty"
    # The log says so, rather than counting every chunk as a reused enrichment.
    assert f"enrichment is off: {len(chunks)} chunks go on without one" in caplog.text
    assert f"enriched 0 of {len(chunks)} chunks" not in caplog.text




def test_a_run_whose_model_cache_has_too_many_fragments_tidies_it_as_a_task_run(corpus, write_config, task_names,
                                                                               monkeypatch):
    import store.model_cache

    monkeypatch.setattr(store.model_cache, "MOST_FRAGMENTS", 2)  # our own threshold, small enough for five files
    config = write_config(corpus, execution={"batch_docs": 1})  # five batches: ten appends (enrich and embed)
    ingest(config_path=str(config))
    assert task_names.count("tidy model cache") == 1 and task_names.index("tidy model cache") > task_names.index(
        "publish"), "once, after publishing"
    store_cfg = load_config(config).store
    cache = lancedb.connect(store_cfg.uri).open_table(store_cfg.cache_table)
    assert cache.stats()["fragment_stats"]["num_fragments"] == 1
    assert [i.columns for i in cache.list_indices()] == [["key"]]
    task_names.clear()
    assert ingest(config_path=str(config))["docs_unchanged"] == 5 and "tidy model cache" not in task_names
