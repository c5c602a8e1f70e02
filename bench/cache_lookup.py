"""Benchmark: one batch's model cache lookup as appends pile up, after tidy_cache merges them, and with its key index.

    .venv/bin/python bench/cache_lookup.py                  # 200 appends of 1,000 384-dim vectors
    .venv/bin/python bench/cache_lookup.py --appends 50 --rows 4000

Each append is what one batch's embed stage writes (one fragment). The lookup asks for 1,500 keys, 1,000 of
them cached, as a batch does (store/model_cache.py cached_rows). Medians of --reps lookups, in seconds.
Writes bench/results/cache_lookup.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from store.model_cache import FRAGMENT_ROWS, cached_rows, open_cache, tidy_cache  # noqa: E402
from store.tables import connect  # noqa: E402
from tasks.cache_rows import embedding_rows  # noqa: E402


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def lookup_seconds(store: str, keys: list[str], reps: int) -> tuple[float, int]:
    """Median seconds of cached_rows over keys, and the rows it found."""
    times, found = [], 0
    for _ in range(reps):
        start = time.perf_counter()
        found = cached_rows(store, "model_cache", keys, ["key", "truncated", "vector", "cost_usd"]).num_rows
        times.append(time.perf_counter() - start)
    return statistics.median(times), found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--rows", type=int, default=1000, help="answers per append")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    out: dict[str, object] = {"appends": args.appends, "rows": args.rows, "dim": args.dim,
                              "fragment_rows": FRAGMENT_ROWS}
    with tempfile.TemporaryDirectory() as folder:
        store = str(Path(folder) / "store")
        table = open_cache(connect(store), "model_cache")
        every = []
        for n in range(args.appends):
            keys = [_key(f"{n}-{i}") for i in range(args.rows)]
            every += keys
            table.add(embedding_rows(keys, "bench", rng.random((args.rows, args.dim), dtype=np.float32),
                                     [False] * args.rows, 0, 0.0, datetime.now(UTC)))
        asked = every[:: max(1, len(every) // 1000)][:1000] + [_key(f"new-{i}") for i in range(500)]
        out["appended"] = lookup_seconds(store, asked, args.reps)
        start = time.perf_counter()
        out["tidy"] = tidy_cache(store, "model_cache")
        out["tidy_s"] = round(time.perf_counter() - start, 3)
        out["tidied"] = lookup_seconds(store, asked, args.reps)
        for n in range(20):  # a later run's appends, not yet merged
            keys = [_key(f"later-{n}-{i}") for i in range(args.rows)]
            table.add(embedding_rows(keys, "bench", rng.random((args.rows, args.dim), dtype=np.float32),
                                     [False] * args.rows, 0, 0.0, datetime.now(UTC)))
        out["tidied_then_20_appends"] = lookup_seconds(store, asked, args.reps)
    print(json.dumps(out))
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "cache_lookup.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
