"""Task runners: batches on a Dask LocalCluster or in worker processes make the tables a thread-pool run makes."""

from __future__ import annotations

import shutil
from pathlib import Path

import lancedb
import pytest

from flows.ingest import ingest
from schemas.config import load_config
from tests.conftest import SAMPLE

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _tables(config: Path) -> tuple[list[tuple], list[tuple]]:
    db = lancedb.connect(str(load_config(config).store.uri))
    chunks = db.open_table("chunks").to_arrow()
    docs = db.open_table("documents").to_arrow()
    return (sorted(zip(*(chunks[c].to_pylist() for c in ("chunk_id", "doc_id", "chunk_index", "text", "enrichment",
                                                          "page_start", "vector")))),
            sorted(zip(*(docs[c].to_pylist() for c in ("doc_id", "content_hash", "status", "total_chunks", "title")))))


def _pair(write_config, corpus: Path, runner: dict) -> tuple[Path, Path]:
    # Two documents a batch: the five sample files (Markdown, text, HTML, PDF, DOCX) make three batches.
    common = {"batch_docs": 2, "workers": 2}
    return (write_config(corpus, name="thread.yaml", store="thread", execution={**common, "task_runner": "thread"}),
            write_config(corpus, name="other.yaml", store="other", execution={**common, **runner}))


def test_a_dask_local_cluster_run_makes_the_tables_a_thread_pool_run_makes(corpus, write_config):
    thread, dask = _pair(write_config, corpus, {"task_runner": "dask"})
    first = ingest(config_path=str(thread))
    other = ingest(config_path=str(dask))
    assert first["docs_new"] == other["docs_new"] == 5 and other["docs_quarantined"] == 0
    assert _tables(dask) == _tables(thread)
    assert not [n for n in other["notices"] if "daemonic" in n], "the local cluster's workers keep the time limit"


def test_a_process_pool_run_makes_the_tables_a_thread_pool_run_makes(tmp_path, write_config):
    corpus = tmp_path / "md"
    corpus.mkdir()
    for n in range(4):
        shutil.copy(SAMPLE / "guides" / "boat-maintenance.md", corpus / f"guide-{n}.md")
        (corpus / f"guide-{n}.md").write_text((corpus / f"guide-{n}.md").read_text() + f"\nCopy {n}.\n")
    thread, process = _pair(write_config, corpus, {"task_runner": "process"})
    ingest(config_path=str(thread))
    other = ingest(config_path=str(process))
    assert other["docs_new"] == 4 and _tables(process) == _tables(thread)
