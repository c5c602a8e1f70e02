"""Benchmark: the whole of ../shared/corpora, good and bad files together, ingested in one run.

    .venv/bin/python bench/corpora.py                 # thread runner, 2 extraction workers
    .venv/bin/python bench/corpora.py --runner process

One folder source over every corpus folder (Markdown, HTML, PDF, DOCX, text, the bad inputs, the
Cranfield files) and one bundle source per llms-full.txt file; hashing embedder, enrichment off
(this measures extraction and the pipeline, not a model). Checks after the run: every file has a
documents row, either indexed with its chunks all in the chunks table or quarantined with a known
reason; every indexed document is found by a full-text search for six words of its own (see check()).
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

import regex  # tiktoken's own dependency: Unicode classes that re lacks

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


# Tokens as LanceDB's simple tokenizer cuts them: runs of letters, digits and combining marks (an Arabic
# vowel sign stays inside its word). A query word: a token of 4 to 40 letters (with their marks).
TOKEN = regex.compile(r"[\p{L}\p{M}\p{N}]+")
WORD = regex.compile(r"(?:\p{L}\p{M}*){4,40}")


def _words(text: str) -> set[str]:
    """The query words of a text: its tokens that are words of four letters or more, lower-cased."""
    return {t.lower() for t in TOKEN.findall(text) if WORD.fullmatch(t)}


def _query_for(texts: list[str], df: Counter[str], rng: random.Random) -> tuple[str, bool]:
    """A document's query and whether it has words to rank by (else its longest tokens, for the searchable test)."""
    worded = [t for t in texts if _words(t)]
    if worded:
        return " ".join(sorted(_words(rng.choice(worded)), key=lambda w: (df[w], w))[:6]), True
    tokens = {t.lower() for text in texts for t in TOKEN.findall(text)}  # numbers, short words only
    return " ".join(sorted(tokens, key=lambda t: (-len(t), t))[:6]), False


def search_check(config: Path, docs: list[dict], per_doc: dict[str, list[str]], df: Counter[str],
                 rng: random.Random) -> dict:
    """Search for each document by its own rarest words: restricted to it (searchable) and unrestricted (rank).

    The document is "found" when it is in the top 10; "shared" when it is not, but every top-10 hit holds
    all six words too (a page duplicated ten times or more); "outranked" otherwise (other chunks score
    higher on BM25), with the query kept. Apart from the rank, the search restricted to the document
    must return it: "unsearchable" lists any it does not. A document without a word of four letters
    (numbers, short words only) is searched for by its longest tokens, for that test alone ("no_word").
    """
    from query import search

    outcome: Counter[str] = Counter()
    outranked, unsearchable, no_word = [], [], []
    for doc in docs:
        query, ranked = _query_for(per_doc.get(doc["doc_id"], []), df, rng)
        own = search(query, k=1, where={"doc_id": doc["doc_id"]}, mode="fulltext", config=config) if query else []
        if not own:
            unsearchable.append({"doc_id": doc["doc_id"], "query": query})
        if not ranked:
            no_word.append(doc["doc_id"])
            continue
        hits = search(query, k=10, mode="fulltext", config=config)
        if any(h.doc_id == doc["doc_id"] for h in hits):
            outcome["found"] += 1
        elif len(hits) == 10 and all(_words(query) <= _words(h.text) for h in hits):
            outcome["shared"] += 1
        else:
            outcome["outranked"] += 1
            outranked.append({"doc_id": doc["doc_id"], "query": query, "hits": [h.doc_id for h in hits]})
    return {"search_checked": len(docs), "search_found": outcome["found"], "search_shared": outcome["shared"],
            "search_outranked": outcome["outranked"], "outranked": outranked,
            "searchable": len(docs) - len(unsearchable), "unsearchable": unsearchable,
            "no_word": len(no_word), "no_word_docs": no_word}


def check(config: Path, sample: int | None) -> dict:
    """Every document indexed with all its chunks or quarantined with a known reason; each indexed one searchable.

    The search part (search_check) takes the six rarest words (of four letters or more, by how many
    chunks hold them) of one of the document's chunks, as a user who remembers what was particular to
    a page would ask; every indexed document, or a sample.
    """
    import lancedb

    from schemas.config import load_config
    from schemas.errors import EXTRACTION_REASONS

    cfg = load_config(config)
    db = lancedb.connect(cfg.store.uri)
    docs = db.open_table("documents").to_arrow().to_pylist()
    chunks = db.open_table("chunks").to_arrow().select(["doc_id", "text"]).to_pylist()
    per_doc: dict[str, list[str]] = {}
    df: Counter[str] = Counter()
    for row in chunks:
        per_doc.setdefault(row["doc_id"], []).append(row["text"])
        df.update(_words(row["text"]))
    reasons = Counter(d["error"].split(":", 1)[0] for d in docs if d["status"] == "quarantined")
    unknown = {r for r in reasons if r not in EXTRACTION_REASONS and r != "invalid"}
    ok = [d for d in docs if d["status"] == "ok"]
    short = [d["doc_id"] for d in ok if len(per_doc.get(d["doc_id"], [])) != d["total_chunks"]]
    rng = random.Random(7)
    tried = rng.sample(ok, min(sample, len(ok))) if sample else ok
    return {"documents": len(docs), "indexed": len(ok), "quarantined": sum(reasons.values()),
            "reasons": dict(reasons.most_common()), "unknown_reasons": sorted(unknown),
            "indexed_with_missing_chunks": short, "chunks": len(chunks),
            **search_check(config, tried, per_doc, df, rng)}


def main() -> None:
    """Run the flow once over the corpora and check the result."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runner", choices=["thread", "process", "dask"], default="thread")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sample", type=int, default=None, help="check this many indexed documents (default all)")
    parser.add_argument("--check-only", type=Path, default=None, metavar="CONFIG",
                        help="only run the checks on the store of an earlier run's config")
    args = parser.parse_args()
    if not CORPORA.is_dir():
        sys.exit(f"needs {CORPORA} (the shared folder beside this checkout)")
    if args.check_only:
        print(json.dumps(check(args.check_only, args.sample), indent=1))
        return
    work = Path(tempfile.mkdtemp(prefix="inlet-corpora-", dir="/work" if Path("/work").is_dir() else None))
    config = write_config(work, args.runner, args.workers)
    started = time.perf_counter()
    from flows.ingest import ingest

    imported = time.perf_counter()
    summary = ingest(config_path=str(config))
    done = time.perf_counter()
    result = {
        "config": str(config), "runner": args.runner, "workers": args.workers, "import_s": round(imported - started, 1),
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
