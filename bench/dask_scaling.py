"""Benchmark: the Dask runner with 1 and 2 local workers on CPU-bound extraction (PDFs of ../shared/corpora).

    .venv/bin/python bench/dask_scaling.py                     # PDFs, 3 reps per worker count
    .venv/bin/python bench/dask_scaling.py --formats pdf,docx --reps 1

Each measured run is a cold ingest in its own process (bench/ingest.py's worker) against one Prefect
server this script starts; the runs alternate between 1 and 2 workers, so the machine's drift falls on
both. The figure is the batch span (the first batch's start to the last one's end): the batches' own
work, without the local cluster's start-up. Throughput ratio: the median span with 1 worker over the
median with 2. In a Dask worker (a daemonic process) documents are partitioned in the worker itself, so
one worker is one core of extraction. Hashing embedder, enrichment off, the peers' chunk settings.
Writes bench/results/dask-scaling.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
CORPORA = ROOT.parent / "shared" / "corpora"
EXTENSIONS = {"pdf": ("pdf",), "docx": ("docx",), "html": ("html", "htm")}


def _bench_ingest() -> ModuleType:
    """bench/ingest.py as a module, loaded by path (bench/ on sys.path would shadow the query package)."""
    spec = importlib.util.spec_from_file_location("inlet_bench_ingest", Path(__file__).resolve().parent / "ingest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_config(state: Path, formats: list[str], workers: int, batch_docs: int) -> Path:
    """A cold-ingest config over the chosen formats of ../shared/corpora on a local Dask cluster of workers."""
    import yaml

    data = {
        "sources": [{"name": fmt, "path": str(CORPORA / fmt), "include": [f"**/*.{ext}" for ext in EXTENSIONS[fmt]]}
                    for fmt in formats],
        "chunking": {"max_tokens": 512, "overlap_tokens": 64},
        "enrichment": {"enabled": False},
        "embedding": {"kind": "hashing", "dim": 384},
        "store": {"uri": str(state / "store" / "lancedb"), "artifacts": str(state / "store" / "runs")},
        "execution": {"task_runner": "dask", "workers": workers, "batch_docs": batch_docs},
    }
    state.mkdir(parents=True, exist_ok=True)
    path = state / "inlet.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def summarize(runs: list[dict]) -> dict:
    """Median batch span per worker count and the throughput ratio of 2 workers over 1. Pure."""
    spans = {n: [r["batch_span_s"] for r in runs if r["workers"] == n] for n in sorted({r["workers"] for r in runs})}
    medians = {n: statistics.median(v) for n, v in spans.items()}
    ratio = medians[1] / medians[2] if 1 in medians and 2 in medians else None
    return {"spans": spans, "median_span_s": medians, "ratio_2_over_1": ratio}


def main() -> None:
    """Measure, print a Markdown table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default="pdf", help=f"comma-separated, of {', '.join(EXTENSIONS)}")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch-docs", type=int, default=12)
    args = parser.parse_args()
    if not CORPORA.is_dir():
        sys.exit(f"{CORPORA} is not here: nothing to measure")
    formats = args.formats.split(",")
    helpers = _bench_ingest()
    with tempfile.TemporaryDirectory(prefix="inlet-dask-") as tmp:
        work = Path(tmp)
        server, url, _ = helpers.start_prefect_server(work / "prefect-home")
        env = {**os.environ, "PREFECT_API_URL": url, "PYTHONPATH": str(ROOT)}
        runs = []
        try:
            for rep in range(args.reps):
                for workers in (1, 2):
                    state = work / f"w{workers}-{rep}"
                    config = write_config(state, formats, workers, args.batch_docs)
                    result = helpers.measure(config, env, work)
                    seconds = result["stage_seconds"]
                    runs.append({"workers": workers, "rep": rep, "batch_span_s": seconds["batch span"],
                                 "pipeline_s": result["pipeline_s"], "extract_s_summed": seconds.get("extract", 0.0),
                                 "documents": result["docs_new"], "quarantined": result["docs_quarantined"],
                                 "chunks": result["chunks_written"]})
                    print(f"{workers} worker(s), rep {rep}: batch span {seconds['batch span']:.2f} s, "
                          f"{result['docs_new']} documents, {result['docs_quarantined']} quarantined", flush=True)
        finally:
            server.terminate()
            server.wait(timeout=30)
    summary = summarize(runs)
    print(f"\n`bench/dask_scaling.py --formats {args.formats} --reps {args.reps} --batch-docs {args.batch_docs}`\n")
    print("| local Dask workers | batch span s | median | throughput |\n|---:|---|---:|---:|")
    for n, spans in summary["spans"].items():
        ratio = summary["median_span_s"][1] / summary["median_span_s"][n] if 1 in summary["median_span_s"] else 1.0
        print(f"| {n} | {', '.join(f'{s:.2f}' for s in spans)} | {summary['median_span_s'][n]:.2f} | {ratio:.2f}x |")
    out = ROOT / "bench" / "results" / "dask-scaling.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"formats": formats, "batch_docs": args.batch_docs, "runs": runs, **summary},
                              indent=1, default=str))


if __name__ == "__main__":
    main()
