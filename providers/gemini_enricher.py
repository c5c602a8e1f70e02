"""Chunk enrichment with Gemini: structured JSON answers, parsed strictly, retried when malformed."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from pydantic import BaseModel, ValidationError

from providers.gemini_batch import (
    JobLedger,
    JobRecord,
    Polling,
    outcomes,
    submit,
    wait_for,
)
from providers.gemini_retry import TRANSPORT_ERRORS, Quota, Retrier
from providers.tokenizer import count_tokens
from providers.types import EnrichInput, Usage
from schemas.errors import ConfigError
from schemas.llm import ANSWERS, render_answer


@dataclass(frozen=True)
class Prompt:
    """A versioned prompt template; the version is part of every enrichment cache key."""

    name: str
    version: str
    system: str
    template: str

    def render(self, item: EnrichInput, document: str | None = None) -> str:
        """Fill the template for one chunk."""
        return self.template.format(title=item.title or "", heading_path=" > ".join(item.heading_path),
                                    text=item.text, document=document or "")


def load_prompt(path: Path) -> Prompt:
    """Read a prompt file (version, system, template); errors name the file and the key."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        msg = f"{path}: cannot read prompt: {exc}"
        raise ConfigError(msg) from None
    for key in ("version", "template"):
        if not isinstance(data, dict) or key not in data:
            msg = f"{path}: {key}: missing"
            raise ConfigError(msg)
    return Prompt(path.stem, str(data["version"]), str(data.get("system") or ""), str(data["template"]))


@dataclass(frozen=True)
class Enrichment:
    """One chunk's enrichment, or why it failed."""

    text: str | None
    error: str | None = None


