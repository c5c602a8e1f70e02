"""Benchmark: the whole of ../shared/corpora, good and bad files together, ingested in one run.

    .venv/bin/python bench/corpora.py                 # thread runner, 2 extraction workers
    .venv/bin/python bench/corpora.py --runner process

One folder source over every corpus folder (Markdown, HTML, PDF, DOCX, text, the bad inputs, the
Cranfield files) and one bundle source per llms-full.txt file; hashing embedder, enrichment off
(this measures extraction and the pipeline, not a model). Checks after the run: every file has a
documents row, either indexed with its chunks all in the chunks table or quarantined with a known
reason; a sample of indexed documents is found by a full-text search for a phrase of their own.
Prints a summary and writes bench/results/corpora.json.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CORPORA = ROOT.parent / "shared" / "corpora"


def write_config(work: Path, runner: str, workers: int) -> Path:
    """One folder source over the corpora (bundles apart) and a bundle source per llms-full file."""
    import yaml

    bundles = sorted((CORPORA / "llms-full").glob("*.txt"))
    data = {
        "sources": [{"name": "corpora", "path": str(CORPORA), "include": ["**/*"],
                     "exclude": ["llms-full/**"], "max_delete_share": 1.0},
                    *({"name": f"bundle-{p.stem.split('-')[0]}", "kind": "bundle", "path": str(p)} for p in bundles)],
        "extraction": {"workers": 2, "timeout_s": 120},
        "enrichment": {"enabled": False},
        "embedding": {"kind": "hashing", "dim": 384},
        "execution": {"task_runner": runner, "workers": workers},
        "store": {"uri": str(work / "lancedb"), "artifacts": str(work / "runs")},
    }
    path = work / "inlet.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def check(config: Path, sample: int) -> dict:
    """Every document indexed with all its chunks or quarantined with a known reason; a sample found by search."""
    import lancedb

    from query import search
    from schemas.config import load_config
    from schemas.errors import EXTRACTION_REASONS

    cfg = load_config(config)
    db = lancedb.connect(cfg.store.uri)
    docs = db.open_table("documents").to_arrow().to_pylist()
    chunks = db.open_table("chunks").to_arrow().select(["doc_id", "text"]).to_pylist()
    per_doc: dict[str, list[str]] = {}
    for row in chunks:
        per_doc.setdefault(row["doc_id"], []).append(row["text"])
    reasons = Counter(d["error"].split(":", 1)[0] for d in docs if d["status"] == "quarantined")
    unknown = {r for r in reasons if r not in EXTRACTION_REASONS and r != "invalid"}
    ok = [d for d in docs if d["status"] == "ok"]
    short = [d["doc_id"] for d in ok if len(per_doc.get(d["doc_id"], [])) != d["total_chunks"]]
    rng = random.Random(7)
    found, tried = 0, 0
    for doc in rng.sample(ok, min(sample, len(ok))):
        words = [w for w in " ".join(per_doc.get(doc["doc_id"], [""])).split() if w.isalpha() and len(w) > 3]
        if len(words) < 8:
            continue
        start = rng.randrange(0, len(words) - 6)
        tried += 1
        hits = search(" ".join(words[start:start + 6]), k=10, mode="fulltext", config=config)
        found += any(h.doc_id == doc["doc_id"] for h in hits)
    return {"documents": len(docs), "indexed": len(ok), "quarantined": sum(reasons.values()),
            "reasons": dict(reasons.most_common()), "unknown_reasons": sorted(unknown),
            "indexed_with_missing_chunks": short, "chunks": len(chunks), "search_sample": tried,
            "search_found": found}


def main() -> None:
    """Run the flow once over the corpora and check the result."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runner", choices=["thread", "process", "dask"], default="thread")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sample", type=int, default=300, help="indexed documents checked by a search")
    args = parser.parse_args()
    if not CORPORA.is_dir():
        sys.exit(f"needs {CORPORA} (the shared folder beside this checkout)")
    work = Path(tempfile.mkdtemp(prefix="inlet-corpora-", dir="/work" if Path("/work").is_dir() else None))
    config = write_config(work, args.runner, args.workers)
    started = time.perf_counter()
    from flows.ingest import ingest

    imported = time.perf_counter()
    summary = ingest(config_path=str(config))
    done = time.perf_counter()
    result = {
        "runner": args.runner, "workers": args.workers, "import_s": round(imported - started, 1),
        "flow_s": round(done - imported, 1), "pipeline_s": summary["pipeline_seconds"],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "peak_rss_children_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
        "docs_new": summary["docs_new"], "docs_quarantined": summary["docs_quarantined"],
        "chunks_written": summary["chunks_written"], "stage_seconds": summary["stage_seconds"],
        "notices": summary["notices"], **check(config, args.sample),
    }
    out = ROOT / "bench" / "results" / "corpora.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "stage_seconds"}, indent=1))


if __name__ == "__main__":
    main()
