"""Retrieval evaluation flow: ingest a judged corpus through the ingest flow, run every query, score each mode."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.ingest import DEFAULT_CONFIG, ingest
from query.metrics import mean_metrics
from query.search import fuse, search
from schemas.config import load_config
from schemas.errors import ConfigError

MODES = ("vector", "fulltext", "hybrid")
EVAL_SOURCE = "eval"


@dataclass
class Dataset:
    """Documents to index (empty when the config's own sources are the corpus), queries and judgements."""

    name: str
    documents: list[dict] = field(default_factory=list)  # {_id, title, text}
    queries: dict[str, str] = field(default_factory=dict)
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)


def _jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                msg = f"{path}:{number}: not a JSON object: {exc.msg}"
                raise ConfigError(msg) from None
    return rows


def load_beir(folder: Path, split: str = "test") -> Dataset:
    """Read corpus.jsonl, queries.jsonl and qrels/<split>.tsv (query-id, corpus-id, score; a header line)."""
    qrels: dict[str, dict[str, int]] = {}
    with (folder / "qrels" / f"{split}.tsv").open(encoding="utf-8") as fh:
        for number, row in enumerate(csv.DictReader(fh, delimiter="\t"), 2):
            try:
                qrels.setdefault(str(row["query-id"]), {})[str(row["corpus-id"])] = int(row["score"])
            except (KeyError, TypeError, ValueError):
                msg = f"{folder / 'qrels' / f'{split}.tsv'}:{number}: expected query-id, corpus-id and an integer score"
                raise ConfigError(msg) from None
    queries = {str(q["_id"]): q["text"] for q in _jsonl(folder / "queries.jsonl")}
    documents = [{"_id": str(d["_id"]), "title": d.get("title") or "", "text": d.get("text") or ""}
                 for d in _jsonl(folder / "corpus.jsonl")]
    return Dataset(folder.name, documents, {q: t for q, t in queries.items() if q in qrels}, qrels)


def load_questions_csv(path: Path) -> Dataset:
    """Read a CSV with columns question and gold (doc ids or paths, ';'-separated) over the config's own sources."""
    queries, qrels = {}, {}
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or not {"question", "gold"} <= set(reader.fieldnames):
            msg = f"{path}: needs the columns question and gold, has {reader.fieldnames}"
            raise ConfigError(msg)
        for i, row in enumerate(reader, 1):
            queries[str(i)] = row["question"]
            qrels[str(i)] = {g.strip(): 1 for g in row["gold"].split(";") if g.strip()}
    return Dataset(path.stem, [], queries, qrels)


