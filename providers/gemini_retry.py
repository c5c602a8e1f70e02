"""Retries and quotas for Gemini calls: backoff that never undercuts the server's retry delay, and a shared limiter."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import TypeVar

import httpx
import tenacity
from google.genai import errors as genai_errors
from pyrate_limiter import Limiter, Rate

RETRY_STATUSES = (408, 429, 500, 502, 503, 504)
_HTTP_MODULES = [httpx]
try:  # google-genai sends through httpx2 when it is installed, through httpx otherwise
    import httpx2

    _HTTP_MODULES.append(httpx2)
except ImportError:  # pragma: no cover - depends on google-genai's extras
    pass
# Transport failures worth another try: time-outs, dropped connections, half-sent answers.
TRANSIENT = tuple(getattr(m, n) for m in _HTTP_MODULES
                  for n in ("TimeoutException", "NetworkError", "RemoteProtocolError"))
# Every transport failure: after the retries, one of these fails the chunk, not the run.
TRANSPORT_ERRORS = tuple(m.HTTPError for m in _HTTP_MODULES)
MAX_SERVER_DELAY_S = 300.0  # a longer RetryInfo delay is capped: past that the call is better counted failed

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """Tell whether a failed call may succeed when tried again."""
    if isinstance(exc, genai_errors.APIError):
        return exc.code in RETRY_STATUSES
    return isinstance(exc, TRANSIENT)


# Answers that no other input would change: the key, the project's permission, the model's name. Gemini answers
# an invalid key and a billing or region problem with 400 too (API_KEY_INVALID, FAILED_PRECONDITION).
ACCOUNT_STATUSES = (401, 403, 404)
_ACCOUNT_400 = ("API_KEY_INVALID", "FAILED_PRECONDITION", "API key not valid")


def is_outage(exc: BaseException) -> bool:
    """Tell whether a call that failed for good would fail for every input alike: a provider outage.

    Retries spent on a transient error (5xx, 429 quota, time-out, dropped connection), or an account error.
    Anything else (a 400 for one input, a local model raising on one text) is that input's own failure.
    """
    if isinstance(exc, genai_errors.APIError):
        account = exc.code == 400 and any(m in f"{exc.status} {exc.message} {exc.details}" for m in _ACCOUNT_400)
        return exc.code in RETRY_STATUSES or exc.code in ACCOUNT_STATUSES or account
    return isinstance(exc, TRANSPORT_ERRORS)


def _seconds(value: object) -> float | None:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)s?\s*", str(value))
    return float(match.group(1)) if match else None


def server_retry_delay(exc: BaseException) -> float | None:
    """Return the delay the server asked for: RetryInfo.retryDelay in the error body, else Retry-After."""
    if not isinstance(exc, genai_errors.APIError):
        return None
    body = exc.details if isinstance(exc.details, dict) else {}
    error = body.get("error", body) if isinstance(body, dict) else {}
    for detail in error.get("details") or () if isinstance(error, dict) else ():
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.RetryInfo"):
            delay = _seconds(detail.get("retryDelay", ""))
            if delay is not None:
                return delay
    headers = getattr(exc.response, "headers", None) or {}
    return _seconds(headers.get("retry-after", "")) if headers.get("retry-after") else None


class _Wait(tenacity.wait.wait_base):
    """Exponential backoff with jitter, raised to the server's retry delay when it names one."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self._backoff = tenacity.wait_exponential_jitter(initial=initial_s, max=max_s, jitter=initial_s)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        backoff = self._backoff(retry_state)
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        asked = server_retry_delay(exc) if exc is not None else None
        return backoff if asked is None else max(backoff, min(asked, MAX_SERVER_DELAY_S))


class Retrier:
    """Runs calls with retries on 429, 5xx and time-outs; counts the retries (thread-safe)."""

    def __init__(self, attempts: int = 5, initial_delay_s: float = 1.0, max_delay_s: float = 60.0) -> None:
        self._attempts, self._wait = attempts, _Wait(initial_delay_s, max_delay_s)
        self._lock = threading.Lock()
        self.retries = 0

    def _count(self, _state: tenacity.RetryCallState) -> None:
        with self._lock:
            self.retries += 1

    def __call__(self, fn: Callable[[], T]) -> T:
        """Call fn until it succeeds, fails for good, or the attempts are spent (then its error is raised)."""
        retrying = tenacity.Retrying(stop=tenacity.stop_after_attempt(self._attempts),
                                     retry=tenacity.retry_if_exception(is_transient), wait=self._wait,
                                     before_sleep=self._count, reraise=True)
        return retrying(fn)


class Quota:
    """Requests and tokens per window, shared by every thread of one client (blocks until there is room)."""

    def __init__(self, requests_per_minute: int | None, tokens_per_minute: int | None,
                 window_ms: int = 60_000) -> None:
        self._requests = Limiter(Rate(requests_per_minute, window_ms)) if requests_per_minute else None
        self._tokens = Limiter(Rate(tokens_per_minute, window_ms)) if tokens_per_minute else None

    def acquire(self, tokens: int) -> None:
        """Wait for room for one request of this many tokens."""
        if self._requests is not None:
            self._requests.try_acquire("requests")
        if self._tokens is not None:
            self._tokens.try_acquire("tokens", weight=max(1, tokens))
