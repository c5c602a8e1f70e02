"""Task runners: batches on a Dask LocalCluster or in worker processes make the tables a thread-pool run makes."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import lancedb
import pytest
import yaml

from flows.ingest import ingest
from schemas.config import load_config
from schemas.errors import ConfigError
from tests.conftest import SAMPLE, bucket_store

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _tables(config: Path) -> tuple[list[tuple], list[tuple]]:
    store = load_config(config).store
    db = lancedb.connect(str(store.uri), storage_options=store.options or None)
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


@pytest.fixture(scope="module")
def sample_reference(tmp_path_factory, prefect_harness) -> tuple[Path, tuple]:
    """The sample corpus and the tables a thread-pool run makes of it, built once for the Dask tests."""
    root = tmp_path_factory.mktemp("thread-reference")
    corpus = root / "corpus"
    shutil.copytree(SAMPLE, corpus)
    config = root / "thread.yaml"
    config.write_text(yaml.safe_dump({
        "sources": [{"name": "sample", "path": str(corpus)}], "embedding": {"kind": "hashing", "dim": 64},
        "store": {"uri": str(root / "store" / "lancedb"), "artifacts": str(root / "store" / "runs")},
        "execution": {"batch_docs": 2, "workers": 2, "task_runner": "thread"}}))
    assert ingest(config_path=str(config))["docs_new"] == 5
    return corpus, _tables(config)


def _dask_config(tmp_path: Path, corpus: Path, execution: dict) -> Path:
    config = tmp_path / "dask.yaml"
    config.write_text(yaml.safe_dump({
        "sources": [{"name": "sample", "path": str(corpus)}], "embedding": {"kind": "hashing", "dim": 64},
        "store": {"uri": str(tmp_path / "store" / "lancedb"), "artifacts": str(tmp_path / "store" / "runs")},
        "execution": {"batch_docs": 2, "workers": 2, "task_runner": "dask", **execution}}))
    return config


def test_a_dask_local_cluster_run_makes_the_tables_a_thread_pool_run_makes(sample_reference, tmp_path):
    corpus, expected = sample_reference
    dask = _dask_config(tmp_path, corpus, {})
    other = ingest(config_path=str(dask))
    assert other["docs_new"] == 5 and other["docs_quarantined"] == 0
    assert _tables(dask) == expected
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory, prefect_harness):
    """A Dask scheduler and one worker started as separate commands, as on other machines; shared by this file's tests.

    Each test gives the flow its own store and artifact folder, so what one run leaves on the worker (its
    imports, its loaded models) is only what a long-lived worker of a real cluster keeps between runs.
    """
    import os
    import subprocess
    import sys
    import time

    from prefect.settings import PREFECT_API_URL

    from tests.conftest import ROOT

    tmp_path = tmp_path_factory.mktemp("dask-cluster")
    port = _free_port()
    # The workers report their task runs to the same Prefect API and import the project from its folder.
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": str(ROOT)}
    dask = str(Path(sys.executable).parent / "dask")
    logs = [(tmp_path / f"{name}.log").open("w") for name in ("scheduler", "worker")]
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", ":0"], env=env, cwd=tmp_path, stdout=logs[0],
                              stderr=subprocess.STDOUT)]
    address = f"tcp://127.0.0.1:{port}"
    # No nanny: the worker is its own (non-daemonic) process and may start extraction workers.
    procs.append(subprocess.Popen([dask, "worker", address, "--nthreads", "1", "--no-nanny",
                                   "--dashboard-address", ":0"], env=env, cwd=ROOT, stdout=logs[1],
                                  stderr=subprocess.STDOUT))
    from distributed import Client

    deadline = time.monotonic() + 60
    while True:
        try:
            with Client(address, timeout=5) as client:
                client.wait_for_workers(1, timeout=30)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    yield address
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)
    for log in logs:
        log.close()


@pytest.mark.parametrize("runner", ["process", "dask"])
def test_workers_given_batches_that_share_texts_pay_for_each_distinct_text_once(tmp_path, write_config, monkeypatch,
                                                                                runner):
    # Six copies of one guide, each with a last line of its own: six batches on two workers, sharing all but a
    # few texts. Nothing is committed before the last batch: only the model cache can tell a worker what the
    # other paid for.
    from tests.gemini_server import GeminiServer

    corpus = tmp_path / "md"
    corpus.mkdir()
    for n in range(6):
        text = (SAMPLE / "guides" / "boat-maintenance.md").read_text()
        (corpus / f"guide-{n}.md").write_text(text + f"\nCopy {n} of the guide, kept in locker {n}.\n")
    monkeypatch.setenv("GEMINI_API_KEY", "AIza-workers-key-must-never-leak-5")  # inherited by the workers
    server = GeminiServer().start()
    try:
        config = write_config(corpus, name=f"{runner}.yaml", store=runner,
                              enrichment={"provider": "gemini", "kind": "questions", "base_url": server.base_url},
                              embedding={"kind": "gemini", "dim": 32, "base_url": server.base_url},
                              execution={"batch_docs": 1, "workers": 2, "task_runner": runner,
                                         "commit_rows": 100_000},
                              # What each worker pays the model is the point: without validation the four workers
                              # neither import nor warm great-expectations (~5 s of CPU each). The two tests above
                              # validate in such workers.
                              quality={"enabled": False})
        summary = ingest(config_path=str(config))
        chunks = lancedb.connect(str(load_config(config).store.uri)).open_table("chunks").to_arrow()
        enrich_keys, embed_keys = set(chunks["enrich_key"].to_pylist()), set(chunks["embed_key"].to_pylist())
        assert summary["docs_new"] == 6 and len(embed_keys) < chunks.num_rows, "the batches share texts"
        assert server.traffic.calls["generateContent"] == len(enrich_keys) == summary["texts_enriched"], \
            "each distinct text enriched once"
        assert sum(server.traffic.embed_batch_sizes) == len(embed_keys) == summary["texts_embedded"], \
            "each distinct text embedded once"
        assert summary["texts_enrich_cached"] > 0, "later batches were served what earlier ones paid for"
    finally:
        server.stop()


def test_batches_run_on_an_existing_dask_cluster_given_by_address(sample_reference, tmp_path, dask_cluster):
    corpus, expected = sample_reference
    remote = _dask_config(tmp_path, corpus, {"dask_address": dask_cluster})
    other = ingest(config_path=str(remote))
    assert other["docs_new"] == 5 and other["docs_quarantined"] == 0
    assert _tables(remote) == expected


def test_dask_workers_started_apart_write_batches_and_tables_to_a_bucket(sample_reference, tmp_path, dask_cluster, s3):
    # As across machines: the workers share nothing with the flow but the Dask scheduler and the bucket.
    corpus, expected = sample_reference
    endpoint, client, _ = s3
    client.create_bucket(Bucket="knowledge")
    config = _dask_config(tmp_path, corpus, {"dask_address": dask_cluster})
    data = yaml.safe_load(config.read_text())
    data["store"] = bucket_store(endpoint, "knowledge")
    config.write_text(yaml.safe_dump(data))
    summary = ingest(config_path=str(config))
    assert summary["docs_new"] == 5 and summary["docs_quarantined"] == 0
    assert not (tmp_path / "store").exists(), "nothing written locally"
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="knowledge", Prefix="runs/")["Contents"]]
    assert any("/batches/" in k and k.endswith("embedded_chunks.parquet") for k in keys), keys[:20]
    assert _tables(config) == expected


def test_a_dask_address_nobody_answers_is_an_error_naming_the_key(corpus, write_config):
    import dask

    address = f"tcp://127.0.0.1:{_free_port()}"
    config = write_config(corpus, execution={"task_runner": "dask", "dask_address": address})
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}), \
            pytest.raises(ConfigError, match=rf"execution.dask_address: cannot reach the Dask cluster at {address}"):
        ingest(config_path=str(config))


def test_the_cpu_pool_shares_markdown_and_chunking_and_makes_the_same_tables(sample_reference, tmp_path, monkeypatch):
    import runtime.cpu

    corpus, expected = sample_reference
    monkeypatch.setattr(runtime.cpu, "MIN_BYTES", 0)  # the sample corpus is far below the size that starts the pool
    monkeypatch.setattr(runtime.cpu, "PART_BYTES", 1)  # one document a part: every batch has parts to share out
    config = tmp_path / "pool.yaml"
    config.write_text(yaml.safe_dump({
        "sources": [{"name": "sample", "path": str(corpus)}], "embedding": {"kind": "hashing", "dim": 64},
        "store": {"uri": str(tmp_path / "store" / "lancedb"), "artifacts": str(tmp_path / "store" / "runs")},
        "execution": {"batch_docs": 2, "workers": 2, "task_runner": "thread", "cpu_workers": 2}}))
    # Up before the run (which then keeps it): the batches of so small a corpus would end before it starts.
    runtime.cpu.start_cpu_pool(2)
    while runtime.cpu.cpu_pool()[0] is None:
        time.sleep(0.05)
    summary = ingest(config_path=str(config))
    assert summary["docs_new"] == 5 and summary["docs_quarantined"] == 0
    assert _tables(config) == expected
    assert runtime.cpu.cpu_pool() == (None, 0), "the run stopped its pool"
