"""Benchmark: LanceDB full-text tokenizer options on every eval set, BM25 alone, document level.

    .venv/bin/python bench/fulltext.py                   # 300 queries a set (seeded), all sets
    .venv/bin/python bench/fulltext.py --queries 0       # every query

Each set's documents (title and text, one row each, no chunking) go into a LanceDB table; for each
tokenizer setting the full-text index is rebuilt and every query asked; nDCG@10 of the ids returned.
Settings: the index Inlet built before issue 38 (LanceDB's default: simple tokenizer, English
stemming and stop words), ICU word segmentation split again at punctuation (icu/split) unstemmed,
stemmed in English, and stemmed in the set's own language where LanceDB has a stemmer (Inlet's
choice: the store's most common language). Writes bench/results/fulltext.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EVAL = ROOT.parent / "shared" / "corpora" / "eval"


def settings(language: str | None) -> dict[str, dict]:
    """The tokenizer settings compared, by name (the set's own language only where LanceDB stems it)."""
    from schemas.config import FTS_LANGUAGES

    out = {"simple, English (before)": {},
           "icu/split, plain": {"base_tokenizer": "icu/split", "stem": False, "remove_stop_words": False},
           "icu/split, English": {"base_tokenizer": "icu/split"}}
    if language in FTS_LANGUAGES and language != "en":
        out["icu/split, own language (Inlet)"] = {"base_tokenizer": "icu/split", "language": FTS_LANGUAGES[language]}
    elif language == "en":
        out["icu/split, own language (Inlet)"] = out["icu/split, English"]
    else:
        out["icu/split, own language (Inlet)"] = out["icu/split, plain"]
    return out


SET_LANGUAGE = {"cranfield": "en", "scifact": "en", "cmrc2018": "zh", "jaquad": "ja"}


def run_set(folder: Path, name: str, queries: int) -> dict[str, float]:
    """nDCG@10 of each setting on one set."""
    import lancedb
    import pyarrow as pa
    from lancedb.index import FTS

    from flows.eval import load_beir
    from query.metrics import ndcg_at

    data = load_beir(folder)
    ids = sorted(data.queries)
    if queries:
        ids = sorted(random.Random(0).sample(ids, min(queries, len(ids))))
    language = SET_LANGUAGE.get(name, name.rsplit("/", 1)[-1])
    with tempfile.TemporaryDirectory() as tmp:
        table = lancedb.connect(tmp).create_table("t", pa.table({
            "id": [d["_id"] for d in data.documents],
            "text": [f"{d['title']}\n{d['text']}".strip() for d in data.documents]}))
        out = {}
        for label, options in settings(language).items():
            table.create_index("text", config=FTS(with_position=False, **options), replace=True)
            found = [table.search(data.queries[q], query_type="fts", fts_columns="text").limit(10).select(["id"])
                     .to_arrow()["id"].to_pylist() for q in ids]
            out[label] = round(sum(ndcg_at(f, data.qrels[q], 10) for f, q in zip(found, ids, strict=True)) / len(ids), 4)
    return out


def main() -> None:
    """Run every set, print a table, write bench/results/fulltext.json."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=300, help="queries a set, a seeded sample (0: all)")
    args = parser.parse_args()
    if not EVAL.is_dir():
        sys.exit(f"needs {EVAL} (the shared folder beside this checkout)")
    sets = sorted(p.parent for p in EVAL.rglob("corpus.jsonl"))
    results = {}
    for folder in sets:
        name = folder.relative_to(EVAL).as_posix()
        results[name] = run_set(folder, name, args.queries)
        print(name, results[name], flush=True)
    labels = list(next(iter(results.values())))
    print("\n| set | " + " | ".join(labels) + " |\n|---|" + "---:|" * len(labels))
    for name, row in results.items():
        print(f"| {name} | " + " | ".join(f"{row[label]:.3f}" for label in labels) + " |")
    out = ROOT / "bench" / "results" / "fulltext.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
