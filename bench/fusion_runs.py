"""Build every eval set's store with two vector sides and keep each set's answers, for bench/fusion.py.

    .venv/bin/python bench/fusion_runs.py W                      # every set of ../shared/corpora/eval
    .venv/bin/python bench/fusion_runs.py W --max-queries 100    # quicker, noisier

One `inlet eval` flow run over ../shared/corpora/eval (the shipped config, up to 400 queries a set, a
seeded sample) with two index variants from one extraction: "default" (the shipped e5 embedder) and
"static" (the static embedder: a weak vector side beside the same full-text index, the case where
full-text is far ahead). Each set's answers go to W/<set>/runs-<variant>.json; the eval report to
W/eval-<time>.json. Stores already built under W are reused (their ingest is a no-op). About 80 minutes
on two cores from nothing, most of it e5 embedding.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANTS = {"default": {}, "static": {"embedding": {"kind": "static"}}}


def main() -> None:
    """Run the eval flow with both variants and keep the runs."""
    from flows.eval import evaluate
    from inlet.cli import check_line

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--sets", type=Path, default=ROOT.parent / "shared" / "corpora" / "eval")
    parser.add_argument("--max-queries", type=int, default=400)
    args = parser.parse_args()
    if not args.sets.is_dir():
        sys.exit(f"{args.sets}: no eval sets here (../shared/corpora/eval)")
    report = evaluate(dataset=str(args.sets), workdir=str(args.workdir), max_queries=args.max_queries,
                      keep_runs=True, variants=VARIANTS)
    for check in report["checks"]:
        print(check_line(check))
    print(f"written to {report['path']}")


if __name__ == "__main__":  # the extraction workers import this module again: only the parent runs the flow
    main()
