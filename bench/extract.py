"""Benchmark: extraction speed on ../shared/corpora: PDF pages/s, HTML, DOCX and Markdown documents/s.

    .venv/bin/python bench/extract.py                       # pdf, html, docx; 1 and 2 workers; 3 reps
    .venv/bin/python bench/extract.py --kinds pdf --workers 1 2 4 --reps 1 --limit 40
    .venv/bin/python bench/extract.py --kinds markdown --workers 1 --reps 5 --detect-language

Runs tasks.extract.extract_documents, the function behind the ingest flow's extract stage, over
every file of a kind: with one extraction worker process (single process) and with several
(parallel). Each configuration is timed `--reps` times in this process after one warm-up
document, so the forkserver's start-up (importing unstructured once, ~3-5 s) is reported apart.
Quarantined files (the corpora include some hard ones) count in documents/s but not in pages.
Markdown is read in the calling process (no worker), so its worker count changes nothing. The
documents' language is set (no detection) unless --detect-language, as a source without a
`language` would have it: the ingest bench's corpus is such a source.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CORPORA = ROOT.parent / "shared" / "corpora"
KINDS = {"pdf": ("pdf", "*.pdf"), "html": ("html", "*.htm*"), "docx": ("docx", "*.docx"),
         "markdown": ("markdown", "*.md")}
DEFAULT_KINDS = ["pdf", "html", "docx"]


def files_of(kind: str, limit: int | None) -> list[Path]:
    """Every file of a kind under ../shared/corpora, sorted, optionally the first `limit`."""
    folder, pattern = KINDS[kind]
    found = sorted(p for p in (CORPORA / folder).rglob(pattern) if p.is_file())
    return found[:limit] if limit else found


def pdf_pages(paths: list[Path]) -> dict[str, int]:
    """Page count per PDF (pypdf, empty password tried); 0 when it cannot tell."""
    from pypdf import PdfReader

    pages = {}
    for path in paths:
        try:
            reader = PdfReader(path)
            if reader.is_encrypted:
                reader.decrypt("")
            pages[str(path)] = len(reader.pages)
        except Exception:  # noqa: BLE001 - a damaged file simply has no page count here
            pages[str(path)] = 0
    return pages


def documents_table(paths: list[Path], language: str | None = "en") -> pa.Table:
    """The documents artifact extraction reads: every file new; language None has each one detected."""
    import pyarrow as pa

    from schemas.arrow import DOCUMENTS_SCHEMA

    rows = [{"doc_id": str(p), "source": "bench", "path": str(p), "uri": p.as_uri(), "size": p.stat().st_size,
             "mtime_ns": p.stat().st_mtime_ns, "access_level": "public", "language": language, "meta_hash": "b",
             "content_hash": "h", "change": "new"} for p in paths]
    return pa.Table.from_pylist(rows, schema=DOCUMENTS_SCHEMA)


def run(kind: str, paths: list[Path], workers: int, reps: int, pages: dict[str, int], detect: bool = False) -> dict:
    """Time extract_documents over paths with `workers` worker processes."""
    from schemas.config import ExtractionConfig
    from tasks.extract import extract_documents

    cfg = ExtractionConfig(workers=workers, timeout_s=300)
    table = documents_table(paths, None if detect else "en")
    seconds, ok_pages, quarantined = [], 0, 0
    for _ in range(reps):
        start = time.perf_counter()
        _, extracted = extract_documents(table, cfg)
        seconds.append(time.perf_counter() - start)
        statuses = dict(zip(extracted["doc_id"].to_pylist(), extracted["status"].to_pylist()))
        quarantined = sum(s == "quarantined" for s in statuses.values())
        ok_pages = sum(pages.get(d, 0) for d, s in statuses.items() if s == "ok")
    median = statistics.median(seconds)
    out = {"kind": kind, "workers": workers, "detect_language": detect, "files": len(paths), "quarantined": quarantined,
           "seconds_median": round(median, 2), "seconds": [round(s, 2) for s in seconds],
           "docs_per_s": round(len(paths) / median, 2)}
    if kind == "pdf":
        out |= {"pages": ok_pages, "pages_per_s": round(ok_pages / median, 1)}
    return out


def main() -> None:
    """Parse arguments, warm the worker start-up, time every kind and worker count, print a table and JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="+", default=DEFAULT_KINDS, choices=list(KINDS))
    parser.add_argument("--detect-language", action="store_true", help="leave the language unset: detect it")
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="only the first N files of each kind")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "extract.json")
    args = parser.parse_args()
    if not CORPORA.is_dir():
        sys.exit(f"{CORPORA} is not present")

    import providers  # noqa: F401 - offline switches
    from schemas.config import ExtractionConfig
    from tasks.extract import extract_documents

    start = time.perf_counter()
    warm = files_of("html", 1)
    extract_documents(documents_table(warm), ExtractionConfig(workers=1))
    startup = time.perf_counter() - start
    print(f"worker start-up (forkserver importing unstructured, first document): {startup:.1f} s")
    results = []
    for kind in args.kinds:
        paths = files_of(kind, args.limit)
        pages = pdf_pages(paths) if kind == "pdf" else {}
        for workers in args.workers:
            result = run(kind, paths, workers, args.reps, pages, args.detect_language)
            results.append(result)
            rate = f"{result['pages_per_s']} pages/s ({result['pages']} pages), " if kind == "pdf" else ""
            print(f"{kind:5} workers={workers}: {result['files']} files in {result['seconds_median']} s (median of "
                  f"{args.reps}): {rate}{result['docs_per_s']} docs/s; {result['quarantined']} quarantined", flush=True)
        single = next((r for r in results if r["kind"] == kind and r["workers"] == 1), None)
        for r in results:
            if single and r["kind"] == kind and r["workers"] > 1:
                r["speedup_vs_1"] = round(single["seconds_median"] / r["seconds_median"], 2)
                print(f"{kind:5} workers={r['workers']}: {r['speedup_vs_1']}x one worker")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"startup_s": round(startup, 2), "results": results}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
