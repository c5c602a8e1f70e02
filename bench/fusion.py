"""Benchmark: hybrid fusions scored on every eval set's own candidates, and the choice by leave-one-set-out.

    .venv/bin/inlet eval ../shared/corpora/eval --max-queries 400 --keep-runs --workdir W
    .venv/bin/python bench/fusion.py W                  # every runs-default.json under W
    .venv/bin/python bench/fusion.py W --compare W2     # also: vector search of W2's embedder beside W's

For each set, nDCG@10 (documents of the first 30 chunks, as `inlet eval` scores them) of vector,
full-text and each fusion of the grid, computed by query/fusion.py on the candidates query.search
returned for that set's queries; then, holding each set out in turn, the grid point with the best
mean gain over the better side on the other sets, and its score on the held-out set. Writes
bench/results/fusion.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GRID = ([{"method": "zscore", "vector_weight": w, "fulltext_weight": round(1 - w, 2), "rrf_k": 60}
         for w in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)]
        + [{"method": "rrf", "vector_weight": w, "fulltext_weight": round(1 - w, 2), "rrf_k": k}
           for w in (0.3, 0.5, 0.7) for k in (10, 60)])


def label(params: dict) -> str:
    """A short name for a grid point, e.g. zscore 0.5/0.5 or rrf 0.5/0.5 k60."""
    name = f"{params['method']} {params['vector_weight']}/{params['fulltext_weight']}"
    return name + (f" k{params['rrf_k']}" if params["method"] == "rrf" else "")


def load_sets(workdir: Path) -> dict[str, tuple]:
    """Every set's saved runs under workdir, by the set's path relative to it."""
    from flows.eval import load_runs

    return {p.parent.relative_to(workdir).as_posix(): load_runs(p) for p in sorted(workdir.rglob("runs-default.json"))}


def scores(sets: dict[str, tuple]) -> dict[str, dict[str, np.ndarray]]:
    """Per set and method, each query's nDCG@10."""
    from flows.eval import K_CHUNKS, per_query

    out = {}
    for name, (runs, data) in sets.items():
        out[name] = {mode: per_query(runs, data, mode, K_CHUNKS)["ndcg@10"] for mode in ("vector", "fulltext")}
        for params in GRID:
            out[name][label(params)] = per_query(runs, data, "hybrid", K_CHUNKS, fusion=params)["ndcg@10"]
    return out


def gain(values: dict[str, np.ndarray], method: str) -> float:
    """A method's mean nDCG@10 over the better of vector and full-text on one set."""
    return float(values[method].mean() - max(values["vector"].mean(), values["fulltext"].mean()))


def leave_one_out(table: dict[str, dict[str, np.ndarray]]) -> list[dict]:
    """For each set: the grid point fitted on the others (best mean gain) and how it does on this one."""
    methods = [label(p) for p in GRID]
    out = []
    for held in table:
        rest = [s for s in table if s != held]
        chosen = max(methods, key=lambda m: (np.mean([gain(table[s], m) for s in rest]), -methods.index(m)))
        out.append({"held_out": held, "chosen": chosen, "fitted_on": rest,
                    "ndcg@10": round(float(table[held][chosen].mean()), 4),
                    "gain_over_better_side": round(gain(table[held], chosen), 4)})
    return out


def main() -> None:
    """Score the grid on every set, print the tables, write bench/results/fusion.json."""
    from flows.eval import interval

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--compare", type=Path, help="another eval workdir (another embedder): its vector column")
    args = parser.parse_args()
    table = scores(load_sets(args.workdir))
    if not table:
        sys.exit(f"no runs-default.json under {args.workdir}: run `inlet eval ... --keep-runs` first")
    methods = ["vector", "fulltext", *(label(p) for p in GRID)]
    print("| set | " + " | ".join(methods) + " |")
    print("|---|" + "---:|" * len(methods))
    for name, values in table.items():
        print(f"| {name} | " + " | ".join(f"{values[m].mean():.3f}" for m in methods) + " |")
    print("| mean of sets | " + " | ".join(f"{np.mean([v[m].mean() for v in table.values()]):.3f}"
                                          for m in methods) + " |")
    loso = leave_one_out(table)
    print("\n| held-out set | chosen on the others | nDCG@10 | gain over the better side |\n|---|---|---:|---:|")
    for row in loso:
        print(f"| {row['held_out']} | {row['chosen']} | {row['ndcg@10']:.3f} | {row['gain_over_better_side']:+.3f} |")
    result = {"sets": list(table), "means": {n: {m: round(float(v[m].mean()), 4) for m in methods}
                                             for n, v in table.items()}, "leave_one_out": loso}
    if args.compare:
        other = scores(load_sets(args.compare))
        print("\n| set | vector, this embedder (95% interval) | vector, the other (95% interval) |\n|---|---:|---:|")
        for name in table:
            if name in other:
                a, b = interval([table[name]["vector"]]), interval([other[name]["vector"]])
                print(f"| {name} | {a[0]:.3f} ({a[1]:.3f}-{a[2]:.3f}) | {b[0]:.3f} ({b[1]:.3f}-{b[2]:.3f}) |")
        result["compare"] = {n: round(float(v["vector"].mean()), 4) for n, v in other.items()}
    out = ROOT / "bench" / "results" / "fusion.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