class GeminiEnricher:
    """Enriches chunks with one Gemini generateContent call each, answer shaped by a response schema."""

    def __init__(self, *, kind: str, prompt: Prompt, api_key: str, model: str = "gemini-2.5-flash",
                 system: str | None = None, base_url: str | None = None, timeout_ms: int = 60_000, attempts: int = 5,
                 initial_delay_s: float = 1.0, malformed_retries: int = 2, temperature: float = 0.0,
                 max_in_flight: int = 8, requests_per_minute: int | None = None,
                 tokens_per_minute: int | None = None, window_ms: int = 60_000) -> None:
        if kind not in ANSWERS:
            msg = f"enrichment kind '{kind}' is not one of {sorted(ANSWERS)}"
            raise ConfigError(msg)
        # The client's own retries ignore the server's retry delay, so ours replace them.
        self._client = genai.Client(api_key=api_key, http_options=types.HttpOptions(base_url=base_url,
                                                                                    timeout=timeout_ms))
        self._retrier = Retrier(attempts, initial_delay_s)
        system = prompt.system if system is None else system
        self._answer: type[BaseModel] = ANSWERS[kind]
        self._prompt, self._model, self._retries = prompt, model, malformed_retries
        self._config = types.GenerateContentConfig(
            system_instruction=system or None, temperature=temperature,
            response_mime_type="application/json", response_schema=self._answer)
        self.kind = kind
        self.usage = Usage()
        self._lock = threading.Lock()
        self._in_flight = max_in_flight
        # One limiter per enricher, shared by all its threads: requests and prompt tokens per window.
        self._quota = Quota(requests_per_minute, tokens_per_minute, window_ms)
        # The system message is part of the prompt: an override changes the fingerprint as a new version would.
        sys_hash = hashlib.sha256(system.encode()).hexdigest()[:8] if system != prompt.system else ""
        self.fingerprint = (f"gemini-{kind}:{model}:prompt={prompt.name}@v{prompt.version}"
                            f"{':system=' + sys_hash if sys_hash else ''}:temperature={temperature}")

    def _count(self, response: types.GenerateContentResponse) -> None:
        with self._lock:
            self._add_usage(response.usage_metadata)

    def _add_usage(self, meta: types.GenerateContentResponseUsageMetadata | None, *, batch: bool = False) -> None:
        if meta is None:
            return
        prompt, output = meta.prompt_token_count or 0, meta.candidates_token_count or 0
        cached = meta.cached_content_token_count or 0
        self.usage.prompt_tokens += prompt
        self.usage.output_tokens += output
        self.usage.cached_tokens += cached
        if batch:
            self.usage.batch_prompt_tokens += prompt
            self.usage.batch_output_tokens += output
            self.usage.batch_cached_tokens += cached

    def _parse(self, response: types.GenerateContentResponse | None, error: str | None) -> Enrichment:
        if response is None:
            return Enrichment(None, error or "no answer")
        try:
            return Enrichment(render_answer(self._answer.model_validate_json(response.text or "")))
        except ValidationError as exc:
            self.usage.malformed += 1
            return Enrichment(None, f"malformed answer: {exc.errors()[0]['msg']}")

    def _collect(self, batch: types.BatchJob, job: JobRecord, results: dict[str, Enrichment]) -> None:
        for key, outcome in outcomes(batch, job).items():
            if outcome.response is not None:
                self.usage.batch_requests += 1
                self._add_usage(outcome.response.usage_metadata, batch=True)
            results[key] = self._parse(outcome.response, outcome.error)
        self.usage.batch_jobs += 1

    def enrich_batch(self, items: list[EnrichInput], documents: list[str | None], keys: list[str],
                     ledger: JobLedger, polling: Polling,
                     on_state: Callable[[JobRecord], None] = lambda _job: None,
                     keep: Callable[[list[str], list[str | None]], None] | None = None) -> list[str | None]:
        """Enrich through Gemini Batch Mode: resume the ledger's open jobs for these keys, submit the rest as one.

        A row the job failed, or answered malformed, comes back None: marked, and asked again by the next run.
        keep gets each collected job's keys and answers before the job leaves the ledger (the model cache): a
        run killed after that never submits or pays for the job again.
        """
        wanted = {k: (i, d) for k, i, d in zip(keys, items, documents)}
        results: dict[str, Enrichment] = {}
        for job in ledger.open_jobs("enrich"):
            if not wanted.keys() & set(job.keys):
                continue  # another enricher's or an older run's rows: left for whoever needs them
            on_state(job)
            self._finish(wait_for(self._client, job, ledger, polling, on_state), job, results, ledger, keep)
        rest = {k: self._inlined(k, *wanted[k]) for k in wanted if k not in results}
        if rest:
            job = submit(self._client, self._model, "enrich", rest, ledger, f"inlet-{self.kind}-{len(rest)}-rows")
            on_state(job)
            self._finish(wait_for(self._client, job, ledger, polling, on_state), job, results, ledger, keep)
        failed = [r.error for k, r in results.items() if k in wanted and r.error]
        self.usage.failures += len(failed)
        self.usage.errors.extend(e for e in failed if e)
        return [results[k].text for k in keys]

    def _finish(self, batch: types.BatchJob, job: JobRecord, results: dict[str, Enrichment], ledger: JobLedger,
                keep: Callable[[list[str], list[str | None]], None] | None) -> None:
        """Collect a finished job's answers, hand them to keep, then close the job in the ledger."""
        self._collect(batch, job, results)
        if keep is not None:
            done = [k for k in job.keys if k in results]
            keep(done, [results[k].text for k in done])
        ledger.close(job)

    def _inlined(self, key: str, item: EnrichInput, document: str | None) -> types.InlinedRequest:
        return types.InlinedRequest(contents=self._prompt.render(item, document),
                                    metadata={"key": key}, config=self._config)

    def enrich(self, items: list[EnrichInput], documents: list[str | None] | None = None) -> list[str | None]:
        """Enrich each item; None where Gemini failed (its error is kept in usage.errors)."""
        docs = documents or [None] * len(items)
        with ThreadPoolExecutor(max_workers=self._in_flight) as pool:  # bounds requests in flight
            results = list(pool.map(self.enrich_one, items, docs))
        with self._lock:
            self.usage.errors.extend(r.error for r in results if r.error)
            self.usage.retries = self._retrier.retries
        return [r.text for r in results]

    def prompt_tokens(self, item: EnrichInput, document: str | None = None) -> int:
        """Estimate the prompt tokens of one chunk's request (cl100k as a proxy for Gemini's tokenizer)."""
        return count_tokens(self._config.system_instruction or "") + count_tokens(self._prompt.render(item, document))

    def _generate(self, contents: str) -> types.GenerateContentResponse:
        self._quota.acquire(count_tokens(contents))  # every attempt, retries included, counts against the quota
        with self._lock:
            self.usage.calls += 1
        return self._client.models.generate_content(model=self._model, contents=contents, config=self._config)

    def enrich_one(self, item: EnrichInput, document: str | None = None) -> Enrichment:
        """Ask Gemini for one chunk's enrichment; a malformed answer is asked again, then recorded as failed."""
        contents = self._prompt.render(item, document)
        last = ""
        for _ in range(self._retries + 1):
            try:
                response = self._retrier(lambda: self._generate(contents))
            except (genai_errors.APIError, *TRANSPORT_ERRORS) as exc:  # retries spent: this chunk fails, not the run
                with self._lock:
                    self.usage.failures += 1
                return Enrichment(None, f"request failed: {type(exc).__name__} {getattr(exc, 'code', '')}".strip())
            self._count(response)
            with self._lock:
                parsed = self._parse(response, None)
            if parsed.error is None:
                return parsed
            last = parsed.error
        with self._lock:
            self.usage.failures += 1
        return Enrichment(None, last)
