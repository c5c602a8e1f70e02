"""Gemini embeddings through the real google-genai client (gemini-embedding-001 by default)."""

from __future__ import annotations

import io
import json
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from google import genai
from google.genai import types

from providers.gemini_batch import JobLedger, JobRecord, Polling, wait_for
from providers.gemini_retry import Quota, Retrier
from providers.tokenizer import count_tokens

MAX_TEXTS_PER_REQUEST = 100  # the API's limit for one batchEmbedContents call
MAX_INPUT_TOKENS = 2048  # longer inputs are truncated by the model
MAX_REQUEST_CHARS = 200_000  # characters of one embedding request past its first text (tasks/estimate.py counts alike)
FULL_DIM = 3072  # gemini-embedding-001 vectors are unit length only at full size


def request_batches(texts: list[str], *, max_texts: int, max_chars: int) -> Iterator[tuple[int, int]]:
    """Yield (start, end) ranges of at most max_texts texts and, past the first, max_chars characters."""
    start = 0
    while start < len(texts):
        end, size = start, 0
        while end < len(texts) and end - start < max_texts and (end == start or size + len(texts[end]) <= max_chars):
            size += len(texts[end])
            end += 1
        yield start, end
        start = end


class GeminiEmbedder:
    """Embeds with Gemini; vectors are normalised whenever the output dimension is below 3072."""

    def __init__(self, *, api_key: str, model: str = "gemini-embedding-001", dim: int = 768,
                 task_type: str = "RETRIEVAL_DOCUMENT", base_url: str | None = None, timeout_ms: int = 60_000,
                 attempts: int = 5, initial_delay_s: float = 1.0, max_request_chars: int = MAX_REQUEST_CHARS,
                 max_in_flight: int = 4, requests_per_minute: int | None = None,
                 tokens_per_minute: int | None = None, window_ms: int = 60_000) -> None:
        # The client's own retries ignore the server's retry delay, so ours replace them.
        self._client = genai.Client(api_key=api_key, http_options=types.HttpOptions(base_url=base_url,
                                                                                    timeout=timeout_ms))
        self.retrier = Retrier(attempts, initial_delay_s)
        self.calls = 0
        self.tokens = 0  # estimated with cl100k: batchEmbedContents reports no usage
        self.batch_jobs = 0
        self._in_flight = max_in_flight
        # Embedding quotas are the embedding model's own: one limiter for this embedder's threads.
        self._quota = Quota(requests_per_minute, tokens_per_minute, window_ms)
        self._lock = threading.Lock()
        self.batch_tokens = 0  # the part of tokens sent through Batch Mode (billed at the batch discount)
        self._model, self._task, self._max_chars = model, task_type, max_request_chars
        self.dim = dim
        self.fingerprint = f"gemini:{model}:dim={dim}:task={task_type}"
        self.uses_titles = task_type == "RETRIEVAL_DOCUMENT"
        self.languages: frozenset[str] | None = None  # multilingual

    def _request(self, texts: list[str], title: str | None) -> np.ndarray:
        config = types.EmbedContentConfig(task_type=self._task, output_dimensionality=self.dim,
                                          title=(title or None) if self._task == "RETRIEVAL_DOCUMENT" else None)

        spent = sum(count_tokens(t) for t in texts)

        def call() -> types.EmbedContentResponse:
            self._quota.acquire(spent)  # every attempt, retries included
            with self._lock:
                self.calls += 1
            return self._client.models.embed_content(model=self._model, contents=texts, config=config)

        result = self.retrier(call)
        with self._lock:
            self.tokens += spent
        vectors = np.asarray([e.values for e in result.embeddings], dtype=np.float32)
        if vectors.shape != (len(texts), self.dim):
            msg = f"Gemini answered {vectors.shape} vectors for {len(texts)} texts of dimension {self.dim}"
            raise ValueError(msg)
        return vectors

    def embed(self, texts: list[str], titles: list[str | None] | None = None) -> np.ndarray:
        """Return one vector per text; texts sharing a title go out together, at most 100 a request."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        titles = titles or [None] * len(texts)
        by_title: dict[str | None, list[int]] = {}
        for i, title in enumerate(titles):
            by_title.setdefault(title, []).append(i)
        requests = []  # (rows, texts, title) of each request
        for title, rows in by_title.items():
            group = [texts[i] for i in rows]
            for start, end in request_batches(group, max_texts=MAX_TEXTS_PER_REQUEST, max_chars=self._max_chars):
                requests.append((rows[start:end], group[start:end], title))
        with ThreadPoolExecutor(max_workers=self._in_flight) as pool:  # bounds requests in flight
            answers = pool.map(lambda r: self._request(r[1], r[2]), requests)
            for (rows, _, _), vectors in zip(requests, answers):
                out[rows] = vectors
        return self._normalised(out)

    def embed_batch(self, texts: list[str], titles: list[str | None], keys: list[str], ledger: JobLedger,
                    polling: Polling, on_state: Callable[[JobRecord], None] = lambda _job: None,
                    keep: Callable[[list[str], np.ndarray], None] | None = None) -> np.ndarray:
        """Embed through Batch Mode (a JSONL file of requests, each with its own title); resume open jobs first.

        Rows the job failed are embedded online at once: a chunk cannot be indexed without its vector.
        keep gets each collected job's vectors before the job leaves the ledger, and the online ones after
        their call (the model cache): a run killed after that never submits or pays for them again.
        """
        wanted = {k: (t, title) for k, t, title in zip(keys, texts, titles)}
        found: dict[str, np.ndarray] = {}
        covered: set[str] = set()  # keys some collected job carried, answered or not

        def finish(job: JobRecord) -> None:
            got = self._collect(wait_for(self._client, job, ledger, polling, on_state), job, wanted)
            if keep is not None and got:
                keep(list(got), np.asarray(list(got.values()), dtype=np.float32).reshape(len(got), self.dim))
            found.update(got)
            ledger.close(job)

        for job in ledger.open_jobs("embed"):
            if wanted.keys() & set(job.keys):
                covered |= set(job.keys)
                on_state(job)
                finish(job)
        rest = [k for k in wanted if k not in covered]
        if rest:
            job = self._submit(rest, wanted, ledger)
            on_state(job)
            finish(job)
        missing = [k for k in wanted if k not in found]
        if missing:  # failed rows: online, now
            again = self.embed([wanted[k][0] for k in missing], [wanted[k][1] for k in missing])
            if keep is not None:
                keep(missing, again)
            found |= dict(zip(missing, again))
        return np.asarray([found[k] for k in keys], dtype=np.float32).reshape(len(keys), self.dim)

    def _submit(self, keys: list[str], wanted: dict[str, tuple[str, str | None]], ledger: JobLedger) -> JobRecord:
        lines = []
        for key in keys:
            text, title = wanted[key]
            request = {"content": {"parts": [{"text": text}]}, "taskType": self._task,
                       "outputDimensionality": self.dim}
            if title and self._task == "RETRIEVAL_DOCUMENT":
                request["title"] = title
            lines.append(json.dumps({"key": key, "request": request}))
        upload = self._client.files.upload(file=io.BytesIO("\n".join(lines).encode()), config=types.UploadFileConfig(
            mime_type="application/jsonl", display_name=f"inlet-embed-{len(keys)}-rows"))
        with warnings.catch_warnings():  # the SDK marks embedding batches experimental; the test server pins the shape
            warnings.simplefilter("ignore")
            batch = self._client.batches.create_embeddings(
                model=self._model, src=types.EmbeddingsBatchJobSource(file_name=upload.name),
                config=types.CreateEmbeddingsBatchJobConfig(display_name=f"inlet-embed-{len(keys)}-rows"))
        job = JobRecord(name=batch.name or "", kind="embed", model=self._model, keys=keys,
                        state=batch.state.value if batch.state else "JOB_STATE_PENDING")
        ledger.save(job)
        return job

    def _collect(self, batch: types.BatchJob, job: JobRecord,
                 wanted: dict[str, tuple[str, str | None]]) -> dict[str, np.ndarray]:
        """Return the vectors a finished job holds, normalised as online ones are; failed rows are left out."""
        # Counted when collected, so that a job resumed after a crash is still counted once.
        spent = sum(count_tokens(wanted[k][0]) for k in job.keys if k in wanted)
        self.batch_jobs += 1
        self.batch_tokens += spent
        self.tokens += spent
        if batch.state is None or batch.state.value != "JOB_STATE_SUCCEEDED" or batch.dest is None:
            return {}
        rows: list[tuple[str, list[float]]] = []
        if batch.dest.file_name:
            for line in self._client.files.download(file=batch.dest.file_name).decode().splitlines():
                item = json.loads(line) if line.strip() else {}
                values = (item.get("response") or {}).get("embedding", {}).get("values")
                if item.get("key") and values and len(values) == self.dim:
                    rows.append((item["key"], values))
        if not rows:
            return {}
        vectors = self._normalised(np.asarray([v for _, v in rows], dtype=np.float32))
        return {k: vectors[i] for i, (k, _) in enumerate(rows)}

    def _normalised(self, vectors: np.ndarray) -> np.ndarray:
        if self.dim >= FULL_DIM:
            return vectors
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms == 0, 1.0, norms)

    def truncated(self, texts: list[str]) -> list[bool]:
        """Tell which texts exceed the 2,048-token input limit (counted with cl100k as a proxy)."""
        return [count_tokens(t) > MAX_INPUT_TOKENS for t in texts]


def gemini_fingerprint(model: str, dim: int) -> str:
    """Return the fingerprint of Gemini document embeddings of a model and size."""
    return f"gemini:{model}:dim={dim}:task=RETRIEVAL_DOCUMENT"


def parse_gemini_fingerprint(fingerprint: str) -> tuple[str, int]:
    """Return (model, dim) from a Gemini fingerprint."""
    _, model, dim, _task = fingerprint.split(":")
    return model, int(dim.removeprefix("dim="))
