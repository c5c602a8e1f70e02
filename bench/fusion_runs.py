"""Build every eval set's store with two vector sides and keep each set's answers, for bench/fusion.py.

    .venv/bin/python bench/fusion_runs.py W                      # every set of ../shared/corpora/eval
    .venv/bin/python bench/fusion_runs.py W --max-queries 100    # quicker, noisier
    .venv/bin/python bench/fusion_runs.py W --embedders static,hashing   # weak vector sides only, no e5
    .venv/bin/python bench/fusion_runs.py W --cross-lingual --embedders e5   # XQuAD-R across languages

One `inlet eval` flow run over ../shared/corpora/eval (the shipped config, up to 400 queries a set, a
seeded sample) with two index variants from one extraction: "default" (the shipped e5 embedder) and
"static" (the static embedder: a weak vector side beside the same full-text index, the case where
full-text is far ahead). Each set's answers go to W/<set>/runs-<variant>.json; the eval report to
W/eval-<time>.json. Stores already built under W are reused (their ingest is a no-op). About 80 minutes
on two cores from nothing, most of it e5 embedding. --embedders names the main index's embedder and the
variants' (first the main one); a main index other than e5 keeps its runs as runs-<kind>.json, so that
bench/fusion.py labels its rows by their embedder.

--cross-lingual runs XQuAD-R's questions in one language against its paragraphs in another instead (CROSS_LINGUAL,
sets named xquad-x/<questions>-<paragraphs>, ~3 minutes with e5): the multilingual embedder reads both languages, while
full-text shares little more than names and numbers with the paragraphs. Vector search is then far ahead of
full-text, the case of the unseen English sets of issue 54 (vector ahead by 0.07-0.14), which no monolingual set here
shows. It also runs XQuAD-R's paragraphs as queries against the same paragraphs in another language (PARAGRAPH_PAIRS,
sets named xquad-p/<queries>-<paragraphs>): passage-long queries where vector search is ahead, beside ArguAna's, where
full-text is. The pairs are written under W/_pairs from ../shared/corpora/eval/xquad-r (never into the repository).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHIPPED = "e5"
CROSS_LINGUAL = (("en", "de"), ("de", "en"), ("en", "es"), ("ru", "en"))  # (questions, paragraphs)
CROSS_PREFIX = "xquad-x"
PARAGRAPH_PAIRS = (("de", "en"), ("zh", "en"), ("ru", "en"), ("en", "es"))  # (paragraphs asked, paragraphs searched)
PARAGRAPH_PREFIX = "xquad-p"


def _pair_folders(xquad: Path, into: Path, pairs: tuple[tuple[str, str], ...], needed: list[Path],
                  what: str) -> Iterator[tuple[str, str, Path]]:
    """Refuse (naming every missing file) unless all needed files are there, then yield each pair's folder
    into/<q>-<p>, p's paragraphs copied in as its corpus."""
    if missing := [str(path) for path in needed if not path.is_file()]:
        raise ValueError(f"missing for the {what}: {', '.join(dict.fromkeys(missing))}")
    for q, p in pairs:
        folder = into / f"{q}-{p}"
        (folder / "qrels").mkdir(parents=True, exist_ok=True)
        (folder / "corpus.jsonl").write_bytes((xquad / p / "corpus.jsonl").read_bytes())
        yield q, p, folder


def cross_lingual_sets(xquad: Path, into: Path, pairs: tuple[tuple[str, str], ...] = CROSS_LINGUAL) -> Path:
    """Write BEIR folders into/xquad-x/<q>-<p>: the paragraphs of language p, the questions of language q, and q's
    judgements pointed at the same paragraph in p (XQuAD-R's ids differ only by their language prefix); return into."""
    needed = [xquad / lang / name for q, p in pairs for lang, name in
              ((p, "corpus.jsonl"), (q, "queries.jsonl"), (q, "qrels/test.tsv"))]
    for q, p, folder in _pair_folders(xquad, into / CROSS_PREFIX, pairs, needed, "cross-lingual pairs"):
        (folder / "queries.jsonl").write_bytes((xquad / q / "queries.jsonl").read_bytes())
        qrels = xquad / q / "qrels" / "test.tsv"
        header, *lines = qrels.read_text(encoding="utf-8").splitlines()
        moved = []
        for number, line in enumerate(lines, 2):
            query, doc, score = (line.split("\t") + ["", "", ""])[:3]
            if not doc.startswith(f"{q}-"):
                raise ValueError(f"{qrels}:{number}: judged document {doc!r} is not of language {q!r}")
            moved.append(f"{query}\t{p}-{doc.removeprefix(f'{q}-')}\t{score}")
        (folder / "qrels" / "test.tsv").write_text("\n".join([header, *moved]) + "\n", encoding="utf-8")
    return into


