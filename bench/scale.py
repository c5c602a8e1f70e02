"""Benchmark: cold ingest, no-op re-run, 1% edited and peak memory at 10k and 100k documents generated from real ones.

    .venv/bin/python bench/scale.py --docs 10000
    .venv/bin/python bench/scale.py --docs 100000 --runner process

Documents are the 1,384 Markdown files of ../shared/corpora/markdown, cycled: copy k of a file gets a
first line naming the copy and a paragraph of its own at the end, so its chunks are not all the
same texts as the original's (the first and last chunk of each copy are new). The peers' chunk
settings (512 tokens, 64 overlap), hashing embedder, enrichment off. Each run is its own process
(start-up reported apart); peak RSS is the run's own and its largest worker's. Writes
bench/results/scale-<docs>.json. The cold run also counts the distinct texts it stored (texts_stored):
texts_embedded beyond those went to the model twice (or belong to a document that validation
quarantined after its embedding). At 10k and 100k the two are equal. The 1% run follows the no-op: every
100th file (in path order) gets a paragraph appended, so its last chunk or two are new texts and the rest
of the store is untouched: its time and texts embedded show whether work follows the change or the store.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpora" / "markdown"


def generate(target: Path, docs: int) -> int:
    """Write docs Markdown files under target, cycling the real corpus; return their total bytes."""
    sources = sorted(CORPUS.rglob("*.md"))
    total = 0
    for n in range(docs):
        src = sources[n % len(sources)]
        copy = n // len(sources)
        text = src.read_text(encoding="utf-8", errors="replace")
        if copy:
            text = f"Copy {copy} of {src.name}.\n\n{text}\n\nThis is copy {copy} of {src.stem}, page {n}.\n"
        out = target / f"{copy:03d}" / src.relative_to(CORPUS)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        total += len(text.encode())
    return total


def edit_one_percent(corpus: Path) -> int:
    """Append a paragraph to every 100th Markdown file under corpus; return how many were edited."""
    files = sorted(corpus.rglob("*.md"))[::100]
    for path in files:
        with path.open("a", encoding="utf-8") as fh:
            fh.write(f"\n\nEdited for the 1% run: {path.stem} now ends with this paragraph.\n")
    return len(files)


def _rss_mb() -> tuple[float, float]:
    """This process's resident MB: anonymous memory, and files mapped in (libraries, data files read by mmap)."""
    with open("/proc/self/status") as fh:
        kb = {line.split(":")[0]: int(line.split()[1]) for line in fh if line.startswith(("RssAnon", "RssFile"))}
    return kb["RssAnon"] / 1024, kb["RssFile"] / 1024


def sample_rss(timeline: list[tuple[float, float, float]], stop: threading.Event, every_s: float = 0.05) -> None:
    """Record (seconds since start, RSS MB, of which file-backed MB) until stop is set: where the peak is and what."""
    start = time.perf_counter()
    while not stop.wait(every_s):
        anon, files = _rss_mb()
        timeline.append((round(time.perf_counter() - start, 2), round(anon + files), round(files)))


def worker(config: str, out: str) -> None:
    """One measured run: the flow once, with its timings, counts and peak memory."""
    start = time.perf_counter()
    from flows.ingest import ingest

    imported = time.perf_counter()
    timeline: list[tuple[float, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_rss, args=(timeline, stop), daemon=True)
    sampler.start()
    summary = ingest(config_path=config)
    done = time.perf_counter()
    stop.set()
    sampler.join()
    peak_at = max(timeline, key=lambda p: p[1]) if timeline else (0, 0, 0)
    Path(out).write_text(json.dumps({
        "import_s": round(imported - start, 2), "flow_s": round(done - imported, 2),
        "pipeline_s": summary["pipeline_seconds"],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "peak_rss_children_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
        "docs_new": summary["docs_new"], "docs_changed": summary["docs_changed"],
        "docs_unchanged": summary["docs_unchanged"], "chunks_added": summary["chunks_added"],
        "chunks_removed": summary["chunks_removed"],
        "chunks_written": summary["chunks_written"], "texts_embedded": summary["texts_embedded"],
        "stage_seconds": summary["stage_seconds"], "versions": summary["versions"],
        "rss_after_import_mb": round(timeline[0][1]) if timeline else None,
        "peak_sampled_at_s": peak_at[0], "peak_sampled_file_mb": peak_at[2],
        "max_file_mb": max((p[2] for p in timeline), default=0), "rss_timeline": timeline[::10]}))


def distinct_texts(store: Path) -> int:
    """Distinct embed keys in the chunks table: what a cold run should have sent to the embedder, once each."""
    import lancedb
    import pyarrow.compute as pc

    keys = lancedb.connect(str(store)).open_table("chunks").search().select(["embed_key"]).limit(None).to_arrow()
    return len(pc.unique(keys["embed_key"]))


def main() -> None:
    """Generate the corpus, then time a cold ingest, a no-op re-run and a 1% edit."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--runner", choices=["thread", "process", "dask"], default="thread")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the generated corpus and store (path printed)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    if not CORPUS.is_dir():
        sys.exit(f"needs {CORPUS} (the shared folder beside this checkout)")
    import yaml

    work = Path(tempfile.mkdtemp(prefix=f"inlet-scale-{args.docs}-", dir="/work" if Path("/work").is_dir() else None))
    corpus_bytes = generate(work / "corpus", args.docs)
    config = work / "inlet.yaml"
    config.write_text(yaml.safe_dump({
        "sources": [{"name": "gen", "path": str(work / "corpus"), "include": ["**/*.md"]}],
        "chunking": {"max_tokens": 512, "overlap_tokens": 64}, "enrichment": {"enabled": False},
        "embedding": {"kind": "hashing", "dim": 384},
        "execution": {"task_runner": args.runner, "workers": args.workers},
        "store": {"uri": str(work / "store" / "lancedb"), "artifacts": str(work / "store" / "runs")}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results = {"docs": args.docs, "corpus_mb": round(corpus_bytes / 2**20, 1), "runner": args.runner}
    for scenario in ("cold", "noop", "1pct"):
        if scenario == "1pct":
            results["edited"] = edit_one_percent(work / "corpus")
        out = work / f"{scenario}.json"
        start = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--worker", str(config), str(out)], cwd=ROOT, env=env, check=True)
        results[scenario] = {**json.loads(out.read_text()), "process_wall_s": round(time.perf_counter() - start, 2)}
        if scenario == "cold":  # texts sent to the model against distinct texts stored: a repeat shows as a surplus
            results[scenario]["texts_stored"] = distinct_texts(work / "store" / "lancedb")
        shown = {k: v for k, v in results[scenario].items() if k != "rss_timeline"}
        print(scenario, json.dumps(shown), flush=True)
    dest = ROOT / "bench" / "results" / f"scale-{args.docs}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(results, indent=1))
    if args.keep:
        print("kept", work)
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
