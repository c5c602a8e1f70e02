"""Benchmark: Gemini enrichment and embedding throughput against the local Gemini-protocol test server.

    .venv/bin/python bench/enrich.py                 # 300 ms latency, 5% 429s (1 s RetryInfo), 3 reps
    .venv/bin/python bench/enrich.py --reps 1 --in-flight 1 8

The real google-genai client talks to tests/gemini_server.py. Chunks come from
../shared/corpora/markdown (paragraphs of real documents), or from data/sample when it is absent.
Reported: chunks enriched per second as the bound on requests in flight grows (no request quota,
so the bound alone decides; with a quota the steady rate is at most requests_per_minute / 60), and
texts embedded per second (100 texts a request). Medians of --reps runs; each run gets its own
server and enricher, and is sized to last about --seconds at the ideal rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import providers  # noqa: E402,F401 - offline switches first
from providers.gemini import GeminiEmbedder  # noqa: E402
from providers.gemini_enricher import GeminiEnricher, load_prompt  # noqa: E402
from providers.types import EnrichInput  # noqa: E402
from tests.gemini_server import Faults, GeminiServer  # noqa: E402

CORPUS = ROOT.parent / "shared" / "corpora" / "markdown"
PROMPT = ROOT / "configs" / "prompts" / "questions.yaml"
RESULTS = ROOT / "bench" / "results"


def chunk_texts(limit: int) -> list[str]:
    """Return up to limit paragraph-sized texts of real documents."""
    root = CORPUS if CORPUS.is_dir() else ROOT / "data" / "sample"
    texts: list[str] = []
    for path in sorted(root.rglob("*.md")):
        for para in path.read_text(encoding="utf-8", errors="replace").split("\n\n"):
            if len(para) > 200:
                texts.append(para[:1500])
                if len(texts) == limit:
                    return texts
    if not texts:
        msg = f"no paragraphs found under {root}"
        raise SystemExit(msg)
    return (texts * (limit // len(texts) + 1))[:limit]


def enrich_rate(faults: Faults, in_flight: int, n: int, rpm: int | None) -> dict:
    """Enrich n chunks once; return chunks per second and what the run saw."""
    srv = GeminiServer(faults).start()
    try:
        enricher = GeminiEnricher(kind="questions", prompt=load_prompt(PROMPT), api_key="bench-key",
                                  base_url=srv.base_url, max_in_flight=in_flight, requests_per_minute=rpm,
                                  tokens_per_minute=None, initial_delay_s=0.5)
        items = [EnrichInput(t, "Bench document", ("Section",)) for t in chunk_texts(n)]
        start = time.perf_counter()
        answers = enricher.enrich(items)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "chunks_per_s": n / seconds, "enriched": sum(a is not None for a in answers),
                "retries": enricher.usage.retries, "max_in_flight_seen": srv.traffic.max_in_flight}
    finally:
        srv.stop()


def embed_rate(faults: Faults, n: int, in_flight: int) -> dict:
    """Embed n texts once; return texts per second."""
    srv = GeminiServer(faults).start()
    try:
        embedder = GeminiEmbedder(api_key="bench-key", base_url=srv.base_url, dim=768, initial_delay_s=0.5,
                                  max_in_flight=in_flight)
        texts = chunk_texts(n)
        start = time.perf_counter()
        embedder.embed(texts)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "texts_per_s": n / seconds, "requests": embedder.calls,
                "retries": embedder.retrier.retries}
    finally:
        srv.stop()


def median_of(runs: list[dict], key: str) -> float:
    """Return the median of one measure over runs."""
    return statistics.median(r[key] for r in runs)


def main() -> None:
    """Run the curve and print a table; write the raw runs to bench/results/enrich.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--latency", type=float, default=0.3)
    parser.add_argument("--p429", type=float, default=0.05)
    parser.add_argument("--seconds", type=float, default=5.0, help="target length of one measured run")
    args = parser.parse_args()
    faults = Faults(latency_s=args.latency, p429=args.p429, retry_delay_s=1, seed=1)
    out: dict = {"latency_s": args.latency, "p429": args.p429, "retry_delay_s": 1, "enrich": [], "embed": []}
    print(f"Gemini test server: {args.latency * 1000:.0f} ms latency, {args.p429:.0%} 429s asking for 1 s; "
          f"medians of {args.reps}")
    print(f"{'in flight':>9} {'chunks':>7} {'chunks/s':>9} {'ideal/s':>8} {'retries':>8} {'seen in flight':>15}")
    for in_flight in args.in_flight:
        ideal = in_flight / args.latency
        n = max(16, int(ideal * args.seconds))  # every point costs about the same time
        runs = [enrich_rate(faults, in_flight, n, None) for _ in range(args.reps)]
        row = {"in_flight": in_flight, "chunks": n, "runs": runs, "chunks_per_s": median_of(runs, "chunks_per_s")}
        out["enrich"].append(row)
        print(f"{in_flight:>9} {n:>7} {row['chunks_per_s']:>9.1f} {ideal:>8.1f} "
              f"{median_of(runs, 'retries'):>8.0f} {max(r['max_in_flight_seen'] for r in runs):>15}")
    out["embed"] = []
    for in_flight in (1, 4, 8):
        runs = [embed_rate(faults, 2000 * in_flight, in_flight) for _ in range(args.reps)]
        out["embed"].append({"in_flight": in_flight, "texts": 2000 * in_flight, "runs": runs,
                             "texts_per_s": median_of(runs, "texts_per_s")})
        print(f"embedding, {in_flight} requests in flight: {out['embed'][-1]['texts_per_s']:.0f} texts/s "
              f"({2000 * in_flight:,} texts, 100 a request)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "enrich.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
