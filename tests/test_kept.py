"""Extraction kept by content (tasks/kept.py): a change of chunking re-chunks from kept elements and reads no file."""

from __future__ import annotations

import logging
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import lancedb
import pyarrow as pa
import pytest

from flows.ingest import ingest
from schemas.arrow import KEPT_SCHEMA
from schemas.config import ExtractionConfig, load_config
from store.commit import kept_for
from tasks.kept import (
    decode_metadata,
    encode_metadata,
    extraction_fingerprint,
    kept_rows,
    parser_versions,
    usable,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")

PDF = "reports/regatta-report-2025.pdf"


def test_metadata_round_trips_with_a_declared_expiry():
    meta = {"tags": ["a", "b"], "language": "en", "declared_expiry": datetime(2030, 1, 2, 3, 4, tzinfo=UTC),
            "declared_level": "internal", "subject": "sailing"}
    assert decode_metadata(encode_metadata(meta)) == meta


def test_the_fingerprint_follows_what_decides_elements_not_how_fast_they_are_read():
    base = extraction_fingerprint(ExtractionConfig())
    assert extraction_fingerprint(ExtractionConfig(workers=4, timeout_s=10)) == base
    assert extraction_fingerprint(ExtractionConfig(ocr=True)) != base
    assert extraction_fingerprint(ExtractionConfig(max_file_mb=5)) != base
    assert dict(parser_versions())["unstructured"] is not None  # the parsers' versions are part of it


def test_an_entry_stands_only_for_the_same_document_bytes_and_fingerprint():
    now = datetime.now(UTC)
    element = {"doc_id": "s:a.md", "element_index": 0, "kind": "markdown", "text": "Hello", "heading_level": None,
               "page": None}
    rows = pa.concat_tables([
        kept_rows([("s:a.md", "h1", "A", {}, True, [element])], "fp", now),
        kept_rows([("s:b.md", "h2", "B", {}, True, [{**element, "doc_id": "s:b.md"}])], "old-fp", now),
        kept_rows([("s:c.md", "h3", "C", {"declared_level": "internal"}, False, [{**element, "doc_id": "s:c.md"}])],
                  "fp", now),
    ])
    todo = [{"doc_id": "s:a.md", "content_hash": "h1"}, {"doc_id": "s:b.md", "content_hash": "h2"},
            {"doc_id": "s:c.md", "content_hash": "other"}, {"doc_id": "s:d.md", "content_hash": None}]
    found = usable(rows, todo, "fp")
    assert list(found) == ["s:a.md"]
    assert found["s:a.md"]["elements"] == [element] and found["s:a.md"]["title"] == "A"
    assert kept_for(rows, ["s:c.md"])["doc_id"].to_pylist() == ["s:c.md"]
    assert kept_for(rows, []).num_rows == 0


def test_metadata_json_cannot_carry_is_not_kept_rather_than_failing_the_batch():
    rows = kept_rows([("s:a.md", "h1", "A", {"odd": object()}, True, [])], "fp", datetime.now(UTC))
    assert rows.num_rows == 0 and rows.schema == KEPT_SCHEMA


def _chunks(config: Path) -> list[tuple]:
    table = lancedb.connect(str(load_config(config).store.uri)).open_table("chunks").to_arrow()
    return sorted(zip(*(table[c].to_pylist() for c in ("chunk_id", "doc_id", "chunk_index", "text", "title",
                                                        "language", "tags", "access_level"))))


def _kept(config: Path) -> dict[str, str]:
    table = lancedb.connect(str(load_config(config).store.uri)).open_table("extractions").to_arrow()
    return dict(zip(table["doc_id"].to_pylist(), table["content_hash"].to_pylist()))


def test_a_new_chunk_size_rechunks_from_kept_elements_reads_no_file_and_matches_a_cold_run(corpus, write_config,
                                                                                           caplog):
    config = write_config(corpus)
    with caplog.at_level(logging.INFO):
        first = ingest(config_path=str(config))
    assert first["docs_extracted"] == 5 and first["docs_from_kept"] == 0
    # The four non-Markdown files need a worker: started before great-expectations loads, not at the first of them.
    assert "starting the extraction workers for 4 documents" in caplog.text
    caplog.clear()
    assert set(_kept(config)) == {f"sample:{p.relative_to(corpus).as_posix()}" for p in corpus.rglob("*")
                                  if p.is_file()}
    # Every file's bytes are scrambled in place, size and mtime kept: were any read again, its chunks would differ.
    originals = corpus.parent / "originals"
    shutil.copytree(corpus, originals)
    for path in corpus.rglob("*"):
        if path.is_file():
            stat = path.stat()
            path.write_bytes(b"x" * stat.st_size)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    smaller = {"max_tokens": 60, "overlap_tokens": 10}
    write_config(corpus, chunking=smaller)
    with caplog.at_level(logging.INFO):
        second = ingest(config_path=str(config))
    assert second["docs_changed"] == 5 and second["docs_quarantined"] == 0
    assert second["docs_extracted"] == 0 and second["docs_from_kept"] == 5
    assert "starting the extraction workers" not in caplog.text, "every file is kept: no worker is needed"

    cold = write_config(originals, name="cold.yaml", store="cold", chunking=smaller)
    ingest(config_path=str(cold))
    assert _chunks(config) == _chunks(cold)


def test_new_extraction_settings_read_every_file_again(corpus, write_config):
    config = write_config(corpus)
    ingest(config_path=str(config))
    write_config(corpus, extraction={"max_file_mb": 50})
    again = ingest(config_path=str(config))
    assert again["docs_changed"] == 5 and again["docs_extracted"] == 5 and again["docs_from_kept"] == 0


def test_a_changed_file_is_read_again_and_a_deleted_one_leaves_the_kept_extractions(corpus, write_config):
    config = write_config(corpus)
    ingest(config_path=str(config))
    before = _kept(config)
    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text(encoding="utf-8") + "\nRinse the winches with fresh water.\n", encoding="utf-8")
    (corpus / PDF).unlink()
    again = ingest(config_path=str(config))
    assert again["docs_changed"] == 1 and again["docs_deleted"] == 1
    assert again["docs_extracted"] == 1 and again["docs_from_kept"] == 0
    after = _kept(config)
    assert f"sample:{PDF}" not in after
    assert after["sample:guides/boat-maintenance.md"] != before["sample:guides/boat-maintenance.md"]
    assert len(after) == 4


def test_a_plan_counts_the_documents_it_would_rechunk_from_kept_elements(corpus, write_config):
    config = write_config(corpus)
    ingest(config_path=str(config))
    write_config(corpus, chunking={"max_tokens": 80, "overlap_tokens": 10})
    summary = ingest(config_path=str(config), dry_run=True)
    assert summary["docs_changed"] == 5
    assert summary["docs_extracted"] == 0 and summary["docs_from_kept"] == 5
