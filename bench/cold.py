"""Benchmark: a cold index of ../shared/corpora/markdown with the shipped config, timed as a user runs it.

    .venv/bin/python bench/cold.py                    # this checkout
    .venv/bin/python bench/cold.py --ref 27713a7      # then a worktree of that commit, one after the other
    .venv/bin/python bench/cold.py --ref 27713a7 --ref-only   # only that worktree (bench/results/cold-27713a7.json)

Each checkout: a fresh copy of the corpus and an empty store, configs/inlet.yaml with only its source and
store paths changed (e5, keyword enrichment, GX checks), `inlet ingest --json` in a new process against
a Prefect server started once (as `make server` starts it). Reported: wall time from the shell, the run's
pipeline seconds and stage seconds (summed over batches), and the model's share: the seconds spent in
embedding model calls over the pipeline's. Writes bench/results/cold.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CORPUS = ROOT.parent / "shared" / "corpora" / "markdown"

from bench.freshness import start_prefect  # noqa: E402


def shipped_config(checkout: Path, state: Path) -> Path:
    """The checkout's shipped config, reading the corpus copy in state and writing its store there."""
    import yaml

    data = yaml.safe_load((checkout / "configs" / "inlet.yaml").read_text(encoding="utf-8"))
    data["sources"] = [{"name": "docs", "path": str(state / "corpus"), "include": ["**/*.md"]}]
    data["store"].update(uri=str(state / "lancedb"), artifacts=str(state / "runs"))
    path = state / "inlet.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def cold_run(checkout: Path, work: Path, env: dict[str, str]) -> dict:
    """Index a fresh copy of the corpus from checkout; return wall time, the run summary's timings and the model share."""
    state = work / "state" / checkout.name  # beside the worktrees, never one of them
    shutil.rmtree(state, ignore_errors=True)
    shutil.copytree(CORPUS, state / "corpus")
    config = shipped_config(checkout, state)
    wall, summary = timed_ingest(checkout, config, env)
    stages = summary["stage_seconds"]
    pipeline = summary.get("pipeline_seconds") or sum(stages.values())
    # "embed model": the model calls alone ("embed" adds the cache look-ups around them).
    embed = stages.get("embed model", stages.get("embed", 0.0))
    return {"checkout": str(checkout), "commit": commit_of(checkout), "wall_s": round(wall, 1),
            "pipeline_s": round(pipeline, 1), "embed_s": round(embed, 1),
            "model_share": round(embed / pipeline, 3) if pipeline else None,
            "texts_embedded": summary.get("texts_embedded"), "chunks_written": summary.get("chunks_written"),
            "docs_new": summary.get("docs_new"), "stage_seconds": stages}


def timed_ingest(checkout: Path, config: Path, env: dict[str, str]) -> tuple[float, dict]:
    """Run `inlet ingest --json` from checkout in a new process; its wall seconds and summary (stage seconds a dict)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "inlet.cli", "ingest", "--json", "--config", str(config)],
                          cwd=checkout, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"inlet ingest failed in {checkout}:\n{done.stderr[-4000:]}")
    summary = json.loads(done.stdout[done.stdout.index("{"):])
    stages = summary.get("stage_seconds") or {}
    summary["stage_seconds"] = json.loads(stages) if isinstance(stages, str) else stages
    return wall, summary


@contextmanager
def worktree(ref: str | None, work: Path) -> Iterator[Path | None]:
    """A git worktree of ref at work/ref-<ref> (None: no ref), removed afterwards."""
    if ref is None:
        yield None
        return
    tree = work / f"ref-{ref}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), ref], cwd=ROOT, check=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


@contextmanager
def prefect_server(work: Path) -> Iterator[dict[str, str]]:
    """A Prefect server started once for every command (as `make server` starts it); its client environment."""
    env, server = start_prefect(work / "prefect")
    try:
        yield env
    finally:
        server.terminate()


def commit_of(checkout: Path) -> str:
    """The checkout's short commit id."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True,
                          check=True).stdout.strip()


def main() -> None:
    """Run the cold index here (and in a worktree of --ref), print a table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", help="also a worktree of this commit, after this checkout")
    parser.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--ref-only", action="store_true", help="time only the worktree of --ref")
    args = parser.parse_args()
    if not CORPUS.is_dir():
        sys.exit(f"needs {CORPUS} (the shared folder beside this checkout)")
    work = Path(args.work or tempfile.mkdtemp(prefix="inlet-cold-"))
    work.mkdir(parents=True, exist_ok=True)
    checkouts = [] if args.ref_only else [ROOT]
    if args.ref:
        checkouts.append(work / f"ref-{args.ref}")
    rows = []
    with worktree(args.ref, work), prefect_server(work) as env:
        for checkout in checkouts:
            rows.append(cold_run(checkout, work, env))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "stage_seconds"}), flush=True)
    out = ROOT / "bench" / "results" / (f"cold-{args.ref}.json" if args.ref_only else "cold.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print("| commit | wall s | pipeline s | embed s | model share | texts embedded | chunks |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['commit']} | {r['wall_s']} | {r['pipeline_s']} | {r['embed_s']} | {r['model_share']} "
              f"| {r['texts_embedded']} | {r['chunks_written']} |")
    if len(rows) == 2:
        print(f"\nthis checkout vs {args.ref}: {rows[1]['wall_s'] / rows[0]['wall_s']:.2f}x faster (wall)")


if __name__ == "__main__":
    main()
