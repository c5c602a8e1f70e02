"""Data-quality gates: great-expectations really validating deliberately bad Arrow tables, per severity."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from schemas.errors import DataQualityError
from tasks.quality import gate, scalar_view, suites, validate, with_severities

CHUNKS = suites(max_tokens=200, dim=3)


def _chunks(rows: list[tuple[str | None, str, str, int]]) -> pa.Table:
    return pa.table({"chunk_id": [r[0] for r in rows], "doc_id": [r[1] for r in rows],
                     "text": [r[2] for r in rows], "token_count": pa.array([r[3] for r in rows], pa.int32())})


def _embedded(vectors: list[list[float]]) -> pa.Table:
    flat = pa.array(np.asarray(vectors, dtype=np.float32).reshape(-1))
    return pa.table({"chunk_id": [f"c{i}" for i in range(len(vectors))], "doc_id": [f"d{i}" for i in range(len(vectors))],
                     "vector": pa.FixedSizeListArray.from_arrays(flat, 3)})


def test_clean_chunks_pass_every_check():
    outcomes = validate("chunks", _chunks([("a", "d1", "text", 10), ("b", "d1", "more", 20)]), CHUNKS["chunks"])
    assert [o.check for o in outcomes] == ["chunk_id_present", "chunk_id_unique", "text_not_empty",
                                           "tokens_within_limit"]
    assert all(o.success for o in outcomes) and gate(outcomes) == {}


def test_quarantine_checks_name_the_documents_of_the_failing_rows():
    bad = _chunks([("a", "d1", "fine", 10), ("b", "d2", "", 5), ("c", "d3", "long", 900), ("d", "d1", "ok", 3)])
    outcomes = validate("chunks", bad, CHUNKS["chunks"])
    assert {o.check: o.failed_rows for o in outcomes if not o.success} == {"text_not_empty": (1,),
                                                                           "tokens_within_limit": (2,)}
    assert gate(outcomes) == {"d2": "validation: chunks.text_not_empty", "d3": "validation: chunks.tokens_within_limit"}


def test_a_fail_check_stops_the_run_and_an_override_turns_it_into_quarantine_or_warn():
    dupes = _chunks([("a", "d1", "x", 1), ("a", "d2", "y", 1), (None, "d3", "z", 1)])
    with pytest.raises(DataQualityError, match=r"chunks.chunk_id_present \(1 rows\); chunks.chunk_id_unique"):
        gate(validate("chunks", dupes, CHUNKS["chunks"]))
    softer = with_severities(CHUNKS["chunks"], "chunks", {"chunks.chunk_id_unique": "quarantine",
                                                          "chunks.chunk_id_present": "warn"})
    assert gate(validate("chunks", dupes, softer)) == {"d1": "validation: chunks.chunk_id_unique",
                                                       "d2": "validation: chunks.chunk_id_unique"}


def test_each_validation_judges_by_its_own_suites_bounds_not_an_earlier_suites():
    rows = _chunks([("a", "d1", "x", 10), ("b", "d2", "y", 300)])
    assert gate(validate("chunks", rows, CHUNKS["chunks"])) == {"d2": "validation: chunks.tokens_within_limit"}
    wider = suites(max_tokens=400, dim=3)["chunks"]
    assert gate(validate("chunks", rows, wider)) == {}


def test_vectors_are_judged_through_their_scalar_view():
    table = _embedded([[1, 0, 0], [np.nan, 1, 0], [0, 0, 0]])
    assert scalar_view(table).column_names == ["chunk_id", "doc_id", "vector_dim", "vector_finite", "vector_norm"]
    outcomes = validate("embedded_chunks", table, CHUNKS["embedded_chunks"])
    assert gate(outcomes) == {"d1": "validation: embedded_chunks.vector_finite",  # and not also "zero"
                              "d2": "validation: embedded_chunks.vector_not_zero"}
    with pytest.raises(DataQualityError, match="embedded_chunks.vector_dimension"):
        gate(validate("embedded_chunks", table, suites(max_tokens=200, dim=384)["embedded_chunks"]))


def test_chunks_and_their_vectors_are_judged_in_one_validation_each_outcome_under_its_own_artifact():
    from tasks.quality import validate_together

    rows = _embedded([[1, 0, 0], [0, 0, 0], [0, 1, 0]]).append_column(
        "text", pa.array(["x", "", "z"])).append_column("token_count", pa.array([1, 1, 300], pa.int32()))
    outcomes = validate_together(rows, {"chunks": CHUNKS["chunks"], "embedded_chunks": CHUNKS["embedded_chunks"]})
    assert [(o.artifact, o.check) for o in outcomes] == [("chunks", c.name) for c in CHUNKS["chunks"]] + [
        ("embedded_chunks", c.name) for c in CHUNKS["embedded_chunks"]]
    assert gate(outcomes) == {"d1": "validation: chunks.text_not_empty", "d2": "validation: chunks.tokens_within_limit"}
    assert {(o.artifact, o.check): o.failed_docs for o in outcomes if not o.success} == {
        ("chunks", "text_not_empty"): ("d1",), ("chunks", "tokens_within_limit"): ("d2",),
        ("embedded_chunks", "vector_not_zero"): ("d1",)}


def test_documents_with_an_unknown_access_level_are_quarantined():
    docs = pa.table({"doc_id": ["a", "b"], "access_level": ["public", "top-secret"]})
    assert gate(validate("documents", docs, CHUNKS["documents"])) == {"b": "validation: documents.access_level_allowed"}


@pytest.fixture
def punctuation_doc(corpus, monkeypatch):
    """A document that a faulty model embeds as NaN (models do: an fp16 overflow, a bad batch)."""
    from providers.embedders import HashingEmbedder

    (corpus / "dividers.md").write_text("# Dividers\n\n--- *** --- !!! ??? ... ;;; ///\n")
    embed = HashingEmbedder.embed

    def faulty(self, texts, titles=None):
        vectors = embed(self, texts, titles)
        vectors[[i for i, t in enumerate(texts) if "!!!" in t]] = np.nan
        return vectors

    monkeypatch.setattr(HashingEmbedder, "embed", faulty)
    return corpus


@pytest.mark.usefixtures("prefect_harness")
def test_a_run_quarantines_the_document_of_a_bad_vector_and_reports_the_checks(punctuation_doc, write_config):
    from flows.ingest import ingest

    config = write_config(punctuation_doc)
    summary = ingest(config_path=str(config))
    assert summary["quarantined"] == [{"doc_id": "sample:dividers.md", "stage": "validate", "reason": "invalid",
                                       "message": "validation: embedded_chunks.vector_finite"}]
    assert summary["docs_new"] == 6 and summary["docs_quarantined"] == 1
    checks = {(v["artifact"], v["check"]): v["failed"] for v in summary["validation"]}
    assert checks[("embedded_chunks", "vector_finite")] == 1 and sum(checks.values()) == 1

    from query import search

    assert all(h.doc_id != "sample:dividers.md" for h in search("dividers", k=50, mode="fulltext", config=config))


@pytest.mark.usefixtures("prefect_harness")
def test_a_fail_severity_stops_the_run_before_anything_is_committed(punctuation_doc, write_config):
    from flows.ingest import ingest

    config = write_config(punctuation_doc,
                          quality={"severity": {"embedded_chunks.vector_finite": "fail"}})
    with pytest.raises(DataQualityError, match="embedded_chunks.vector_finite"):
        ingest(config_path=str(config))
    assert not (config.parent / "store" / "lancedb" / "chunks.lance").exists(), "nothing committed"


def test_the_config_knows_every_check_the_suites_run():
    from schemas.config import QUALITY_CHECKS

    assert {a: tuple(c.name for c in checks) for a, checks in CHUNKS.items()} == QUALITY_CHECKS


@pytest.mark.slow
def test_the_flow_loads_great_expectations_only_when_a_batch_is_validated():
    # GX takes seconds to import; a no-op run (nothing changed, no batch) should not pay them at start-up.
    import subprocess
    import sys
    from pathlib import Path

    probe = "import sys, flows.ingest; print('great_expectations' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_validating_leaves_great_expectations_and_the_libraries_beside_it_as_they_are():
    # Public APIs only: GX's own expectation classes and metric ids, tqdm's defaults, no import finder or module
    # stand-in of Inlet's around GX's import (scipy.stats and altair are the real modules), the collector untouched.
    import subprocess
    import sys
    from pathlib import Path

    probe = """
import gc, sys
import pyarrow as pa
frozen = gc.get_freeze_count()
from providers.gx import expectation_suite
from tasks.quality import suites, validate
table = pa.table({"chunk_id": ["a", None], "doc_id": ["d1", "d2"], "text": ["x", "y"],
                  "token_count": pa.array([1, 2], pa.int32())})
print([o.check for o in validate("chunks", table, suites(10, 4)["chunks"]) if not o.success])
import tqdm
from great_expectations.core.id_dict import IDDict
print(all(type(f).__module__.partition(".")[0] not in ("providers", "tasks") for f in sys.meta_path),
      gc.get_freeze_count() == frozen, tqdm.tqdm.monitor_interval,
      IDDict.to_id.__module__)
print([type(sys.modules.get(n)).__name__ for n in ("scipy.stats", "altair")])
print(sorted({type(e).__module__.partition(".")[0] for e in
              expectation_suite("chunks", [(c.name, c.expectation, c.kwargs) for c in suites(10, 4)["chunks"]])
              .expectations}))
"""
    out = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.splitlines() == ["['chunk_id_present']",
                                       "True True 10 great_expectations.core.id_dict",
                                       "['module', 'module']", "['great_expectations']"]
