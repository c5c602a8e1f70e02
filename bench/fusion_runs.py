"""Build every eval set's store with two vector sides and keep each set's answers, for bench/fusion.py.

    .venv/bin/python bench/fusion_runs.py W                      # every set of ../shared/corpora/eval
    .venv/bin/python bench/fusion_runs.py W --max-queries 100    # quicker, noisier
    .venv/bin/python bench/fusion_runs.py W --embedders static,hashing   # weak vector sides only, no e5

One `inlet eval` flow run over ../shared/corpora/eval (the shipped config, up to 400 queries a set, a
seeded sample) with two index variants from one extraction: "default" (the shipped e5 embedder) and
"static" (the static embedder: a weak vector side beside the same full-text index, the case where
full-text is far ahead). Each set's answers go to W/<set>/runs-<variant>.json; the eval report to
W/eval-<time>.json. Stores already built under W are reused (their ingest is a no-op). About 80 minutes
on two cores from nothing, most of it e5 embedding. --embedders names the main index's embedder and the
variants' (first the main one); a main index other than e5 keeps its runs as runs-<kind>.json, so that
bench/fusion.py labels its rows by their embedder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHIPPED = "e5"


def variants(kinds: list[str]) -> dict[str, dict]:
    """The eval flow's variants: "default" with the first embedder (the main index), one per other embedder."""
    main, *others = kinds
    return {"default": {} if main == SHIPPED else {"embedding": {"kind": main}},
            **{kind: {"embedding": {"kind": kind}} for kind in others}}


def main() -> None:
    """Run the eval flow with both variants and keep the runs."""
    from flows.eval import evaluate
    from inlet.cli import check_line

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--sets", type=Path, default=ROOT.parent / "shared" / "corpora" / "eval")
    parser.add_argument("--max-queries", type=int, default=400)
    parser.add_argument("--embedders", default=f"{SHIPPED},static",
                        help="comma-separated embedding kinds, the main index's first (default: e5,static)")
    args = parser.parse_args()
    kinds = args.embedders.split(",")
    if not args.sets.is_dir():
        sys.exit(f"{args.sets}: no eval sets here (../shared/corpora/eval)")
    report = evaluate(dataset=str(args.sets), workdir=str(args.workdir), max_queries=args.max_queries,
                      keep_runs=True, variants=variants(kinds))
    for check in report["checks"]:
        print(check_line(check))
    if kinds[0] != SHIPPED:  # name the main index's runs by its embedder, as bench/fusion.py labels rows
        for runs in args.workdir.rglob("runs-default.json"):
            runs.replace(runs.with_name(f"runs-{kinds[0]}.json"))
    print(f"written to {report['path']}")


if __name__ == "__main__":  # the extraction workers import this module again: only the parent runs the flow
    main()
