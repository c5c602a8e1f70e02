"""The ingest flow with Gemini enrichment and embeddings: calls, cache, prompt versions, cost and keys."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lancedb
import pytest

from flows.ingest import ingest
from query import search
from schemas.arrow import RUN_USAGE, RUNS_SCHEMA
from schemas.config import DEFAULT_PRICES, load_config
from tests.conftest import run_artifact
from tests.gemini_server import Faults, GeminiServer

pytestmark = pytest.mark.usefixtures("prefect_harness")
KEY = "AIza-enrich-key-must-never-leak-42"
PROMPTS = Path(__file__).resolve().parent.parent / "configs" / "prompts"


@pytest.fixture
def server() -> Iterator[GeminiServer]:
    srv = GeminiServer().start()
    yield srv
    srv.stop()


def _config(write_config, corpus: Path, server: GeminiServer, **enrichment) -> Path:
    return write_config(corpus, enrichment={"provider": "gemini", "kind": "questions", "base_url": server.base_url,
                                            **enrichment},
                        embedding={"kind": "gemini", "dim": 32, "base_url": server.base_url})


def _chunks(config: Path) -> list[dict]:
    db = lancedb.connect(str(load_config(config).store.uri))
    return db.open_table("chunks").to_arrow().select(["chunk_id", "enricher", "enrichment"]).to_pylist()


def _generate_calls(server: GeminiServer) -> int:
    return server.traffic.calls.get("generateContent", 0)


def test_rerun_calls_no_model_and_an_edit_calls_it_for_new_chunk_texts_only(write_config, corpus, server,
                                                                              monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    config = _config(write_config, corpus, server)
    first = ingest(config_path=str(config))
    assert first["texts_enriched"] == _generate_calls(server) == first["chunks_added"] > 0
    stored = {r["chunk_id"]: r for r in lancedb.connect(str(load_config(config).store.uri)).open_table("chunks")
              .to_arrow().select(["chunk_id", "text", "enrichment"]).to_pylist()}
    for hit in search("How do I winterize the outboard engine?", k=5, config=config):
        assert hit.text == stored[hit.chunk_id]["text"], "the answerable text is the chunk's own"
        assert stored[hit.chunk_id]["enrichment"] not in hit.text, "the enrichment is kept apart"
    calls = dict(server.traffic.calls)

    again = ingest(config_path=str(config))
    assert server.traffic.calls == calls, "a re-run makes no generateContent and no embed call"
    assert (again["llm_calls"], again["embed_calls"], again["cost_usd"]) == (0, 0, 0.0)

    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text().replace("2% hardener", "3% hardener"))
    edited = ingest(config_path=str(config))
    assert edited["docs_changed"] == 1 and edited["chunks_added"] >= 1
    assert _generate_calls(server) - calls["generateContent"] == edited["texts_enriched"] == edited["chunks_added"]
    assert edited["llm_calls"] == edited["chunks_added"] and edited["cost_saved_usd"] > 0, \
        "the edited document's unchanged chunks were served from the cache"


def test_prompt_version_bump_re_enriches_every_chunk_without_re_chunking(write_config, corpus, server, monkeypatch,
                                                                           tmp_path):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    prompt = tmp_path / "questions.yaml"
    prompt.write_text((PROMPTS / "questions.yaml").read_text())
    config = _config(write_config, corpus, server, prompt=str(prompt))
    first = ingest(config_path=str(config))
    stored = _chunks(config)
    before = {r["chunk_id"]: r["enricher"] for r in stored}
    calls = _generate_calls(server)

    # A new version with new wording: the test server's answers follow the words of the prompt.
    prompt.write_text(prompt.read_text().replace("version: 1", "version: 2") + "  Mind abbreviations.\n")
    bumped = ingest(config_path=str(config))
    run_dir = Path(load_config(config).store.artifacts) / bumped["run_id"]
    assert run_artifact(run_dir, "chunks").num_rows == 0, "nothing was chunked again"
    assert run_artifact(run_dir, "elements").num_rows == 0, "nothing was extracted again"
    assert (bumped["docs_changed"], bumped["docs_new"]) == (0, 0)
    assert bumped["docs_refreshed"] == first["docs_new"] - first["docs_quarantined"]
    assert _generate_calls(server) - calls == bumped["texts_enriched"] == len(before)
    after = {r["chunk_id"]: r["enricher"] for r in _chunks(config)}
    assert after.keys() == before.keys(), "same chunks, same ids"
    assert all("@v2" in fp for fp in after.values()) and all("@v1" in fp for fp in before.values())
    old_text = {r["chunk_id"]: r["enrichment"] for r in stored}
    changed = sum(old_text[r["chunk_id"]] != r["enrichment"] for r in _chunks(config))
    assert bumped["texts_embedded"] == changed > 0, "only enrichments that came out different are embedded again"

    calls = dict(server.traffic.calls)
    settled = ingest(config_path=str(config))
    assert server.traffic.calls == calls and settled["docs_refreshed"] == 0


@pytest.mark.parametrize("seed", [3, 4])
def test_a_faulty_service_leaves_every_chunk_enriched_or_marked_and_the_next_run_asks_for_exactly_those(
        write_config, corpus, monkeypatch, seed):
    """5% 429s, 2% 500s and 1% malformed answers: nothing lost or duplicated, failures retried next run."""
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    srv = GeminiServer(Faults(p429=0.05, p500=0.02, p_malformed=0.01, retry_delay_s=0, seed=seed)).start()
    try:
        # Two tries per request, so that some chunks do fail for good and the next run has work.
        config = _config(write_config, corpus, srv, attempts=2)
        first = ingest(config_path=str(config))
        rows = _chunks(config)
        assert len(rows) == len({r["chunk_id"] for r in rows}) == first["chunks_added"]
        failed = first["texts_enrich_failed"]
        assert first["texts_enriched"] + failed == len(rows)
        assert sum(r["enrichment"] is None for r in rows) == failed == first["llm_failures"]
        assert first["llm_retries"] > 0 and first["llm_calls"] > first["texts_enriched"]

        srv.faults = Faults()
        calls = _generate_calls(srv)
        second = ingest(config_path=str(config))
        assert _generate_calls(srv) - calls == failed == second["texts_enriched"]
        assert second["texts_enrich_failed"] == 0 and second["docs_changed"] == 0
        assert all(r["enrichment"] for r in _chunks(config)) and len(_chunks(config)) == len(rows)
    finally:
        srv.stop()


def test_tokens_and_cost_are_in_the_report_and_the_runs_table(write_config, corpus, server, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    config = _config(write_config, corpus, server)
    summary = ingest(config_path=str(config))
    assert not any("no price for" in n for n in summary["notices"])
    assert summary["llm_calls"] == _generate_calls(server)
    assert summary["llm_prompt_tokens"] > 0 and summary["llm_output_tokens"] > 0
    price = DEFAULT_PRICES["gemini-2.5-flash"]
    expected = (summary["llm_prompt_tokens"] * price.input + summary["llm_output_tokens"] * price.output) / 1e6
    assert summary["llm_cost_usd"] == pytest.approx(expected)
    assert summary["embed_calls"] == server.traffic.calls["batchEmbedContents"] and summary["embed_tokens"] > 0
    assert summary["cost_usd"] == pytest.approx(summary["llm_cost_usd"] + summary["embed_cost_usd"], abs=1e-6)
    runs = lancedb.connect(str(load_config(config).store.uri)).open_table("runs").to_arrow().to_pylist()
    assert [{k: r[k] for k in RUN_USAGE} for r in runs] == [{k: summary[k] for k in RUN_USAGE}]


def test_runs_table_of_an_older_inlet_gains_the_new_columns(write_config, corpus):
    config = write_config(corpus)
    ingest(config_path=str(config))
    db = lancedb.connect(str(load_config(config).store.uri))
    old = db.open_table("runs").to_arrow().drop_columns([*RUN_USAGE, "docs_refreshed"])
    db.drop_table("runs")
    db.create_table("runs", old)
    ingest(config_path=str(config))
    runs = db.open_table("runs").to_arrow()
    assert set(RUNS_SCHEMA.names) <= set(runs.column_names) and runs.num_rows == 2
    assert runs["cost_usd"].to_pylist() == [None, 0.0], "old runs have no figure, not a made-up zero"


def test_api_key_from_a_prefect_secret_block_never_leaks(write_config, corpus, server, monkeypatch, caplog):
    from prefect.blocks.system import Secret

    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    Secret(value=KEY).save("inlet-test-gemini-key", overwrite=True)
    config = _config(write_config, corpus, server)
    config.write_text(config.read_text() + "api_key_block: inlet-test-gemini-key\n")
    summary = ingest(config_path=str(config))
    assert server.traffic.api_keys == {KEY} and summary["texts_enriched"] > 0
    assert not any("API_KEY" in n for n in summary["notices"]), "the key was found: no fallback notice"
    cfg = load_config(config)
    for path in [*Path(cfg.store.artifacts).rglob("*"), *Path(cfg.store.uri).rglob("*")]:
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in caplog.text and KEY not in str(summary)


def test_a_model_missing_from_the_price_table_is_named_in_the_report(write_config, corpus, server, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    config = _config(write_config, corpus, server, model="gemini-9-experimental")
    summary = ingest(config_path=str(config))
    assert "no price for gemini-9-experimental in pricing.models: its cost is reported as 0" in summary["notices"]
    assert summary["llm_calls"] > 0 and summary["llm_cost_usd"] == 0.0
