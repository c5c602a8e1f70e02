"""`inlet plan` (the ingest flow's dry run) and the cost ceiling: what a run would do and cost, before it does."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import lancedb
import pyarrow as pa
import pytest

from flows.ingest import ingest
from schemas.arrow import DOCUMENTS_SCHEMA, PLAN_COUNTS
from schemas.config import load_config
from schemas.errors import CostCeilingError
from tasks.estimate import ESTIMATE_SCHEMA
from tasks.plan_report import cost_causes, model_mode, seconds_per_document
from tests.gemini_server import GeminiServer

KEY = "AIza-plan-key-00000000000000000000"
PROMPTS = Path(__file__).resolve().parent.parent / "configs" / "prompts"
FAST_POLLING = {"poll_initial_s": 0.05, "poll_max_s": 0.2}
# What a plan counts exactly, and the run that follows reports: its documents, texts, calls and jobs, and the
# embedding tokens (Inlet counts those itself). Prompt and output tokens only Gemini reports: estimated.
EXACT = ("docs_new", "docs_changed", "docs_deleted", "docs_refreshed", "docs_quarantined", "docs_extracted",
         "docs_from_kept", "texts_enriched",
         "texts_enrich_cached", "texts_embedded", "texts_embed_cached", "llm_calls", "llm_batch_jobs",
         "llm_batch_requests", "embed_calls", "embed_batch_jobs")


@pytest.fixture
def server() -> Iterator[GeminiServer]:
    srv = GeminiServer().start()
    yield srv
    srv.stop()


def _config(write_config, corpus: Path, server: GeminiServer, batch: dict | None = None, **enrichment) -> Path:
    return write_config(corpus, enrichment={"provider": "gemini", "kind": "questions", "base_url": server.base_url,
                                            "batch": {**FAST_POLLING, **(batch or {})}, **enrichment},
                        embedding={"kind": "gemini", "dim": 32, "base_url": server.base_url,
                                   "batch": {**FAST_POLLING, **(batch or {})}})


def _tables(config: Path) -> list[str]:
    return list(lancedb.connect(str(load_config(config).store.uri)).table_names())


def _same_counts(plan: dict, run: dict) -> None:
    assert {k: plan[k] for k in EXACT} == {k: run[k] for k in EXACT}


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_plan_calls_no_model_writes_nothing_and_counts_what_the_next_run_does(write_config, corpus, server,
                                                                              monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    config = _config(write_config, corpus, server)
    plan = ingest(config_path=str(config), dry_run=True)
    assert server.traffic.calls == {}, "a plan calls no model"
    assert _tables(config) == [], "a plan writes nothing to the store"
    assert plan["docs_new"] == 5 and plan["texts_enriched"] == plan["llm_calls"] > 0 and plan["cost_usd"] > 0
    assert plan["model_mode"] == "online" and plan["causes"][0]["cause"] == "new documents"
    assert plan["estimated_seconds"] is None, "no earlier run to estimate the time from"
    first = ingest(config_path=str(config))
    _same_counts(plan, first)
    assert plan["embed_tokens"] > 0 and plan["chunks"] == first["chunks_added"]

    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text().replace("2% hardener", "3% hardener"))
    calls = dict(server.traffic.calls)
    plan = ingest(config_path=str(config), dry_run=True)
    assert server.traffic.calls == calls
    run = ingest(config_path=str(config))
    _same_counts(plan, run)
    assert plan["docs_changed"] == 1 and plan["texts_enrich_cached"] > 0 and plan["estimated_seconds"] is not None
    assert plan["causes"] == [{"cause": "changed documents", "documents": 1, "texts_enriched": 1,
                               "texts_embedded": 1, "cost_usd": plan["cost_usd"]}]
    # Tokens: the calibrated prompt estimate and the enricher's past answers put the cost within a tenth here;
    # the unchanged chunks' embedding inputs are known, so only the new enrichment's share is estimated.
    assert plan["cost_usd"] == pytest.approx(run["cost_usd"], rel=0.1)
    assert plan["embed_tokens"] == pytest.approx(run["embed_tokens"], rel=0.1)


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_plan_counts_batch_mode_jobs_as_the_run_then_submits_them(write_config, corpus, server, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    config = _config(write_config, corpus, server, batch={"mode": "always"})
    plan = ingest(config_path=str(config), dry_run=True)
    assert plan["model_mode"] == "batch mode" and plan["llm_calls"] == plan["embed_calls"] == 0
    assert plan["llm_batch_jobs"] == 1 and plan["llm_batch_requests"] == plan["texts_enriched"] > 0
    run = ingest(config_path=str(config))
    _same_counts(plan, run)
    assert run["llm_batch_jobs"] == 1 and run["embed_batch_jobs"] == 1

    # With the enricher's answers in the cache, the estimate of an edit's Batch Mode bill is close.
    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text().replace("2% hardener", "3% hardener"))
    plan = ingest(config_path=str(config), dry_run=True)
    run = ingest(config_path=str(config))
    _same_counts(plan, run)
    assert plan["llm_batch_jobs"] == run["llm_batch_jobs"] == 1
    assert plan["cost_usd"] == pytest.approx(run["cost_usd"], rel=0.1)


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_a_cost_ceiling_stops_a_prompt_version_bump_before_any_generate_call(write_config, corpus, server,
                                                                             monkeypatch, tmp_path):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    prompt = tmp_path / "questions.yaml"
    prompt.write_text((PROMPTS / "questions.yaml").read_text())
    config = _config(write_config, corpus, server, prompt=str(prompt))
    first = ingest(config_path=str(config), max_cost_usd=1.0)  # well within: the run goes ahead
    assert first["texts_enriched"] > 0
    store = lancedb.connect(str(load_config(config).store.uri))
    version = store.open_table("chunks").version
    calls = dict(server.traffic.calls)

    prompt.write_text(prompt.read_text().replace("version: 1", "version: 2"))
    with pytest.raises(CostCeilingError) as stopped:
        ingest(config_path=str(config), max_cost_usd=0.0)
    message = str(stopped.value)
    assert "before any model call" in message and "above the ceiling of $0.0000" in message
    assert f"from {first['docs_new']} documents: enrichment settings changed" in message
    assert "prompt=questions@v2" in message, "the message names the change that costs"
    assert server.traffic.calls == calls, "no generateContent and no embedding call was made"
    assert store.open_table("chunks").version == version, "nothing was written"

    allowed = ingest(config_path=str(config), max_cost_usd=0.0, allow_cost=True)
    assert allowed["docs_refreshed"] == first["docs_new"] and allowed["texts_enriched"] == first["texts_enriched"]


def test_cost_causes_group_documents_by_why_they_change_costliest_first():
    documents = pa.Table.from_pylist(
        [{"doc_id": d, "source": "s", "path": d, "uri": d, "size": 1, "mtime_ns": 1, "meta_hash": "h", "change": c,
          "reason": r} for d, c, r in [("a", "new", None), ("b", "changed", "content"), ("c", "unchanged",
                                                                                       "enrichment"),
                                       ("d", "new", None)]], schema=DOCUMENTS_SCHEMA)
    estimates = pa.Table.from_pylist([{"doc_id": "a", "texts_enriched": 2, "texts_embedded": 2, "cost_usd": 0.1},
                                      {"doc_id": "b", "texts_enriched": 1, "texts_embedded": 1, "cost_usd": 0.05},
                                      {"doc_id": "c", "texts_enriched": 9, "texts_embedded": 9, "cost_usd": 0.5},
                                      {"doc_id": "d", "texts_enriched": 1, "texts_embedded": 1, "cost_usd": 0.1}],
                                     schema=ESTIMATE_SCHEMA)
    causes = cost_causes(documents, estimates)
    assert [(c["cause"].split(":")[0], c["documents"], c["texts_enriched"], c["cost_usd"]) for c in causes] == [
        ("enrichment settings changed (prompt, model or kind)", 1, 9, 0.5), ("new documents", 2, 3, 0.2),
        ("changed documents", 1, 1, 0.05)]


def test_the_time_estimate_is_the_median_pace_of_recent_runs_with_work():
    start = datetime(2026, 11, 1, tzinfo=UTC)
    runs = pa.Table.from_pylist([
        {"status": "completed", "started_at": start, "finished_at": start + timedelta(seconds=s),
         "docs_new": n, "docs_changed": 0, "docs_refreshed": 0} for s, n in [(10, 10), (40, 10), (20, 10), (5, 0)]])
    assert seconds_per_document(runs) == (2.0, 3), "the no-op run is left out"
    assert seconds_per_document(None) is None


def test_model_mode_names_how_the_models_are_reached():
    assert model_mode({}) == "none"
    assert model_mode({"llm_calls": 3}) == "online"
    assert model_mode({"embed_batch_jobs": 1}) == "batch mode"
    assert model_mode({"llm_calls": 3, "llm_batch_jobs": 1}) == "online and batch mode"


def test_plan_counts_are_named_as_the_run_reports_them():
    from schemas.arrow import RUN_COUNTS

    assert set(PLAN_COUNTS) - set(RUN_COUNTS) == {"docs_held", "chunks"}


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_a_store_from_before_the_model_cache_is_planned_as_the_run_seeds_it(write_config, corpus, tmp_path):
    config = write_config(corpus, embedding={"kind": "hashing", "dim": 64})
    ingest(config_path=str(config))
    cfg = load_config(config)
    lancedb.connect(str(cfg.store.uri)).drop_table(cfg.store.cache_table)  # as an older Inlet left its stores
    config = write_config(corpus, embedding={"kind": "hashing", "dim": 64},  # every embedding input changes
                          enrichment={"delimiter": "\n---\n"})
    plan = ingest(config_path=str(config), dry_run=True)
    assert cfg.store.cache_table not in _tables(config), "the plan seeded nothing"
    run = ingest(config_path=str(config))
    _same_counts(plan, run)
    assert run["texts_enrich_cached"] > 0 and run["texts_enriched"] == 0, "the run's seeded cache served them"


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_vectors_that_would_not_fit_the_table_are_refused_before_any_batch(write_config, corpus):
    from schemas.errors import EmbedderMismatchError

    config = write_config(corpus, embedding={"kind": "hashing", "dim": 64})
    ingest(config_path=str(config))
    runs = Path(load_config(config).store.artifacts)
    before = set(runs.glob("*/batches"))
    config = write_config(corpus, embedding={"kind": "hashing", "dim": 32})
    for dry_run in (True, False):
        with pytest.raises(EmbedderMismatchError, match="holds 64-dim vectors but this config embeds 32-dim"):
            ingest(config_path=str(config), dry_run=dry_run)
    assert set(runs.glob("*/batches")) == before, "refused before any batch was extracted"


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_a_plan_counts_each_index_variant_as_its_run_does(write_config, corpus):
    config = write_config(corpus, variants={"small": {"chunking": {"max_tokens": 60, "overlap_tokens": 10}}})
    plan = ingest(config_path=str(config), dry_run=True)
    assert _tables(config) == [], "a plan writes no variant's tables either"
    run = ingest(config_path=str(config))
    _same_counts(plan, run)
    _same_counts(plan["variants"]["small"], run["variants"]["small"])
    assert plan["variants"]["small"]["chunks"] == run["variants"]["small"]["chunks_added"] > plan["chunks"]


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_a_plan_and_a_run_on_the_process_runner_with_pdf_docx_and_html_end_and_agree(write_config, corpus):
    # Worker processes end without atexit: their extraction workers (non-Markdown documents) used to hold them.
    # Validation is not the point: the run's two workers need not load great-expectations (~5 s of CPU each);
    # tests/test_runners.py validates in such workers.
    config = write_config(corpus, execution={"task_runner": "process", "workers": 2, "batch_docs": 2},
                          variants={"small": {"chunking": {"max_tokens": 60, "overlap_tokens": 10}}},
                          quality={"enabled": False})
    plan = ingest(config_path=str(config), dry_run=True)
    run = ingest(config_path=str(config))
    assert run["docs_new"] == 5 and run["docs_quarantined"] == 0
    _same_counts(plan, run)
    _same_counts(plan["variants"]["small"], run["variants"]["small"])
