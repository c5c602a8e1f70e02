"""Gemini Batch Mode through the real google-genai client: half price, resumed after an interruption, failed rows resent."""

from __future__ import annotations

import json

import lancedb
import pytest

from flows.ingest import BATCH_JOBS_DIR, ingest
from schemas.config import DEFAULT_PRICES, load_config
from schemas.errors import BatchPendingError
from tests.gemini_server import Faults, GeminiServer

pytestmark = pytest.mark.usefixtures("prefect_harness")
KEY = "AIza-batch-key-must-never-leak-7"
FAST_POLLING = {"poll_initial_s": 0.05, "poll_max_s": 0.2}


def _config(write_config, corpus, srv: GeminiServer, **batch):
    return write_config(corpus, enrichment={"provider": "gemini", "kind": "keywords", "base_url": srv.base_url,
                                            "batch": {**FAST_POLLING, **batch}})


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
        assert not list((load_config(config).store.artifacts / BATCH_JOBS_DIR).glob("*.json")), "job collected"

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
        records = [json.loads(p.read_text()) for p in (cfg.store.artifacts / BATCH_JOBS_DIR).glob("*.json")]
        assert [r["name"] for r in records] == ["batches/job1"], "the job's name outlived the run"
        assert KEY not in json.dumps(records)
        assert not (cfg.store.uri / "chunks.lance").exists(), "nothing was committed by the interrupted run"

        srv.faults = Faults()  # the job finishes while no run is watching
        resumed = ingest(config_path=str(config))
        assert srv.traffic.calls["batchGenerateContent"] == 1, "resumed, not paid for twice"
        assert resumed["llm_batch_jobs"] == 1 and resumed["texts_enriched"] == resumed["chunks_added"] > 0
        assert all(_enrichments(config)) and srv.traffic.calls.get("generateContent", 0) == 0
        assert not list((cfg.store.artifacts / BATCH_JOBS_DIR).glob("*.json"))
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
