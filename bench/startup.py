"""Benchmark: how long the command line takes to answer, start-up included (what a user waits for).

    .venv/bin/python bench/startup.py                        # this checkout, 7 reps
    git worktree add /tmp/old <commit>
    .venv/bin/python bench/startup.py --compare /tmp/old     # alternating with another checkout

Ingests data/sample once (hashing embedder), then times `inlet versions` and `inlet query` as
whole processes, each checkout's run alternating with the other's so that a noisy machine hits
both alike. Medians and, with --compare, the ratio. A checkout runs with its own code: the
command is started in its folder, which Python puts first on the import path.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {"versions": ["versions"], "query": ["query", "How do I winterize the outboard engine?", "-k", "1"]}


def _inlet(checkout: Path, args: list[str], config: Path, env: dict[str, str]) -> float:
    """Run one inlet command from a checkout; return its wall seconds."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "inlet.cli", *args, "--config", str(config)], cwd=checkout, env=env,
                         capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{checkout}: inlet {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return took


def main() -> None:
    """Parse arguments, ingest the sample once and time the commands."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--compare", type=Path, help="another checkout of Inlet to time against this one")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="inlet-startup-"))
    try:
        corpus = work / "corpus"
        shutil.copytree(ROOT / "data" / "sample", corpus)
        config = work / "inlet.yaml"
        config.write_text(f"sources:\n  - {{name: sample, path: '{corpus}'}}\nembedding: {{kind: hashing, dim: 64}}\n"
                          f"store: {{uri: '{work / 'lancedb'}', artifacts: '{work / 'runs'}'}}\n", encoding="utf-8")
        env = {**os.environ, "PREFECT_HOME": str(work / "prefect")}
        _inlet(ROOT, ["ingest", "--quiet"], config, env)
        checkouts = [ROOT, *([args.compare.resolve()] if args.compare else [])]
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.reps):
            for name, command in COMMANDS.items():
                for checkout in checkouts:
                    times.setdefault((str(checkout), name), []).append(_inlet(checkout, command, config, env))
        print("| checkout | command | median s | min-max s |\n|---|---|---:|---:|")
        for (checkout, name), values in times.items():
            print(f"| {checkout} | {name} | {statistics.median(values):.2f} | {min(values):.2f}-{max(values):.2f} |")
        if args.compare:
            for name in COMMANDS:
                ours, theirs = (statistics.median(times[(str(c), name)]) for c in checkouts)
                print(f"{name}: {theirs / ours:.2f}x faster than {args.compare}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
