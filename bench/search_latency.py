"""Benchmark: search latency by mode at 100k and 1M chunks, and recall@10 of the ANN index against exact search.

    .venv/bin/python bench/search_latency.py                     # 100k and 1M chunks, 200 queries per mode
    .venv/bin/python bench/search_latency.py --sizes 100000 --queries 50
    .venv/bin/python bench/search_latency.py --sizes 1000000 --store /work/q1m   # build once, then re-time
    .venv/bin/python bench/search_latency.py --sizes 1000000 --embedder e5       # queries embedded by the default model
    .venv/bin/python bench/search_latency.py --sizes 5000 20000 50000 --ann-min-rows 100000  # exact search below it
    .venv/bin/python bench/search_latency.py --sizes 1000000 --store /work/q1m --variant agreement=0.3 --variant candidates=12


A chunks table with Inlet's schema is written with synthetic 384-d vectors (a mixture of 2,000
clusters, the shape real embeddings have) and texts cycled from ../shared/corpora/markdown
paragraphs (a numbered suffix keeps rows apart), then indexed the way the upsert does it
(full-text index; IVF-HNSW-SQ vector index). Queries go through query.search() itself, with the
table's own embedder, so the figures include Inlet's own work per query: the hashing embedder (~0.02 ms a
query: LanceDB and Inlet alone) or, with --embedder e5, the default multilingual model (what a user of the
shipped config waits for; the vectors stay synthetic, so only the timing means anything). Recall@10:
the ANN answer against an exact scan for perturbed data points as queries. Each --variant KEY=VALUE (a
query-section setting) is timed in hybrid mode against the shipped config in the same process, their queries
taken in turn, so that both see the same machine (separate processes differed by up to 4 ms at 1M chunks on two
cores with nothing changed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import providers  # noqa: E402,F401 - offline switches first
from providers.embedders import E5_FINGERPRINT  # noqa: E402
from query.search import search, warm  # noqa: E402
from schemas.arrow import chunk_rows_schema  # noqa: E402
from schemas.config import EMBEDDER_FUSION  # noqa: E402
from store.commit import refresh_indexes  # noqa: E402
from store.tables import connect  # noqa: E402

DIM = 384
CORPUS = ROOT.parent / "shared" / "corpora" / "markdown"
RESULTS = ROOT / "bench" / "results"
FINGERPRINTS = {"hashing": f"hashing-v1:dim={DIM}", "e5": E5_FINGERPRINT}
# The shipped embedder's fusion (weights and temperature), set outright: hybrid over the hashing embedder alone is
# full-text's (schemas/config.py EMBEDDER_FUSION), and the hashing stand-in is here to time both sides as an e5
# store's hybrid search runs them.
E5_FUSION = dataclasses.asdict(EMBEDDER_FUSION["e5"])


def paragraphs(limit: int = 20_000) -> list[str]:
    """Real paragraphs to use as chunk texts and queries."""
    root = CORPUS if CORPUS.is_dir() else ROOT / "data" / "sample"
    out = []
    for path in sorted(root.rglob("*.md")):
        out += [p.strip()[:1200] for p in path.read_text(encoding="utf-8", errors="replace").split("\n\n")
                if len(p.strip()) > 80]
        if len(out) >= limit:
            break
    return out[:limit]


def synthetic_batch(start: int, n: int, centres: np.ndarray, texts: list[str], rng: np.random.Generator,
                    fingerprint: str) -> pa.Table:
    """n chunk rows with clustered unit vectors and real texts."""
    ids = np.arange(start, start + n)
    vectors = centres[rng.integers(0, len(centres), n)] + rng.normal(scale=0.35, size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    text = [f"{texts[i % len(texts)]} (part {i})" for i in ids]
    col = lambda v: pa.array([v] * n)  # noqa: E731 - a constant column
    return pa.table({
        "chunk_id": pa.array([f"c{i}" for i in ids]), "doc_id": pa.array([f"bench:doc{i // 8}.md" for i in ids]),
        "chunk_index": pa.array(ids % 8, pa.int32()), "total_chunks": col(8).cast(pa.int32()),
        "prev_chunk_id": pa.nulls(n, pa.string()), "next_chunk_id": pa.nulls(n, pa.string()),
        "heading_path": pa.array([["Bench"]] * n, pa.list_(pa.string())), "text": pa.array(text, pa.large_string()),
        "text_hash": pa.array([f"h{i}" for i in ids]), "token_count": col(100).cast(pa.int32()),
        "page_start": pa.nulls(n, pa.int32()), "page_end": pa.nulls(n, pa.int32()),
        "enrichment": pa.nulls(n, pa.large_string()), "enricher": pa.nulls(n, pa.string()),
        "enrich_key": pa.nulls(n, pa.string()), "embed_key": pa.array([f"e{i}" for i in ids]),
        "embedder": col(fingerprint), "truncated": col(False),
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), DIM),
        "source": col("bench"), "title": col("Bench document"), "uri": pa.array([f"file:///doc{i // 8}" for i in ids]),
        "doc_type": col("bench"), "tags": pa.array([["bench"]] * n, pa.list_(pa.string())),
        "access_level": pa.array(np.where(ids % 10 == 0, "internal", "public")), "language": col("en"),
        "extra": col("{}"), "expires_at": pa.nulls(n, pa.timestamp("us", tz="UTC")), "run_id": col("bench"),
    })


def build(store: Path, size: int, texts: list[str], fingerprint: str, ann_min_rows: int,
          seed: int = 1) -> tuple[float, float]:
    """Write size rows in batches and index them as the upsert does; return (write seconds, index seconds)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(2_000, DIM)).astype(np.float32)
    db = connect(store)  # the write path's own connection: same file format as ingested tables
    start = time.perf_counter()
    table = None
    for begin in range(0, size, 100_000):
        batch = synthetic_batch(begin, min(100_000, size - begin), centres, texts, rng, fingerprint)
        batch = batch.select(chunk_rows_schema(DIM).names).cast(chunk_rows_schema(DIM))
        table = db.create_table("chunks", batch) if table is None else table
        if begin:
            table.add(batch)
    written = time.perf_counter() - start
    refresh_indexes(table, fulltext=True, ann_min_rows=ann_min_rows)
    return written, time.perf_counter() - start - written


