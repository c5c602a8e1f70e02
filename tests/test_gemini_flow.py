"""The ingest flow with Gemini embeddings: the real google-genai client against the local test server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lancedb
import pytest

from flows.ingest import ingest
from providers.embedders import HashingEmbedder
from query import search
from schemas.config import load_config
from schemas.errors import EmbedderMismatchError
from tests.gemini_server import Faults, GeminiServer

pytestmark = pytest.mark.usefixtures("prefect_harness")
KEY = "AIza-test-key-must-never-leak-0123"


@pytest.fixture
def server() -> Iterator[GeminiServer]:
    srv = GeminiServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def gemini_config(corpus: Path, write_config, server: GeminiServer) -> Path:
    return write_config(corpus, embedding={"kind": "gemini", "dim": 32, "base_url": server.base_url})


def test_gemini_embeds_once_then_only_what_changed(gemini_config, corpus, server, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    first = ingest(config_path=str(gemini_config))
    texts = sum(server.traffic.embed_batch_sizes)
    assert first["texts_embedded"] == texts == first["chunks_added"] > 0
    assert max(server.traffic.embed_batch_sizes) <= 100

    again = ingest(config_path=str(gemini_config))
    assert again["texts_embedded"] == 0 and sum(server.traffic.embed_batch_sizes) == texts

    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text().replace("2% hardener", "3% hardener"))
    edited = ingest(config_path=str(gemini_config))
    assert edited["docs_changed"] == 1
    assert edited["texts_embedded"] == edited["chunks_added"] == sum(server.traffic.embed_batch_sizes) - texts

    before = server.traffic.calls["batchEmbedContents"]
    hits = search("gelcoat hardener", k=2, config=gemini_config)
    assert len(hits) == 2 and server.traffic.calls["batchEmbedContents"] == before + 1
    with pytest.raises(EmbedderMismatchError, match="embedded with 'gemini:gemini-embedding-001:dim=32"):
        search("gelcoat hardener", config=gemini_config, embedder=HashingEmbedder(dim=32))


def test_api_key_appears_in_no_artifact(gemini_config, server, monkeypatch, caplog):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    summary = ingest(config_path=str(gemini_config))
    assert server.traffic.api_keys == {KEY}, "the key reached the server"
    cfg = load_config(gemini_config)
    for path in [*Path(cfg.store.artifacts).rglob("*"), *Path(cfg.store.uri).rglob("*")]:
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in caplog.text and KEY not in str(summary)


def test_without_a_key_the_local_model_is_used_and_the_report_says_so(gemini_config, server, monkeypatch):
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    summary = ingest(config_path=str(gemini_config))
    assert any("no GEMINI_API_KEY or GOOGLE_API_KEY" in n for n in summary["notices"])
    assert server.traffic.calls == {} and summary["texts_embedded"] > 0
    hit = search("How do I winterize the outboard engine?", k=1, config=gemini_config)[0]
    assert hit.doc_id == "sample:guides/boat-maintenance.md"


def test_failed_enrichments_are_indexed_marked_and_retried_next_run(corpus, write_config, monkeypatch):
    """Malformed answers leave chunks indexed on their text alone; the next run asks only for those."""
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    srv = GeminiServer(Faults(p429=0.05, p500=0.02, p_malformed=0.7, retry_delay_s=0, seed=5)).start()
    try:
        config = write_config(corpus, enrichment={"provider": "gemini", "kind": "questions",
                                                  "base_url": srv.base_url})
        first = ingest(config_path=str(config))
        failed = first["texts_enrich_failed"]
        assert failed > 0 and first["texts_enriched"] + failed == first["chunks_added"]
        rows = lancedb.connect(str(load_config(config).store.uri)).open_table("chunks").to_arrow().to_pylist()
        assert len(rows) == first["chunks_added"] == len({r["chunk_id"] for r in rows})
        assert sum(r["enrichment"] is None for r in rows) == failed

        srv.faults = Faults()  # the service recovers
        calls = srv.traffic.calls.get("generateContent", 0)
        second = ingest(config_path=str(config))
        assert second["texts_enriched"] == failed and second["texts_enrich_failed"] == 0
        assert srv.traffic.calls["generateContent"] - calls == failed
        assert second["texts_embedded"] == failed, "only the newly enriched inputs are embedded again"
        third = ingest(config_path=str(config))
        assert (third["texts_enriched"], third["texts_embedded"], third["docs_changed"]) == (0, 0, 0)
    finally:
        srv.stop()
