"""Maintenance: compaction and pruning after many runs, integrity checks, opt-in repair."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import lancedb
import numpy as np
import pyarrow as pa
import pytest

from flows.ingest import ingest
from flows.maintenance import maintenance
from query import search
from schemas.config import load_config
from store.commit import fulltext_index_name
from store.maintenance import expired_tags
from tasks.maintain import bad_vectors, integrity_findings

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _docs(rows: list[tuple[str, int]]) -> pa.Table:
    return pa.table({"doc_id": [d for d, _ in rows], "total_chunks": pa.array([n for _, n in rows], pa.int32())})


def _chunks(rows: list[tuple[str, str, int]]) -> pa.Table:
    return pa.table({"chunk_id": [c for c, _, _ in rows], "doc_id": [d for _, d, _ in rows],
                     "total_chunks": pa.array([n for _, _, n in rows], pa.int32())})


def test_integrity_findings_name_orphans_missing_chunks_and_count_mismatches():
    documents = _docs([("a", 2), ("b", 1), ("c", 3), ("d", 0)])
    chunks = _chunks([("a0", "a", 2), ("a1", "a", 2), ("c0", "c", 3), ("c1", "c", 3), ("x0", "ghost", 1)])
    found = {(f["check"], f["doc_id"], f["chunk_id"]) for f in integrity_findings("chunks", documents, chunks)}
    assert found == {("orphan_chunk", "ghost", "x0"), ("document_without_chunks", "b", None),
                     ("chunk_count_mismatch", "c", None)}


def test_bad_vectors_are_non_finite_or_all_zero():
    vectors = np.array([[1, 0, 0], [np.nan, 1, 0], [0, 0, 0], [0.5, 0.5, np.inf]], dtype=np.float32)
    batch = pa.table({"chunk_id": ["ok", "nan", "zero", "inf"], "doc_id": ["d"] * 4,
                      "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 3)})
    assert [(f["chunk_id"], f["detail"]) for f in bad_vectors("chunks", batch)] == [
        ("nan", "non-finite values"), ("zero", "all zeros"), ("inf", "non-finite values")]


def test_tags_older_than_the_cutoff_or_on_pruned_versions_expire():
    now = datetime(2026, 11, 22, tzinfo=UTC)
    versions = [{"version": 1, "timestamp": now - timedelta(days=9)}, {"version": 2, "timestamp": now}]
    tags = {"old": {"version": 1}, "new": {"version": 2}, "gone": {"version": 0}}
    assert expired_tags(tags, versions, now - timedelta(days=7)) == ["gone", "old"]


def test_maintenance_after_30_runs_leaves_fewer_files_and_versions_and_the_same_results(corpus, write_config):
    config = write_config(corpus)
    for i in range(30):  # a new small document each run: one more small fragment each time
        (corpus / f"log-{i}.md").write_text(f"# Log {i}\n\nEntry {i}: mooring lines checked, bilge pump tested.\n")
        ingest(config_path=str(config))
    store = str(load_config(config).store.uri)
    questions = ["gelcoat hardener", "winterize the outboard engine", "bilge pump"]

    def answers() -> dict:
        # Vector ranks and scores exactly; full-text the set of every matching chunk (BM25 scores move
        # when rows added after the index are folded into it, as maintenance does).
        return {q: ([(h.chunk_id, h.text, h.score) for h in search(q, k=5, mode="vector", config=config)],
                    sorted(h.chunk_id for h in search(q, k=1000, mode="fulltext", config=config))) for q in questions}

    before = answers()

    report = maintenance(config_path=str(config), retention_days=0)

    chunks = report["tables"]["chunks"]
    assert chunks["after"]["fragments"] < chunks["before"]["fragments"]
    assert chunks["after"]["versions"] < chunks["before"]["versions"] and chunks["after"]["versions"] <= 2
    assert len(chunks["tags_removed"]) == 30, "every run tag was on a version older than the cutoff"
    assert report["findings"] == [] and report["repaired"] is None
    assert answers() == before
    chunks = lancedb.connect(store).open_table("chunks")
    assert chunks.index_stats(fulltext_index_name(chunks)).num_unindexed_rows == 0
    assert ingest(config_path=str(config))["docs_unchanged"] > 0, "the pruned store still ingests"


def test_a_planted_orphan_chunk_and_a_lost_chunk_are_found_and_repaired(corpus, write_config):
    config = write_config(corpus, maintenance={"retention_days": 30})
    ingest(config_path=str(config))
    db = lancedb.connect(str(load_config(config).store.uri), read_consistency_interval=timedelta(0))
    table = db.open_table("chunks")
    some = table.search().limit(None).to_arrow()
    orphan = some.slice(0, 1).set_column(some.schema.get_field_index("chunk_id"), "chunk_id", pa.array(["planted"]))
    orphan = orphan.set_column(orphan.schema.get_field_index("doc_id"), "doc_id", pa.array(["sample:ghost.md"]))
    table.add(orphan)
    victim = some.filter(pa.compute.equal(some["doc_id"], "sample:guides/boat-maintenance.md"))["chunk_id"][0].as_py()
    table.delete(f"chunk_id = '{victim}'")

    found = maintenance(config_path=str(config))
    assert {(f["check"], f["chunk_id"] or f["doc_id"]) for f in found["findings"]} == {
        ("orphan_chunk", "planted"), ("chunk_count_mismatch", "sample:guides/boat-maintenance.md")}
    assert found["repaired"] is None, "repair is opt-in"
    assert table.count_rows("chunk_id = 'planted'") == 1

    fixed = maintenance(config_path=str(config), repair=True)
    assert fixed["repaired"] == {"chunks_deleted": 1, "documents_requeued": 1, "cache_entries_deleted": 0}
    assert table.count_rows("chunk_id = 'planted'") == 0
    rerun = ingest(config_path=str(config))
    assert rerun["docs_changed"] == 1 and rerun["texts_embedded"] == 0, "the lost chunk's vector is in the model cache"
    assert rerun["texts_embed_cached"] == len(set(some.filter(pa.compute.equal(
        some["doc_id"], "sample:guides/boat-maintenance.md"))["embed_key"].to_pylist()))
    assert maintenance(config_path=str(config))["findings"] == []


def test_the_findings_artifact_lists_tables_checks_and_repairs():
    from flows.maintenance import findings_markdown
    from tasks.maintain import FINDINGS_SCHEMA

    tables = {"chunks": {"before": {"versions": 40, "fragments": 31, "rows": 50},
                         "after": {"versions": 2, "fragments": 1, "rows": 50}, "tags_removed": ["run-a", "run-b"]}}
    findings = pa.Table.from_pylist([{"table": "chunks", "check": "orphan_chunk", "doc_id": "sample:ghost.md",
                                      "chunk_id": "planted", "detail": "its document is not in the documents table"}],
                                    schema=FINDINGS_SCHEMA)
    text = findings_markdown(tables, findings, {"chunks_deleted": 1, "documents_requeued": 0})
    assert "| chunks | 40 → 2 | 31 → 1 | 50 | run-a, run-b |" in text
    assert "| orphan_chunk | 1 |" in text and "| bad_vector | 0 |" in text
    assert "| chunks | orphan_chunk | sample:ghost.md | planted |" in text
    assert "1 chunks deleted, 0 documents sent back" in text