def latencies(config: Path, queries: list[str], mode: str) -> list[float]:
    """Milliseconds per search() call in a warmed-up process (warm(), then one search), as a search service runs."""
    warm(config)
    search("a first question to warm up on", k=10, mode=mode, config=config)
    out = []
    for q in queries:
        start = time.perf_counter()
        search(q, k=10, mode=mode, config=config)
        out.append((time.perf_counter() - start) * 1000)
    return out


def interleaved(configs: dict[str, Path], queries: list[str]) -> dict[str, list[float]]:
    """Milliseconds per hybrid search() for each config, the queries dealt to the configs in turn after warming each."""
    for config in configs.values():
        warm(config)
        search("a first question to warm up on", k=10, mode="hybrid", config=config)
    names = list(configs)
    out: dict[str, list[float]] = {name: [] for name in names}
    for i, q in enumerate(queries):
        name = names[i % len(names)]
        start = time.perf_counter()
        search(q, k=10, mode="hybrid", config=configs[name])
        out[name].append((time.perf_counter() - start) * 1000)
    return out


def variant(text: str) -> tuple[str, object]:
    """A --variant KEY=VALUE: a query-section setting, its value read as YAML (0.3 a number, true a boolean)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--variant takes KEY=VALUE (a query setting), not {text!r}")
    return key, yaml.safe_load(value)


def ann_recall(store: Path, n_queries: int, seed: int = 2) -> float | None:
    """Mean overlap of the ANN top 10 (at search()'s nprobes, ef and refine factor) with the exact top 10, for perturbed data points."""
    import lancedb

    from schemas.config import QueryConfig

    qcfg = QueryConfig()

    table = lancedb.connect(str(store)).open_table("chunks")
    if not any(i.columns == ["vector"] for i in table.list_indices()):
        return None  # exact search: nothing to compare
    rng = np.random.default_rng(seed)
    sample = table.search().select(["vector"]).limit(n_queries * 50).to_arrow()["vector"].to_pylist()
    picks = [np.asarray(sample[i], dtype=np.float32) for i in rng.choice(len(sample), n_queries, replace=False)]
    overlap = []
    for v in picks:
        q = v + rng.normal(scale=0.05, size=DIM).astype(np.float32)
        ann = (table.search(q).distance_type("cosine").nprobes(qcfg.nprobes).ef(qcfg.ef)
               .refine_factor(qcfg.refine_factor).limit(10).select(["chunk_id", "_distance"]).to_arrow()["chunk_id"])
        exact = (table.search(q).distance_type("cosine").bypass_vector_index().limit(10).select(["chunk_id", "_distance"])
                 .to_arrow()["chunk_id"])
        overlap.append(len(set(ann.to_pylist()) & set(exact.to_pylist())) / 10)
    return statistics.mean(overlap)


def pct(values: list[float], q: float) -> float:
    """The q-quantile of values."""
    return float(np.percentile(values, q * 100))


def main() -> None:
    """Build each size, time each mode, measure ANN recall; print a table and write bench/results/query.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--store", type=Path, help="keep the table in this folder (one size): built on the first "
                        "run, re-timed on the next ones")
    parser.add_argument("--embedder", choices=sorted(FINGERPRINTS), default="hashing",
                        help="the query embedder (a --store keeps the one it was built with)")
    parser.add_argument("--ann-min-rows", type=int, default=None,
                        help="query.ann_min_rows: the ANN index is built from this many rows (default: each size, "
                        "so that every size is timed with it; the shipped default times exact search below it)")
    parser.add_argument("--variant", type=variant, action="append", default=[],
                        help="KEY=VALUE of the query section: hybrid timed against the shipped config, interleaved")
    args = parser.parse_args()
    if args.store and len(args.sizes) != 1:
        parser.error("--store takes one size")
    texts = paragraphs()
    rng = np.random.default_rng(3)
    modes = ("vector", "fulltext", "hybrid")
    # Each mode its own questions: search() keeps recent query vectors, and a mode must not time another's.
    picks = iter(rng.choice(len(texts), args.queries * len(modes), replace=False))
    queries = {mode: [" ".join(texts[next(picks)].split()[:8]) for _ in range(args.queries)] for mode in modes}
    mixed = [" ".join(texts[i].split()[:8]) for i in rng.choice(len(texts), args.queries * (1 + len(args.variant)))]
    results = []
    print(f"{'chunks':>9} {'mode':>9} {'p50 ms':>8} {'p95 ms':>8} | build: write s, index s | ANN recall@10")
    for size in args.sizes:
        with tempfile.TemporaryDirectory(dir=ROOT.parent if (ROOT.parent / "shared").exists() else None) as tmp:
            folder = args.store or Path(tmp)
            store = folder / "lancedb"
            written = indexed = 0.0
            ann_min_rows = args.ann_min_rows or size
            if not (store / "chunks.lance").exists():
                written, indexed = build(store, size, texts, FINGERPRINTS[args.embedder], ann_min_rows)
            config = folder / "inlet.yaml"
            settings = {"sources": [{"name": "bench", "path": str(folder)}],
                        "embedding": {"kind": args.embedder, "dim": DIM},
                        "query": {"ann_min_rows": max(256, ann_min_rows), **E5_FUSION},
                        "store": {"uri": str(store), "artifacts": str(folder / "runs")}}
            config.write_text(yaml.safe_dump(settings))
            recall = ann_recall(store, 100)
            for mode in modes:
                ms = latencies(config, queries[mode], mode)
                row = {"chunks": size, "embedder": args.embedder, "mode": mode, "p50_ms": pct(ms, 0.5), "p95_ms": pct(ms, 0.95),
                       "write_s": written, "index_s": indexed, "ann": recall is not None, "ann_recall_at_10": recall}
                results.append(row)
                print(f"{size:>9} {mode:>9} {row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f} | "
                      f"{written:.1f} s, {indexed:.1f} s | {'exact search' if recall is None else f'{recall:.3f}'}")
            if args.variant:
                configs = {"shipped": config}
                for key, value in args.variant:
                    configs[f"{key}={value}"] = folder / f"inlet-{key}-{value}.yaml"
                    configs[f"{key}={value}"].write_text(yaml.safe_dump(
                        {**settings, "query": {**settings["query"], key: value}}))
                timed = interleaved(configs, mixed)
                for name, ms in timed.items():
                    row = {"chunks": size, "embedder": args.embedder, "mode": "hybrid", "variant": name,
                           "p50_ms": pct(ms, 0.5), "p95_ms": pct(ms, 0.95), "queries": len(ms)}
                    results.append(row)
                    print(f"{size:>9} {'hybrid':>9} {row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f} | {name}, interleaved "
                          f"({len(ms)} queries; {row['p50_ms'] - pct(timed['shipped'], 0.5):+.1f} ms p50)")
    RESULTS.mkdir(exist_ok=True)
    name = "query" + ("" if args.embedder == "hashing" else f"-{args.embedder}") + (
        f"-ann{args.ann_min_rows}" if args.ann_min_rows else "") + ("-variants" if args.variant else "")
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