def paragraph_sets(xquad: Path, into: Path, pairs: tuple[tuple[str, str], ...] = PARAGRAPH_PAIRS) -> Path:
    """Write BEIR folders into/xquad-p/<q>-<p>: language q's paragraphs asked (query id "q" + the paragraph's id) of
    language p's, each judged on its own translation (XQuAD-R's ids differ only by their language prefix); return
    into."""
    needed = [xquad / lang / "corpus.jsonl" for pair in pairs for lang in pair]
    for q, p, folder in _pair_folders(xquad, into / PARAGRAPH_PREFIX, pairs, needed, "paragraph pairs"):
        asked, judged = [], ["query-id\tcorpus-id\tscore"]
        path = xquad / q / "corpus.jsonl"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            doc = json.loads(line)
            if not str(doc.get("_id", "")).startswith(f"{q}-") or not doc.get("text"):
                raise ValueError(f"{path}:{number}: not a paragraph of language {q!r} with an id and a text")
            asked.append(json.dumps({"_id": f"q{doc['_id']}", "text": doc["text"]}, ensure_ascii=False))
            judged.append(f"q{doc['_id']}\t{p}-{doc['_id'].removeprefix(f'{q}-')}\t1")
        (folder / "queries.jsonl").write_text("\n".join(asked) + "\n", encoding="utf-8")
        (folder / "qrels" / "test.tsv").write_text("\n".join(judged) + "\n", encoding="utf-8")
    return into


def variants(kinds: list[str]) -> dict[str, dict]:
    """The eval flow's variants: "default" with the first embedder (the main index), one per other embedder."""
    main, *others = kinds
    return {"default": {} if main == SHIPPED else {"embedding": {"kind": main}},
            **{kind: {"embedding": {"kind": kind}} for kind in others}}


def main() -> None:
    """Run the eval flow with both variants and keep the runs."""
    from flows.eval import evaluate
    from inlet.cli import check_line

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--sets", type=Path, default=ROOT.parent / "shared" / "corpora" / "eval")
    parser.add_argument("--max-queries", type=int, default=400)
    parser.add_argument("--embedders", default=f"{SHIPPED},static",
                        help="comma-separated embedding kinds, the main index's first (default: e5,static)")
    parser.add_argument("--cross-lingual", action="store_true",
                        help="XQuAD-R's questions and paragraphs against its paragraphs in another language "
                        "(CROSS_LINGUAL, PARAGRAPH_PAIRS)")
    args = parser.parse_args()
    kinds = args.embedders.split(",")
    if not args.sets.is_dir():
        sys.exit(f"{args.sets}: no eval sets here (../shared/corpora/eval)")
    if args.cross_lingual:
        try:
            cross_lingual_sets(args.sets / "xquad-r", args.workdir / "_pairs")
            args.sets = paragraph_sets(args.sets / "xquad-r", args.workdir / "_pairs")
        except ValueError as exc:
            sys.exit(str(exc))
    report = evaluate(dataset=str(args.sets), workdir=str(args.workdir), max_queries=args.max_queries,
                      keep_runs=True, variants=variants(kinds))
    for check in report["checks"]:
        print(check_line(check))
    if kinds[0] != SHIPPED:  # name the main index's runs by its embedder, as bench/fusion.py labels rows
        for runs in args.workdir.rglob("runs-default.json"):
            runs.replace(runs.with_name(f"runs-{kinds[0]}.json"))
    print(f"written to {report['path']}")


if __name__ == "__main__":  # the extraction workers import this module again: only the parent runs the flow
    main()
