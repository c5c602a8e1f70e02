"""Gemini embeddings through the real google-genai client (gemini-embedding-001 by default)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from google import genai
from google.genai import types

from providers.gemini_retry import Retrier
from providers.tokenizer import count_tokens

MAX_TEXTS_PER_REQUEST = 100  # the API's limit for one batchEmbedContents call
MAX_INPUT_TOKENS = 2048  # longer inputs are truncated by the model
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
                 attempts: int = 5, initial_delay_s: float = 1.0, max_request_chars: int = 200_000) -> None:
        # The client's own retries ignore the server's retry delay, so ours replace them.
        self._client = genai.Client(api_key=api_key, http_options=types.HttpOptions(base_url=base_url,
                                                                                    timeout=timeout_ms))
        self.retrier = Retrier(attempts, initial_delay_s)
        self.calls = 0
        self.tokens = 0  # estimated with cl100k: batchEmbedContents reports no usage
        self._model, self._task, self._max_chars = model, task_type, max_request_chars
        self.dim = dim
        self.fingerprint = f"gemini:{model}:dim={dim}:task={task_type}"
        self.uses_titles = task_type == "RETRIEVAL_DOCUMENT"

    def _request(self, texts: list[str], title: str | None) -> np.ndarray:
        config = types.EmbedContentConfig(task_type=self._task, output_dimensionality=self.dim,
                                          title=(title or None) if self._task == "RETRIEVAL_DOCUMENT" else None)
        def call() -> types.EmbedContentResponse:
            self.calls += 1
            return self._client.models.embed_content(model=self._model, contents=texts, config=config)

        result = self.retrier(call)
        self.tokens += sum(count_tokens(t) for t in texts)
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
        for title, rows in by_title.items():
            group = [texts[i] for i in rows]
            for start, end in request_batches(group, max_texts=MAX_TEXTS_PER_REQUEST, max_chars=self._max_chars):
                out[rows[start:end]] = self._request(group[start:end], title)
        if self.dim < FULL_DIM:
            norms = np.linalg.norm(out, axis=1, keepdims=True)
            out = out / np.where(norms == 0, 1.0, norms)
        return out

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
