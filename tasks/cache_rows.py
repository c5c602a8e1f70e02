"""Rows of the model cache (schemas/arrow.py MODEL_CACHE_SCHEMA) from model answers, and answers from its rows."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.arrow import EMBED, ENRICH, MODEL_CACHE_SCHEMA


def vectors_of(rows: pa.Table, dim: int) -> pa.Table:
    """Cached embedding rows as (embed_key, truncated, vector) of size dim; rows of another size are left out.

    A size that is off is a damaged or foreign entry: the text is embedded again and maintenance reports it.
    """
    rows = rows.filter(pc.equal(pc.list_value_length(rows["vector"]), dim))
    vectors = pc.cast(rows["vector"], pa.list_(pa.float32(), dim))
    return pa.table({"embed_key": rows["key"], "truncated": pc.fill_null(rows["truncated"], False),
                     "vector": vectors})


def _share(total: int | float, n: int) -> list:
    """A call's usage shared evenly among its n answers (ints stay ints and sum to the total)."""
    if isinstance(total, int):
        return [total // n + (i < total % n) for i in range(n)]
    return [total / n] * n


def embedding_rows(keys: list[str], fingerprint: str, vectors: np.ndarray, truncated: list[bool],
                   tokens: int, cost: float, now: datetime) -> pa.Table:
    """Cache rows of one embedding call's answers, with the call's tokens and cost shared among them."""
    n = len(keys)
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * (vectors.shape[1] if n else 0))
    return pa.table({
        "key": pa.array(keys, pa.string()), "kind": pa.array([EMBED] * n, pa.string()),
        "fingerprint": pa.array([fingerprint] * n, pa.string()), "vector": pa.ListArray.from_arrays(offsets, flat),
        "truncated": pa.array(truncated, pa.bool_()), "enrichment": pa.nulls(n, pa.large_string()),
        "prompt_tokens": pa.array(_share(tokens, n), pa.int64()) if n else pa.array([], pa.int64()),
        "output_tokens": pa.array([0] * n, pa.int64()),
        "cost_usd": pa.array(_share(float(cost), n), pa.float64()) if n else pa.array([], pa.float64()),
        "created_at": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
        "unused_since": pa.nulls(n, pa.timestamp("us", tz="UTC")),
    }, schema=MODEL_CACHE_SCHEMA)


def enrichment_rows(keys: list[str], fingerprint: str, texts: list[str], prompt_tokens: int, output_tokens: int,
                    cost: float, now: datetime) -> pa.Table:
    """Cache rows of one enrichment call's answers, with the call's tokens and cost shared among them."""
    n = len(keys)
    return pa.table({
        "key": pa.array(keys, pa.string()), "kind": pa.array([ENRICH] * n, pa.string()),
        "fingerprint": pa.array([fingerprint] * n, pa.string()), "vector": pa.nulls(n, pa.list_(pa.float32())),
        "truncated": pa.nulls(n, pa.bool_()), "enrichment": pa.array(texts, pa.large_string()),
        "prompt_tokens": pa.array(_share(prompt_tokens, n) if n else [], pa.int64()),
        "output_tokens": pa.array(_share(output_tokens, n) if n else [], pa.int64()),
        "cost_usd": pa.array(_share(float(cost), n) if n else [], pa.float64()),
        "created_at": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
        "unused_since": pa.nulls(n, pa.timestamp("us", tz="UTC")),
    }, schema=MODEL_CACHE_SCHEMA)
