"""Gemini Batch Mode through the real google-genai client: half price, resumed after an interruption, failed rows resent."""

from __future__ import annotations

import json
from pathlib import Path

import lancedb
import pytest

from flows.ingest import BATCH_JOBS_DIR, ingest
from schemas.config import DEFAULT_PRICES, load_config
from schemas.errors import BatchPendingError
from tests.gemini_server import Faults, GeminiServer

pytestmark = pytest.mark.usefixtures("prefect_harness")
KEY = "AIza-batch-key-must-never-leak-7"
FAST_POLLING = {"poll_initial_s": 0.05, "poll_max_s": 0.2}


def _config(write_config, corpus, srv: GeminiServer, quality: dict | None = None, **batch):
    sections = {"quality": quality} if quality else {}
    return write_config(corpus, enrichment={"provider": "gemini", "kind": "keywords", "base_url": srv.base_url,
                                            "batch": {**FAST_POLLING, **batch}}, **sections)


def _enrichments(config) -> list[str | None]:
    table = lancedb.connect(str(load_config(config).store.uri)).open_table("chunks")
    return table.to_arrow()["enrichment"].to_pylist()


def test_batch_mode_enriches_at_half_price_and_the_next_run_resends_only_failed_rows(write_config, corpus,
                                                                                     monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    srv = GeminiServer(Faults(batch_polls=3, p_batch_row_error=0.2, seed=2)).start()
    try:
        config = _config(write_config, corpus, srv, mode="always")
        first = ingest(config_path=str(config))
        assert srv.traffic.calls.get("generateContent", 0) == 0 and srv.traffic.calls["batchGenerateContent"] == 1
        assert srv.traffic.calls["batches.get"] >= 3, "the flow polled until the job ended"
        failed = first["texts_enrich_failed"]
        assert 0 < failed < first["chunks_added"], "the job failed some rows"
        assert first["llm_batch_jobs"] == 1 and first["llm_batch_requests"] == first["texts_enriched"]
        assert first["texts_enriched"] + failed == first["chunks_added"] == len(_enrichments(config))
        price = DEFAULT_PRICES["gemini-2.5-flash"]
        full = (first["llm_prompt_tokens"] * price.input + first["llm_output_tokens"] * price.output) / 1e6
        assert first["llm_cost_usd"] == pytest.approx(full / 2), "Batch Mode is billed at half price"
        assert not list((Path(load_config(config).store.artifacts) / BATCH_JOBS_DIR).glob("*.json")), "job collected"

        # Back to auto mode: the few failed rows go out again on their own, online.
        config = _config(write_config, corpus, srv, mode="auto")
        second = ingest(config_path=str(config))
        assert srv.traffic.calls["generateContent"] == failed == second["texts_enriched"]
        assert srv.traffic.calls["batchGenerateContent"] == 1
        assert all(_enrichments(config)) and len(_enrichments(config)) == first["chunks_added"]
    finally:
        srv.stop()


def test_an_interrupted_batch_job_is_resumed_not_submitted_again(write_config, corpus, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    srv = GeminiServer(Faults(batch_hold=True)).start()
    try:
        config = _config(write_config, corpus, srv, mode="always", max_wait_s=0.5)
        with pytest.raises(BatchPendingError, match=r"batches/job1 is still JOB_STATE_RUNNING.*run ingest again"):
            ingest(config_path=str(config))
        cfg = load_config(config)
        records = [json.loads(p.read_text()) for p in (Path(cfg.store.artifacts) / BATCH_JOBS_DIR).glob("*.json")]
        assert [r["name"] for r in records] == ["batches/job1"], "the job's name outlived the run"
        assert KEY not in json.dumps(records)
        assert not (Path(cfg.store.uri) / "chunks.lance").exists(), "nothing was committed by the interrupted run"

        srv.faults = Faults()  # the job finishes while no run is watching
        resumed = ingest(config_path=str(config))
        assert srv.traffic.calls["batchGenerateContent"] == 1, "resumed, not paid for twice"
        assert resumed["llm_batch_jobs"] == 1 and resumed["texts_enriched"] == resumed["chunks_added"] > 0
        assert all(_enrichments(config)) and srv.traffic.calls.get("generateContent", 0) == 0
        assert not list((Path(cfg.store.artifacts) / BATCH_JOBS_DIR).glob("*.json"))
    finally:
        srv.stop()


def test_auto_mode_batches_only_at_the_threshold(write_config, corpus, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    srv = GeminiServer().start()
    try:
        summary = ingest(config_path=str(_config(write_config, corpus, srv, mode="auto", min_rows=10_000)))
        assert srv.traffic.calls.get("batchGenerateContent", 0) == 0 and summary["llm_batch_jobs"] == 0
        assert srv.traffic.calls["generateContent"] == summary["texts_enriched"] > 0
    finally:
        srv.stop()


def test_embeddings_go_through_batch_mode_with_each_chunk_title_and_resume_after_an_interruption(
        write_config, corpus, monkeypatch):
    """Batch embedding: one JSONL job; failed rows embedded online at once; an interrupted job collected later."""
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    srv = GeminiServer(Faults(batch_hold=True, p_batch_row_error=0.2, seed=4)).start()
    try:
        batch = {"mode": "always", "max_wait_s": 0.5, **FAST_POLLING}
        config = write_config(corpus, embedding={"kind": "gemini", "dim": 16, "base_url": srv.base_url,
                                                 "batch": batch})
        with pytest.raises(BatchPendingError, match="still JOB_STATE_RUNNING"):
            ingest(config_path=str(config))
        assert srv.traffic.calls["asyncBatchEmbedContent"] == 1

        srv.faults = Faults(p_batch_row_error=0.2, seed=4)
        summary = ingest(config_path=str(config))
        assert srv.traffic.calls["asyncBatchEmbedContent"] == 1, "resumed, not submitted again"
        job = srv.jobs["batches/job1"]
        titles = {r["request"].get("title") for r in job.requests}
        assert len(titles) > 1 and None not in titles, "each request carries its own document title"
        online = sum(srv.traffic.embed_batch_sizes)
        assert 0 < online < len(job.requests), "only the rows the job failed were embedded online"
        assert summary["embed_batch_jobs"] == 1 and summary["texts_embedded"] == summary["chunks_added"]

        # The same vectors as an all-online build of the same corpus.
        online_config = write_config(corpus, name="online.yaml", store="online",
                                     embedding={"kind": "gemini", "dim": 16, "base_url": srv.base_url,
                                                "batch": {"mode": "never"}})
        ingest(config_path=str(online_config))
        def vectors(cfg_path):
            table = lancedb.connect(str(load_config(cfg_path).store.uri)).open_table("chunks").to_arrow()
            return {c: [round(x, 5) for x in v] for c, v in zip(table["chunk_id"].to_pylist(),
                                                                 table["vector"].to_pylist())}
        assert vectors(config) == vectors(online_config)
    finally:
        srv.stop()


def test_a_run_killed_while_waiting_for_its_batch_job_is_resumed_by_the_next(write_config, markdown_corpus,
                                                                          monkeypatch):
    """A real SIGKILL of the flow's process while the job runs: the next run collects that same job."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from prefect.settings import PREFECT_API_URL

    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    srv = GeminiServer(Faults(batch_hold=True)).start()
    try:
        # The job is the point, not validation: the killed process need not load great-expectations (~5 s of CPU).
        config = _config(write_config, markdown_corpus, srv, quality={"enabled": False}, mode="always")
        jobs = Path(load_config(config).store.artifacts) / BATCH_JOBS_DIR
        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": str(root)}
        proc = subprocess.Popen([sys.executable, "-c", f"from flows.ingest import ingest; ingest(config_path={str(config)!r})"],
                                cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not list(jobs.glob("*.json")) and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
            assert list(jobs.glob("*.json")), "the job was recorded while the run waited for it"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert srv.traffic.calls["batchGenerateContent"] == 1

        srv.faults = Faults()
        resumed = ingest(config_path=str(config))
        assert srv.traffic.calls["batchGenerateContent"] == 1, "the killed run's job was collected, not paid twice"
        assert resumed["texts_enriched"] == resumed["chunks_added"] > 0 and all(_enrichments(config))
    finally:
        srv.stop()


def test_a_corrupt_batch_job_record_is_reported_with_its_file(tmp_path):
    from providers.gemini_batch import JobLedger
    from schemas.errors import StoreError

    (tmp_path / "batches_job1.json").write_text('{"name": "batches/job1", "kind": ')
    with pytest.raises(StoreError, match=r"batches_job1.json: unreadable Gemini batch job record"):
        JobLedger(tmp_path).open_jobs("enrich")
