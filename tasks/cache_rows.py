"""Rows of the model cache (schemas/arrow.py MODEL_CACHE_SCHEMA) from model answers, and answers from its rows."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.arrow import EMBED, ENRICH, model_cache_rows


def vectors_of(rows: pa.Table, dim: int) -> pa.Table:
    """Cached embedding rows as (embed_key, truncated, vector) of size dim; rows of another size are left out.

    A size that is off is a damaged or foreign entry: the text is embedded again and maintenance reports it.
    """
    rows = rows.filter(pc.equal(pc.list_value_length(rows["vector"]), dim))
    vectors = pc.cast(rows["vector"], pa.list_(pa.float32(), dim))
    return pa.table({"embed_key": rows["key"], "truncated": pc.fill_null(rows["truncated"], False),
                     "vector": vectors})


def usable_vectors(vectors: np.ndarray) -> np.ndarray:
    """Which vectors are fit to keep: finite and not all zeros (what the integrity check calls a bad vector)."""
    finite = np.isfinite(vectors).all(axis=1)
    return finite & (np.abs(np.where(np.isfinite(vectors), vectors, 0.0)).sum(axis=1) > 0)


def _share(total: int | float, n: int) -> list:
    """A call's usage shared evenly among its n answers (ints stay ints and sum to the total)."""
    if isinstance(total, int):
        return [total // n + (i < total % n) for i in range(n)]
    return [total / n] * n  # n == 0: an empty list


def embedding_rows(keys: list[str], fingerprint: str, vectors: np.ndarray, truncated: list[bool],
                   tokens: int, cost: float, now: datetime) -> pa.Table:
    """Cache rows of one embedding call's answers, with the call's tokens and cost shared among them."""
    n = len(keys)
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * (vectors.shape[1] if n else 0))
    return model_cache_rows(EMBED, keys, [fingerprint] * n, now, vector=pa.ListArray.from_arrays(offsets, flat),
                            truncated=truncated, prompt_tokens=_share(tokens, n), output_tokens=[0] * n,
                            cost_usd=_share(float(cost), n))


def enrichment_rows(keys: list[str], fingerprint: str, texts: list[str], prompt_tokens: int, output_tokens: int,
                    cost: float, now: datetime) -> pa.Table:
    """Cache rows of one enrichment call's answers, with the call's tokens and cost shared among them."""
    n = len(keys)
    return model_cache_rows(ENRICH, keys, [fingerprint] * n, now, enrichment=texts,
                            prompt_tokens=_share(prompt_tokens, n), output_tokens=_share(output_tokens, n),
                            cost_usd=_share(float(cost), n))