def load_dataset(path: str | Path) -> Dataset:
    """Load a BEIR folder or a questions CSV."""
    path = Path(path)
    if path.is_dir():
        missing = [n for n in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv") if not (path / n).is_file()]
        if missing:
            msg = f"{path}: a BEIR folder needs {', '.join(missing)}"
            raise ConfigError(msg)
        return load_beir(path)
    if path.suffix.lower() == ".csv" and path.is_file():
        return load_questions_csv(path)
    msg = f"{path}: neither a BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv) nor a questions CSV"
    raise ConfigError(msg)


def write_corpus(documents: list[dict], folder: Path) -> None:
    """Write each document as <id>.md (title as heading); unchanged files are left alone, so re-runs are no-ops."""
    folder.mkdir(parents=True, exist_ok=True)
    for doc in documents:
        body = (f"# {doc['title'].strip()}\n\n" if doc["title"].strip() else "") + doc["text"].strip() + "\n"
        target = folder / f"{doc['_id']}.md"
        if not target.is_file() or target.read_text(encoding="utf-8") != body:
            target.write_text(body, encoding="utf-8")


def _merge(base: dict, overrides: dict) -> dict:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def eval_config(base_path: Path, dataset: Dataset, workdir: Path, variants: dict[str, dict]) -> Path:
    """Write the config the dataset is ingested with: the base config, the dataset's corpus, its own store,
    and every variant but "default" (the main index) as an index variant sharing one extraction."""
    data = yaml.safe_load(base_path.read_text(encoding="utf-8")) or {}
    base_dir = base_path.resolve().parent
    if dataset.documents:
        data["sources"] = [{"name": EVAL_SOURCE, "path": str(workdir / "corpus"), "include": ["*.md"]}]
    else:  # the config's own sources are the corpus: make their paths absolute for the new config's folder
        data["sources"] = [{**s, "path": str((base_dir / s["path"]).resolve())} for s in data.get("sources", [])]
    for section in ("enrichment",):  # a relative prompt path is relative to the base config
        prompt = (data.get(section) or {}).get("prompt")
        if prompt:
            data[section]["prompt"] = str((base_dir / prompt).resolve())
    data = _merge(data, variants.get("default", {}))
    data["variants"] = {name: overrides for name, overrides in variants.items() if name != "default"}
    data["store"] = {**data.get("store", {}), "uri": str(workdir / "lancedb"), "artifacts": str(workdir / "runs"),
                     "chunks_table": "chunks"}
    path = workdir / "inlet.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _gold_id(doc_id: str, dataset: Dataset) -> str:
    """Map a store doc id to the dataset's document id."""
    if dataset.documents:  # eval:<id>.md
        return doc_id.split(":", 1)[1].removesuffix(".md")
    return doc_id


def _match_gold(ranked: list[str], gold: dict[str, int]) -> list[str]:
    """Let CSV gold entries name a document by its id, or by a path its id ends with."""
    out = []
    for doc in ranked:
        named = next((g for g in gold if doc == g or doc.endswith("/" + g) or doc.endswith(":" + g)), None)
        out.append(named or doc)
    return out


def documents_in_order(chunk_ids: list[str], doc_of: dict[str, str]) -> list[str]:
    """Turn a chunk ranking into a document ranking: each document at its best chunk's place."""
    return list(dict.fromkeys(doc_of[c] for c in chunk_ids))


@task(name="run queries", cache_policy=NO_CACHE)
def run_queries(config_path: str, dataset: Dataset, depth: int, variant: str | None) -> dict[str, dict[str, list[str]]]:
    """Return per query the chunk rankings of each side and the chunk -> document map, for fusion later."""
    out: dict[str, dict] = {}
    for qid, text in dataset.queries.items():
        dense = search(text, k=depth, mode="vector", clearance="confidential", config=config_path, variant=variant)
        sparse = search(text, k=depth, mode="fulltext", clearance="confidential", config=config_path,
                        variant=variant)
        out[qid] = {"vector": [h.chunk_id for h in dense], "fulltext": [h.chunk_id for h in sparse],
                    "doc_of": {h.chunk_id: h.doc_id for h in [*dense, *sparse]}}
    return out


def score(rankings: dict[str, dict], dataset: Dataset, mode: str, weights: tuple[float, float], rrf_k: int,
          k: int) -> dict[str, float]:
    """Score one mode (and fusion weights) over every query."""
    runs = {}
    for qid, r in rankings.items():
        if mode == "hybrid":
            fused = fuse([(weights[0], r["vector"]), (weights[1], r["fulltext"])], rrf_k)
            chunks = sorted(fused, key=lambda c: (-fused[c], c))
        else:
            chunks = r[mode]
        docs = [_gold_id(d, dataset) for d in documents_in_order(chunks, r["doc_of"])]
        runs[qid] = _match_gold(docs, dataset.qrels.get(qid, {})) if not dataset.documents else docs
    return mean_metrics(runs, dataset.qrels, k)


@flow(name="eval", log_prints=True)
def evaluate(dataset: str, config_path: str = str(DEFAULT_CONFIG), workdir: str | None = None,
             variants: dict[str, dict] | None = None, modes: tuple[str, ...] = MODES, k: int = 10,
             depth: int = 100, sweep: list[tuple[float, float]] | None = None) -> dict:
    """Ingest the dataset per variant, run every query in each mode, report recall@k, MRR@10 and nDCG@10.

    variants: name -> overrides of chunking, enrichment and embedding (e.g. {"merged": {"chunking":
    {"merge_small_sections": True}}}); "default" names the main index. All are built in one store
    under workdir from one extraction, each in its own tables. sweep: (vector, fulltext) weight pairs tried for
    hybrid; the best per variant is reported. Results go to <workdir>/eval-<time>.json and to the
    'retrieval-eval' table artifact.
    """
    logger = get_run_logger()
    data = load_dataset(dataset)
    base = Path(config_path)
    artifacts = load_config(base).store.artifacts
    default = Path("data") if "://" in artifacts else Path(artifacts).parent
    work = Path(workdir) if workdir else default / "eval" / data.name
    if data.documents:
        write_corpus(data.documents, work / "corpus")
    rows = []
    best: dict[str, dict] = {}
    variants = variants or {"default": {}}
    cfg_path = eval_config(base, data, work, variants)
    ingest(config_path=str(cfg_path))  # every variant from one extraction
    for variant in variants:
        qcfg = load_config(cfg_path).query
        rankings = run_queries(str(cfg_path), data, depth, None if variant == "default" else variant)
        weight_sets = [(qcfg.vector_weight, qcfg.fulltext_weight), *(sweep or [])]
        for mode in modes:
            for weights in (dict.fromkeys(weight_sets) if mode == "hybrid" else [None]):
                metrics = score(rankings, data, mode, weights or (1.0, 1.0), qcfg.rrf_k, k)
                row = {"variant": variant, "mode": mode, "weights": list(weights) if weights else None, **metrics}
                rows.append(row)
                if mode == "hybrid" and row["ndcg@10"] > best.get(variant, {}).get("ndcg@10", -1.0):
                    best[variant] = row
        logger.info("variant %s: %s", variant, "; ".join(
            f"{r['mode']}{r['weights'] or ''} nDCG@10 {r['ndcg@10']:.3f}" for r in rows if r["variant"] == variant))
    report = {"dataset": data.name, "queries": len(data.queries), "k": k, "results": rows, "best_hybrid": best,
              "at": datetime.now(UTC).isoformat(timespec="seconds")}
    out = work / f"eval-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    create_table_artifact(key="retrieval-eval", description=f"Retrieval evaluation on {data.name}",
                          table=[{**r, "weights": str(r["weights"] or "")} for r in rows])
    return {**report, "path": str(out)}
