"""Benchmark: what Prefect costs a small run, against a local Prefect server like the one bench/ingest.py starts.

    .venv/bin/python bench/prefect_api.py            # 15 reps of each measure

Three measures, medians in ms, inside one flow run:
- a stage call (an Inlet stage as a Prefect task, doing nothing);
- a table and a markdown artifact posted against an idle server (after a 1 s pause);
- the same two posted right after 13 stage calls, about what a 1% run makes before its report: the server
  is then still taking those task runs' events, on the same two cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What a 1% run makes before its report: crawl, detect, batch + its 6 stages (extract, chunk, refresh, enrich, embed,
# validate), upsert, publish.
TASKS_BEFORE_REPORT = 11


def measure(reps: int) -> dict[str, float]:
    """Run the measures in one flow run (this process talks to PREFECT_API_URL); return medians in ms."""
    from prefect import flow, task
    from prefect.artifacts import create_markdown_artifact, create_table_artifact
    from prefect.cache_policies import NO_CACHE

    @task(name="nothing", cache_policy=NO_CACHE)  # as Inlet's stages are declared
    def nothing(path: str) -> dict:
        return {"path": path}

    table = [{"metric": f"metric {i}", "value": i} for i in range(40)]  # about a run summary's size

    def post() -> tuple[float, float]:
        start = time.perf_counter()
        create_table_artifact(key="bench-table", table=table)
        middle = time.perf_counter()
        create_markdown_artifact(key="bench-markdown", markdown="## Quarantined documents (0)\n\nNone.")
        return middle - start, time.perf_counter() - middle

    @flow(name="bench-prefect-api")
    def run() -> dict[str, list[float]]:
        out: dict[str, list[float]] = {k: [] for k in ("stage call", "table idle", "markdown idle",
                                                       "table after tasks", "markdown after tasks")}
        for _ in range(reps):
            time.sleep(1.0)
            table_s, markdown_s = post()
            out["table idle"].append(table_s)
            out["markdown idle"].append(markdown_s)
            for _ in range(TASKS_BEFORE_REPORT):
                start = time.perf_counter()
                nothing("a/path")
                out["stage call"].append(time.perf_counter() - start)
            table_s, markdown_s = post()
            out["table after tasks"].append(table_s)
            out["markdown after tasks"].append(markdown_s)
        return out

    return {k: round(statistics.median(v) * 1000, 1) for k, v in run().items()}


def main() -> None:
    """Start a Prefect server, measure in a child process against it, print the medians."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(measure(args.reps))
        return
    sys.path.insert(0, str(ROOT / "bench"))
    from ingest import start_prefect_server

    with tempfile.TemporaryDirectory(prefix="inlet-bench-api-") as work:
        server, url, _ = start_prefect_server(Path(work) / "prefect-home")
        try:
            env = {**os.environ, "PREFECT_API_URL": url, "PYTHONPATH": str(ROOT), "PREFECT_LOGGING_LEVEL": "WARNING"}
            out = subprocess.run([sys.executable, __file__, "--child", "--reps", str(args.reps)], env=env, cwd=ROOT,
                                 capture_output=True, text=True, check=True)
            print(out.stdout.strip().splitlines()[-1])
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
