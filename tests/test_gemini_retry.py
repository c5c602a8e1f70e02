"""Retries of Gemini calls: which failures are tried again, and the server's retry delay honoured."""

from __future__ import annotations

import httpx
import pytest
from google.genai import errors as genai_errors

from providers.gemini import GeminiEmbedder
from providers.gemini_enricher import GeminiEnricher, load_prompt
from providers.gemini_retry import TRANSIENT, Retrier, is_transient, server_retry_delay
from providers.types import EnrichInput
from tests.gemini_server import Faults, GeminiServer
from tests.test_gemini_enricher import ITEM, PROMPTS


def _api_error(code: int, details: list | None = None, headers: dict | None = None) -> genai_errors.APIError:
    body = {"error": {"code": code, "message": "x", "status": "S", "details": details or []}}
    return genai_errors.APIError(code, body, httpx.Response(code, headers=headers or {}))


def test_retry_delay_is_read_from_retry_info_then_retry_after():
    info = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}]
    assert server_retry_delay(_api_error(429, info)) == 37.0
    assert server_retry_delay(_api_error(503, headers={"retry-after": "4"})) == 4.0
    assert server_retry_delay(_api_error(429)) is None
    assert server_retry_delay(ValueError()) is None


def test_only_rate_limits_server_errors_and_timeouts_are_retried():
    assert is_transient(_api_error(429)) and is_transient(_api_error(503)) and is_transient(httpx.ReadTimeout("t"))
    assert not is_transient(_api_error(400)) and not is_transient(_api_error(403)) and not is_transient(ValueError())


def test_retrier_counts_retries_and_gives_up_with_the_last_error():
    retrier, calls = Retrier(attempts=3, initial_delay_s=0.001), []

    def always_busy() -> None:
        calls.append(1)
        raise _api_error(503)

    with pytest.raises(genai_errors.APIError):
        retrier(always_busy)
    assert (len(calls), retrier.retries) == (3, 2)


def test_the_server_retry_delay_is_waited_out_even_when_backoff_is_shorter():
    """A 429 asking for 1.2 s is honoured although the client's own backoff would wait 0.05 s."""
    srv = GeminiServer(Faults(first_429s=1, retry_delay_s=1.2)).start()
    try:
        enricher = GeminiEnricher(kind="keywords", prompt=load_prompt(PROMPTS / "keywords.yaml"), api_key="k",
                                  base_url=srv.base_url, initial_delay_s=0.05)
        assert enricher.enrich_one(ITEM).text
        first, second = srv.traffic.request_times
        assert second - first >= 1.2
        assert (enricher.usage.calls, enricher._retrier.retries) == (2, 1)
    finally:
        srv.stop()


def test_timed_out_requests_are_retried():
    srv = GeminiServer(Faults(p_timeout=1.0, hang_s=1.0)).start()
    try:
        embedder = GeminiEmbedder(api_key="k", base_url=srv.base_url, dim=8, timeout_ms=300, attempts=2,
                                  initial_delay_s=0.01)
        with pytest.raises(TRANSIENT):
            embedder.embed(["a text that will time out"])
        assert embedder.calls == 2 and embedder.retrier.retries == 1
        srv.faults = Faults()
        assert embedder.embed(["now it answers"]).shape == (1, 8)
    finally:
        srv.stop()


def test_enricher_marks_a_chunk_failed_after_repeated_timeouts():
    srv = GeminiServer(Faults(p_timeout=1.0, hang_s=1.0)).start()
    try:
        enricher = GeminiEnricher(kind="keywords", prompt=load_prompt(PROMPTS / "keywords.yaml"), api_key="k",
                                  base_url=srv.base_url, timeout_ms=300, attempts=2, initial_delay_s=0.01)
        assert enricher.enrich([EnrichInput("tides", "T", ())]) == [None]
        assert enricher.usage.failures == 1 and "Timeout" in enricher.usage.errors[0]
    finally:
        srv.stop()
