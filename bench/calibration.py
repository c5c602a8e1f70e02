"""Benchmark: fusion weights calibrated without labels, from pseudo-queries made of each store's own chunks.

    .venv/bin/python bench/fusion_runs.py W            # the stores and each set's real answers under W
    .venv/bin/python bench/calibration.py W            # every store under W, 100 chunks each
    .venv/bin/python bench/calibration.py W --chunks 200 --sets fiqa arguana

Issue 54's second candidate: a per-store calibration without labels. From each store built by
bench/fusion_runs.py (each variant: the shipped e5 embedder, and the static one), a seeded sample of
chunks is made into pseudo-queries of three kinds: "sentence" (one of the chunk's sentences, as it
stands), "half" (that sentence with every second word left out: a query that shares only some of the
chunk's words) and "keywords" (the chunk's five words of highest tf-idf over a sample of the store).
Each is asked of both sides through query.search (as many candidates as an eval query fetches), and
each z-score weight of the grid is scored by the MRR@10 of the chunk the query came from in the fused
ranking. The weight a kind picks (the best pseudo MRR; the nearer to 0.5 of equals) is then scored on
the set's real queries (their kept candidates, bench/fusion_runs.py) against the shipped 0.5 / 0.5.
A variant whose vector side search dropped for language is left out, as in bench/fusion.py.
Writes bench/results/calibration.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WEIGHTS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)  # the vector side's; full-text's is 1 - it
SHIPPED = 0.5
KINDS = ("sentence", "half", "keywords")
WORD = re.compile(r"\w+")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    """The text's sentences of 6 to 40 words: long enough to be a query, short enough not to be the chunk."""
    return [s for s in SENTENCE_END.split(text) if 6 <= len(s.split()) <= 40]


def document_frequencies(texts: list[str]) -> Counter:
    """In how many of the texts each lower-cased word occurs."""
    return Counter(word for text in texts for word in {w.lower() for w in WORD.findall(text)})


def keywords(text: str, df: Counter, n_texts: int, n: int = 5) -> str:
    """The text's n words of highest tf-idf (words of 3 letters or more; ties by first occurrence)."""
    words = [w.lower() for w in WORD.findall(text) if len(w) > 2]
    tf = Counter(words)
    best = sorted(tf, key=lambda w: -tf[w] * math.log(n_texts / (1 + df[w])))
    return " ".join(best[:n])


def pseudo_queries(rows: list[dict], df: Counter, n_texts: int, rng: random.Random) -> dict[str, list[tuple]]:
    """Per kind, (source chunk id, query text) for each row that has a sentence to make one from."""
    out: dict[str, list[tuple]] = {kind: [] for kind in KINDS}
    for row in rows:
        candidates = sentences(row["text"])
        if not candidates:
            continue
        sentence = rng.choice(candidates)
        out["sentence"].append((row["chunk_id"], sentence))
        out["half"].append((row["chunk_id"], " ".join(sentence.split()[::2])))
        out["keywords"].append((row["chunk_id"], keywords(row["text"], df, n_texts)))
    return out


def choose(pseudo_mrr: dict[float, float]) -> float:
    """The weight with the best pseudo MRR; of equals, the nearest to the shipped weight."""
    return max(pseudo_mrr, key=lambda w: (round(pseudo_mrr[w], 9), -abs(w - SHIPPED)))


def fusion_of(weight: float) -> dict:
    """The z-score fusion at this vector weight, as query/fusion.py's fuse_sides takes it."""
    return {"method": "zscore", "vector_weight": weight, "fulltext_weight": round(1 - weight, 2), "rrf_k": 60}


