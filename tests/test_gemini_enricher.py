"""Gemini enrichment through the real google-genai client against the local Gemini-protocol server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.gemini_enricher import GeminiEnricher, load_prompt
from providers.types import EnrichInput
from schemas.errors import ConfigError
from tests.gemini_server import Faults, GeminiServer

PROMPTS = Path(__file__).resolve().parent.parent / "configs" / "prompts"
ITEM = EnrichInput("Flush the cooling system with fresh water before winter storage.", "Boat maintenance guide",
                   ("Engine winterization",))


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[GeminiServer]:
    srv = GeminiServer(getattr(request, "param", None)).start()
    yield srv
    srv.stop()


def _enricher(server: GeminiServer, kind: str = "keywords", **kw) -> GeminiEnricher:
    return GeminiEnricher(kind=kind, prompt=load_prompt(PROMPTS / f"{kind}.yaml"), api_key="k",
                          base_url=server.base_url, initial_delay_s=0.05, **kw)


@pytest.mark.parametrize("kind", ["keywords", "questions", "context"])
def test_each_kind_returns_parsed_structured_text(server, kind):
    enricher = _enricher(server, kind)
    result = enricher.enrich_one(ITEM, document="# Boat maintenance guide\n\nFlush the cooling system...")
    assert result.error is None and result.text
    assert enricher.usage.calls == 1 and enricher.usage.prompt_tokens > 0
    if kind == "keywords":
        assert result.text.startswith("Keywords: ")


def test_prompt_version_is_in_the_fingerprint(server, tmp_path):
    bumped = tmp_path / "keywords.yaml"
    bumped.write_text((PROMPTS / "keywords.yaml").read_text().replace("version: 1", "version: 2"))
    base = _enricher(server)
    other = GeminiEnricher(kind="keywords", prompt=load_prompt(bumped), api_key="k", base_url=server.base_url)
    assert base.fingerprint != other.fingerprint and "@v2" in other.fingerprint


@pytest.mark.parametrize("server", [Faults(p_malformed=1.0)], indirect=True)
def test_always_malformed_answer_is_retried_then_marked_failed(server):
    enricher = _enricher(server, malformed_retries=2)
    result = enricher.enrich_one(ITEM)
    assert result.text is None and result.error.startswith("malformed answer")
    assert (enricher.usage.calls, enricher.usage.malformed, enricher.usage.failures) == (3, 3, 1)


@pytest.mark.parametrize("server", [Faults(p429=0.3, p500=0.1, p_malformed=0.1, retry_delay_s=0, seed=11)],
                         indirect=True)
def test_faulty_server_still_enriches_every_chunk_or_marks_it(server):
    enricher = _enricher(server, attempts=8)
    results = [enricher.enrich_one(EnrichInput(f"Chunk {i} about tides and moorings.", "T", ())) for i in range(30)]
    assert len(results) == 30
    assert all((r.text is None) != (r.error is None) for r in results)
    assert sum(r.text is not None for r in results) >= 27


def test_prompt_file_errors_name_the_file_and_key(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("system: x\n")
    with pytest.raises(ConfigError, match=r"p.yaml: version: missing"):
        load_prompt(bad)


@pytest.mark.parametrize("server", [Faults(latency_s=0.2)], indirect=True)
def test_requests_in_flight_stay_within_the_bound(server):
    enricher = _enricher(server, max_in_flight=4)
    results = enricher.enrich([EnrichInput(f"Chunk {i} on harbour rules.", "T", ()) for i in range(16)])
    assert all(results)
    assert 2 <= server.traffic.max_in_flight <= 4, "concurrent, but never more than the bound"


def test_request_rate_never_exceeds_the_limit(server):
    """5 requests per 1-second window (minutes in production, shortened here) over 12 requests."""
    enricher = _enricher(server, max_in_flight=8, requests_per_minute=5, window_ms=1000)
    enricher.enrich([EnrichInput(f"Chunk {i} on moorings.", "T", ()) for i in range(12)])
    times = sorted(server.traffic.request_times)
    assert len(times) == 12 and times[-1] - times[0] >= 1.5
    for i, start in enumerate(times):  # half the window: arrival jitter on a loaded machine (see the embedder's test)
        assert sum(1 for t in times[i:] if t - start < 0.5) <= 5
