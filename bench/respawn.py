"""Benchmark: a run over PDFs whose parsing outlives a strict time limit, as a user runs it from the shell.

    .venv/bin/python bench/respawn.py --ref 3be7b56                 # this checkout and a worktree of 3be7b56
    .venv/bin/python bench/respawn.py --ref 3be7b56 --limit 48 --timeout 1 --reps 2

Every document past `extraction.timeout_s` has its extraction worker killed, and the next document waits
for a new one. The corpus: the first `--limit` PDFs of ../shared/corpora/pdf (sorted paths), copied; the
config: configs/inlet.yaml with that source, `extraction.timeout_s: --timeout`, and the hashing embedder
(this measures extraction and its workers; the model's seconds would be the same on both sides). Each rep
runs `inlet ingest --json` from the shell on an empty store, the checkouts alternating, against a Prefect
server started once. Reported: medians of wall time, the extract stage's seconds, and the documents
quarantined as timeout (each one a worker replaced). Writes bench/results/respawn.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PDFS = ROOT.parent / "shared" / "corpora" / "pdf"

from bench.cold import commit_of, prefect_server, timed_ingest, worktree  # noqa: E402


def corpus_files(limit: int) -> list[Path]:
    """The first `limit` PDFs under ../shared/corpora/pdf, by sorted path."""
    return sorted(PDFS.rglob("*.pdf"))[:limit]


def copy_corpus(files: list[Path], target: Path) -> None:
    """Copy files into target, keeping their paths below the PDF folder."""
    for path in files:
        dest = target / path.relative_to(PDFS)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)


def config_for(checkout: Path, state: Path, timeout_s: float) -> Path:
    """The checkout's shipped config, reading state/corpus under a time limit, hashing embedder, store in state."""
    import yaml

    data = yaml.safe_load((checkout / "configs" / "inlet.yaml").read_text(encoding="utf-8"))
    data["sources"] = [{"name": "pdfs", "path": str(state / "corpus"), "include": ["**/*.pdf"],
                        "metadata": {"language": "en"}}]
    data["extraction"]["timeout_s"] = timeout_s
    data["embedding"] = {"kind": "hashing", "dim": 384}
    data["store"].update(uri=str(state / "lancedb"), artifacts=str(state / "runs"))
    path = state / "inlet.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def one_run(checkout: Path, files: list[Path], work: Path, timeout_s: float, env: dict[str, str]) -> dict:
    """Index a fresh copy of the corpus from checkout on an empty store; wall, extract seconds and time-outs."""
    state = work / "state" / checkout.name
    shutil.rmtree(state, ignore_errors=True)
    copy_corpus(files, state / "corpus")
    wall, summary = timed_ingest(checkout, config_for(checkout, state, timeout_s), env)
    timeouts = sum(1 for q in summary.get("quarantined", []) if q.get("reason") == "timeout")
    return {"wall_s": wall, "extract_s": summary["stage_seconds"].get("extract", 0.0), "timeouts": timeouts,
            "docs_new": summary.get("docs_new"), "docs_quarantined": summary.get("docs_quarantined")}


def main() -> None:
    """Time this checkout and a worktree of --ref, alternating; print the medians."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", required=True, help="the commit to compare with (a worktree of it)")
    parser.add_argument("--limit", type=int, default=48, help="PDFs to index (default 48)")
    parser.add_argument("--timeout", type=float, default=1.0, help="extraction.timeout_s (default 1)")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    if not PDFS.is_dir():
        sys.exit(f"needs {PDFS} (the shared folder beside this checkout)")
    files = corpus_files(args.limit)
    work = Path(tempfile.mkdtemp(prefix="inlet-respawn-"))
    runs: dict[str, list[dict]] = {}
    with worktree(args.ref, work) as ref, prefect_server(work) as env:
        checkouts = {args.ref: ref, f"this checkout ({commit_of(ROOT)})": ROOT}  # distinct even when both are HEAD
        for rep in range(args.reps):
            for name, checkout in checkouts.items():
                runs.setdefault(name, []).append(one_run(checkout, files, work, args.timeout, env))
                print(json.dumps({"checkout": name, "rep": rep, **runs[name][-1]}), flush=True)
    out = ROOT / "bench" / "results" / "respawn.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"limit": args.limit, "timeout_s": args.timeout, "runs": runs}, indent=1))
    print(f"\n{len(files)} PDFs, extraction.timeout_s {args.timeout:g}, medians of {args.reps}:")
    print("| checkout | wall s | extract s | documents timed out (workers replaced) |")
    print("|---|---:|---:|---:|")
    for name, rows in runs.items():
        print(f"| {name} | {statistics.median(r['wall_s'] for r in rows):.1f} "
              f"| {statistics.median(r['extract_s'] for r in rows):.1f} "
              f"| {statistics.median(r['timeouts'] for r in rows):g} |")


if __name__ == "__main__":
    main()