def calibrate_store(config: Path, variant: str | None, n_chunks: int, depth: int) -> dict:
    """Pseudo MRR@10 per kind and weight (and each side's own) over n_chunks sampled chunks; seconds taken."""
    from query.fusion import fuse_sides, ranked
    from query.metrics import mrr_at
    from query.search import published_table, search, select_variant
    from schemas.config import load_config

    started = time.perf_counter()
    table, _ = published_table(select_variant(load_config(config), variant))
    rows = table.to_arrow().select(["chunk_id", "text"]).to_pylist()
    rng = random.Random(0)
    sample = rng.sample(rows, min(n_chunks, len(rows)))
    basis = rng.sample(rows, min(2000, len(rows)))
    queries = pseudo_queries(sample, document_frequencies([r["text"] for r in basis]), len(basis), rng)
    out: dict[str, dict] = {}
    for kind, pairs in queries.items():
        mrr: dict[str, list[float]] = {"vector": [], "fulltext": [], **{str(w): [] for w in WEIGHTS}}
        for target, text in pairs:
            source = {target: 1}  # the one relevant chunk
            sides = [[(h.chunk_id, h.score) for h in search(text, k=depth, mode=mode, clearance="confidential",
                                                            config=config, variant=variant)]
                     for mode in ("vector", "fulltext")]
            mrr["vector"].append(mrr_at([c for c, _ in sides[0]], source))
            mrr["fulltext"].append(mrr_at([c for c, _ in sides[1]], source))
            for w in WEIGHTS:
                mrr[str(w)].append(mrr_at(ranked(fuse_sides(*sides, **fusion_of(w)), 10), source))
        out[kind] = {name: float(np.mean(v)) if v else 0.0 for name, v in mrr.items()}
    return {"pseudo": out, "queries": len(queries["sentence"]), "seconds": time.perf_counter() - started}


def real_scores(runs: dict, data: object) -> dict[str, float]:
    """The set's real queries: nDCG@10 of each side and of the z-score fusion at every weight of the grid."""
    from flows.eval import K_CHUNKS, per_query

    out = {mode: float(per_query(runs, data, mode, K_CHUNKS)["ndcg@10"].mean()) for mode in ("vector", "fulltext")}
    for w in WEIGHTS:
        out[str(w)] = float(per_query(runs, data, "hybrid", K_CHUNKS, fusion=fusion_of(w))["ndcg@10"].mean())
    return out


def print_table(results: dict[str, dict]) -> None:
    """One Markdown row per store: its sides, the shipped fusion, the best real weight, each kind's pick and gain."""
    print("| store | vector | full-text | shipped 0.5/0.5 | best weight (real) | "
          + " | ".join(f"{k}: picks | its nDCG@10 - shipped" for k in KINDS) + " | s per store |")
    print("|---|---:|---:|---:|---:|" + "---:|---:|" * len(KINDS) + "---:|")
    for name, row in results.items():
        real = row["real"]
        best = max(WEIGHTS, key=lambda w: real[str(w)])
        cells = " | ".join(f"{p} | {real[str(p)] - real[str(SHIPPED)]:+.3f}" for p in row["picks"].values())
        print(f"| {name} | {real['vector']:.3f} | {real['fulltext']:.3f} | {real[str(SHIPPED)]:.3f} | "
              f"{best} ({real[str(best)]:.3f}) | {cells} | {row['seconds']:.0f} |")


def positive(value: str) -> int:
    """An argparse type: a whole number of at least 1."""
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be 1 or more")
    return number


def main() -> None:
    """Calibrate every store under the workdir, print the table, write bench/results/calibration.json."""
    from bench.fusion import vector_dropped
    from flows.eval import K_CHUNKS, load_runs
    from schemas.config import load_config

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--chunks", type=positive, default=100, help="chunks sampled per store (default 100)")
    parser.add_argument("--sets", nargs="*", help="only these sets (their folder under the workdir)")
    args = parser.parse_args()
    results = {}
    for runs_path in sorted(args.workdir.rglob("runs-*.json")):
        set_name = runs_path.parent.relative_to(args.workdir).as_posix()
        if args.sets and set_name not in args.sets:
            continue
        variant = runs_path.stem.removeprefix("runs-")
        runs, data = load_runs(runs_path)
        if variant != "default" and vector_dropped(runs):  # as bench/fusion.py: search never fuses these sides
            print(f"left out: {set_name} [{variant}] (search dropped its vector side for language)")
            continue
        config = runs_path.parent / "inlet.yaml"
        depth = K_CHUNKS * load_config(config).query.candidates
        row = calibrate_store(config, None if variant == "default" else variant, args.chunks, depth)
        row["real"] = real_scores(runs, data)
        row["picks"] = {k: choose({w: row["pseudo"][k][str(w)] for w in WEIGHTS}) for k in KINDS}
        results[set_name + ("" if variant == "default" else f" [{variant}]")] = row
    if not results:
        only = f" for the sets {', '.join(args.sets)}" if args.sets else ""
        sys.exit(f"no runs-*.json under {args.workdir}{only}: run bench/fusion_runs.py first")
    print_table(results)
    out = ROOT / "bench" / "results" / "calibration.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
