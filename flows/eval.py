"""Retrieval evaluation flow: ingest a judged corpus through the ingest flow, run every query, score each mode."""

from __future__ import annotations

import csv
import functools
import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import yaml
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.datasets import Dataset, load_questions_csv
from flows.ingest import DEFAULT_CONFIG, ingest
from query.fusion import fuse_sides, ranked
from query.metrics import match_gold, mrr_at, ndcg_at, recall_at
from query.search import UNREAD_LANGUAGE, VECTOR_SIDE_FOR_LANGUAGE, search
from schemas.config import EMBEDDER_FUSION, QueryConfig, load_config
from schemas.errors import ConfigError

MODES = ("vector", "fulltext", "hybrid")
# Chunks each mode returns per query; their documents, in order, are the ranking scored at 10. Enough for
# ten distinct documents on the eval sets (most documents are one to three chunks).
K_CHUNKS = 30
BOOTSTRAP = 1000  # resamples per interval
EVAL_SOURCE = "eval"


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


def load_dataset(path: str | Path) -> Dataset:
    """Load a BEIR folder or a questions CSV."""
    path = Path(path)
    if path.is_dir():
        missing = [n for n in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv") if not (path / n).is_file()]
        if missing:
            msg = f"{path}: a BEIR folder needs {', '.join(missing)}"
            raise ConfigError(msg)
        data = load_beir(path)
    elif path.suffix.lower() == ".csv" and path.is_file():
        data = load_questions_csv(path)
    else:
        msg = f"{path}: neither a BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv) nor a questions CSV"
        raise ConfigError(msg)
    if not any(data.qrels.get(q) for q in data.queries):
        msg = f"{path}: no question has a judged document (gold / qrels): nothing to score"
        raise ConfigError(msg)
    return data


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


def documents_in_order(chunk_ids: list[str], doc_of: dict[str, str]) -> list[str]:
    """Turn a chunk ranking into a document ranking: each document at its best chunk's place."""
    return list(dict.fromkeys(doc_of[c] for c in chunk_ids))


def sample_queries(dataset: Dataset, max_queries: int | None, seed: int = 0) -> list[str]:
    """The query ids to run: all, or max_queries of them drawn at random (seeded: the same ones every time)."""
    ids = sorted(dataset.queries)
    if max_queries is None or len(ids) <= max_queries:
        return ids
    return sorted(random.Random(seed).sample(ids, max_queries))


@dataclass
class QueryRun:
    """One query's answers: each side's candidates with scores, the default mode's chunks, their documents, and
    whether search read its vector side whole, as far as languages go: the embedder reads the query's language and
    the full-text candidates' (None: not recorded, in runs saved before it was)."""

    vector: list[tuple[str, float]]
    fulltext: list[tuple[str, float]]
    default: list[str]
    doc_of: dict[str, str]
    vector_read: bool | None = None


@task(name="run queries", cache_policy=NO_CACHE)
def run_queries(config_path: str, dataset: Dataset, query_ids: list[str], k_chunks: int,
                variant: str | None) -> dict[str, QueryRun]:
    """Ask every query three times through query.search: vector, full-text and the config's default mode.

    The sides are asked for as many candidates as a hybrid search of k_chunks fetches, so that fusions
    other than the default can be scored on exactly the candidates query.search would fuse.
    """
    depth = k_chunks * load_config(Path(config_path)).query.candidates
    out: dict[str, QueryRun] = {}
    for qid in query_ids:
        text = dataset.queries[qid]
        ask = functools.partial(search, text, clearance="confidential", config=config_path, variant=variant)
        dense, sparse, default = ask(k=depth, mode="vector"), ask(k=depth, mode="fulltext"), ask(k=k_chunks)
        out[qid] = QueryRun([(h.chunk_id, h.score) for h in dense], [(h.chunk_id, h.score) for h in sparse],
                            [h.chunk_id for h in default],
                            {h.chunk_id: _gold_id(h.doc_id, dataset) for h in [*dense, *sparse, *default]},
                            not any(UNREAD_LANGUAGE in n for n in dense.notices)
                            and not any(VECTOR_SIDE_FOR_LANGUAGE in n for n in default.notices))
    return out


def mode_chunks(run: QueryRun, mode: str, k_chunks: int, fusion: dict | None = None) -> list[str]:
    """The chunks a mode ranks for one query: a side's first k_chunks, the default's, or a fusion of the sides."""
    if mode == "default":
        return run.default
    if mode in ("vector", "fulltext"):
        return [c for c, _ in getattr(run, mode)[:k_chunks]]
    return ranked(fuse_sides(run.vector, run.fulltext, **(fusion or {})), k_chunks)


def per_query(runs: dict[str, QueryRun], dataset: Dataset, mode: str, k_chunks: int, k: int = 10,
              fusion: dict | None = None) -> dict[str, np.ndarray]:
    """nDCG@10, recall@k and MRR@10 of each query (in runs' order) for one mode."""
    values: dict[str, list[float]] = {"ndcg@10": [], f"recall@{k}": [], "mrr@10": []}
    for qid, run in runs.items():
        docs = documents_in_order(mode_chunks(run, mode, k_chunks, fusion), run.doc_of)
        gold = dataset.qrels.get(qid, {})
        docs = match_gold(docs, gold) if not dataset.documents else docs
        values["ndcg@10"].append(ndcg_at(docs, gold, 10))
        values[f"recall@{k}"].append(recall_at(docs, gold, k))
        values["mrr@10"].append(mrr_at(docs, gold, 10))
    return {name: np.asarray(v, dtype=np.float64) for name, v in values.items()}


def bootstrap_means(groups: list[np.ndarray], resamples: int = BOOTSTRAP, seed: int = 0) -> np.ndarray:
    """Resampled means of the groups' means (each group's queries drawn with replacement within the group)."""
    rng = np.random.default_rng(seed)
    means = np.zeros(resamples)
    for values in groups:
        picks = rng.integers(0, len(values), size=(resamples, len(values)))
        means += values[picks].mean(axis=1)
    return means / len(groups)


def interval(groups: list[np.ndarray], resamples: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float, float]:
    """The mean of the groups' means and its 95% bootstrap interval (percentiles 2.5 and 97.5)."""
    means = bootstrap_means(groups, resamples, seed)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(np.mean([v.mean() for v in groups])), float(lo), float(hi)


def _row(set_name: str, variant: str, mode: str, values: list[dict[str, np.ndarray]], **extra: object) -> dict:
    row: dict = {"set": set_name, "variant": variant, "mode": mode, **extra}
    for metric in values[0]:
        mean, lo, hi = interval([v[metric] for v in values])
        row |= {metric: round(mean, 4), f"{metric}_lo": round(lo, 4), f"{metric}_hi": round(hi, 4)}
    row["queries"] = sum(len(v["ndcg@10"]) for v in values)
    return row


# Sides further apart than this in nDCG@10 "disagree": there the default must reach the better side outright, not
# only within the interval (issue 54's rule), since a fusion that follows the weak side shows there first.
DISAGREE_GAP = 0.05


def default_check(values: dict[str, dict[str, np.ndarray]]) -> dict:
    """Is the default at least the better of its sides? The paired 95% interval of default minus the better side,
    the gap between the sides (vector minus full-text), and whether the default reached the better side's mean."""
    means = {m: float(values[m]["ndcg@10"].mean()) for m in ("vector", "fulltext", "default")}
    better = max(("vector", "fulltext"), key=means.__getitem__)
    diff = values["default"]["ndcg@10"] - values[better]["ndcg@10"]
    _, lo, hi = interval([diff])
    gap = means["vector"] - means["fulltext"]
    disagree, reached = abs(gap) > DISAGREE_GAP, means["default"] >= means[better]
    return {"better_side": better, "default_minus_better": round(float(diff.mean()), 4),
            "diff_lo": round(lo, 4), "diff_hi": round(hi, 4), "not_worse": bool(hi >= 0),
            "vector_minus_fulltext": round(gap, 4), "disagree": bool(disagree), "reached_better": bool(reached),
            "ok": bool(hi >= 0 and (reached or not disagree))}


def save_runs(runs: dict[str, QueryRun], data: Dataset, path: Path) -> None:
    """Write one set's answers and judgements as JSON: {"qrels": ..., "runs": {qid: QueryRun fields}}."""
    payload = {"set": data.name, "questions_csv": not data.documents, "qrels": {q: data.qrels.get(q, {}) for q in runs},
               "runs": {q: {"vector": r.vector, "fulltext": r.fulltext, "default": r.default, "doc_of": r.doc_of,
                            "vector_read": r.vector_read} for q, r in runs.items()}}
    path.write_text(json.dumps(payload), encoding="utf-8")


def load_runs(path: Path) -> tuple[dict[str, QueryRun], Dataset]:
    """Read what save_runs wrote back into runs and a dataset holding their judgements."""
    payload = json.loads(path.read_text(encoding="utf-8"))
    runs = {q: QueryRun([tuple(x) for x in r["vector"]], [tuple(x) for x in r["fulltext"]], r["default"],
                        r["doc_of"], r.get("vector_read")) for q, r in payload["runs"].items()}
    # A BEIR set's corpus is not needed again (the runs hold its own doc ids), but its being non-empty is what
    # tells per_query not to match gold paths as it does for a questions CSV.
    corpus = [] if payload["questions_csv"] else [{"_id": "", "title": "", "text": ""}]
    return runs, Dataset(payload["set"], corpus, {q: q for q in runs}, payload["qrels"])


def score_variant(runs: dict[str, QueryRun], data: Dataset, set_name: str, variant: str, modes: tuple[str, ...],
                  sweep: list[tuple[float, float]] | None, qcfg: QueryConfig, k_chunks: int, k: int,
                  ) -> tuple[list[dict], dict[str, dict[str, np.ndarray]], dict]:
    """Rows for one set and variant (each mode, the default, and each swept hybrid weighting), the per-query
    values of vector, full-text and the default, and the check of the default against its better side."""
    values = {mode: per_query(runs, data, mode, k_chunks, k) for mode in ("vector", "fulltext", "default")}
    rows = [_row(set_name, variant, mode, [values[mode]]) for mode in [*(m for m in modes if m != "hybrid"), "default"]]
    for weights in (sweep or []) if "hybrid" in modes else []:
        fusion = {"method": qcfg.fusion, "vector_weight": weights[0], "fulltext_weight": weights[1],
                  "rrf_k": qcfg.rrf_k, "agreement": qcfg.agreement, "temperature": qcfg.temperature}
        rows.append(_row(set_name, variant, "hybrid", [per_query(runs, data, "hybrid", k_chunks, k, fusion)],
                         weights=list(weights)))
    return rows, values, {"set": set_name, "variant": variant, **default_check(values)}


def find_sets(path: Path) -> list[tuple[str, Path]]:
    """A BEIR folder, or every BEIR folder under path (by relative name, e.g. xquad-r/ar), or a questions CSV."""
    if path.is_dir() and not (path / "corpus.jsonl").is_file():
        found = sorted(p.parent for p in path.rglob("corpus.jsonl"))
        if found:
            return [(p.relative_to(path).as_posix(), p) for p in found]
    return [(path.stem if path.is_file() else path.name, path)]


def eval_root(config_path: Path) -> Path:
    """Where evaluations build their stores by default: eval/ beside the artifacts (data/eval for remote stores)."""
    artifacts = load_config(config_path).store.artifacts
    return (Path("data") if "://" in artifacts else Path(artifacts).parent) / "eval"


def build_store(base: Path, data: Dataset, work: Path, variants: dict[str, dict]) -> Path:
    """Write the set's corpus under work (a BEIR set) and ingest it with every variant; return the eval config."""
    if data.documents:
        write_corpus(data.documents, work / "corpus")
    cfg_path = eval_config(base, data, work, variants)
    ingest(config_path=str(cfg_path))  # every variant from one extraction
    return cfg_path


def best_hybrid(rows: list[dict]) -> dict[str, dict]:
    """Per variant, the swept hybrid row with the best nDCG@10 (the first of equals)."""
    best: dict[str, dict] = {}
    for row in rows:
        if row["mode"] == "hybrid" and row["ndcg@10"] > best.get(row["variant"], {}).get("ndcg@10", -1.0):
            best[row["variant"]] = row
    return best


@flow(name="eval", log_prints=True)
def evaluate(dataset: str, config_path: str = str(DEFAULT_CONFIG), workdir: str | None = None,
             variants: dict[str, dict] | None = None, modes: tuple[str, ...] = MODES, k: int = 10,
             k_chunks: int = K_CHUNKS, sweep: list[tuple[float, float]] | None = None,
             max_queries: int | None = None, keep_runs: bool = False) -> dict:
    """Ingest each data set per variant, ask every query through query.search, report nDCG@10, recall@k, MRR@10.

    dataset: a BEIR folder, a folder of BEIR folders (every one under it is evaluated, e.g.
    ../shared/corpora/eval), or a questions CSV over the config's own sources. Each mode (vector,
    full-text and the config's default mode, as `query.search` runs it) returns k_chunks chunks per
    query; their documents in order are scored. Means carry a 95% bootstrap interval over the queries;
    "overall" is the mean over the sets (each set resampled within itself). Per set, the default is
    checked against the better of its sides (a paired interval). variants: name -> overrides of
    chunking, enrichment and embedding ("default" names the main index); each set is built in one
    store under workdir from one extraction. sweep: (vector, fulltext) weight pairs scored for hybrid
    with the configured fusion, on the same candidates. max_queries: a seeded sample of each set's
    queries. Results go to <workdir>/eval-<time>.json and the 'retrieval-eval' table artifact;
    keep_runs: each set's answers (both sides' candidates with scores, the default's chunks) go to
    <set's workdir>/runs-<variant>.json too, for bench/fusion.py to score other fusions on.
    """
    logger = get_run_logger()
    base = Path(config_path)
    root = Path(workdir) if workdir else eval_root(base)
    variants = variants or {"default": {}}
    rows, checks = [], []
    values_of: dict[tuple[str, str], list[dict[str, np.ndarray]]] = {}  # (variant, mode) -> per set values
    sets = find_sets(Path(dataset))
    for set_name, path in sets:
        data = load_dataset(path)
        work = root / set_name if len(sets) > 1 or workdir is None else root
        cfg_path = build_store(base, data, work, variants)
        cfg = load_config(cfg_path)
        query_ids = sample_queries(data, max_queries)
        for variant in variants:
            kind = (cfg if variant == "default" else cfg.variant(variant)).embedding.kind
            qcfg = cfg.query.for_embedder(kind)  # the sweep fuses as search does over this variant's index
            runs = run_queries(str(cfg_path), data, query_ids, k_chunks, None if variant == "default" else variant)
            if keep_runs:
                save_runs(runs, data, work / f"runs-{variant}.json")
            scored, values, check = score_variant(runs, data, set_name, variant, modes, sweep, qcfg, k_chunks, k)
            rows += scored
            checks.append(check)
            for mode in ("vector", "fulltext", "default"):
                values_of.setdefault((variant, mode), []).append(values[mode])
            logger.info("%s, %s: %s", set_name, variant, "; ".join(
                f"{r['mode']}{r.get('weights') or ''} nDCG@10 {r['ndcg@10']:.3f}" for r in scored))
    if len(sets) > 1:
        rows += [_row("overall", variant, mode, groups) for (variant, mode), groups in values_of.items()]
    report = {"dataset": Path(dataset).name, "sets": [name for name, _ in sets], "k": k, "k_chunks": k_chunks,
              "max_queries": max_queries, "queries": sum(r["queries"] for r in rows if r["set"] != "overall"
                                                         and r["mode"] == "default"),
              "results": rows, "checks": checks, "best_hybrid": best_hybrid(rows),
              "at": datetime.now(UTC).isoformat(timespec="seconds")}
    return {**report, "path": str(publish_report(report, root))}


def publish_report(report: dict, root: Path) -> Path:
    """Write the report to <root>/eval-<time>.json and show its rows as the 'retrieval-eval' table artifact."""
    out = root / f"eval-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    create_table_artifact(key="retrieval-eval", description=f"Retrieval evaluation on {report['dataset']} "
                          f"({len(report['sets'])} set(s)); 95% bootstrap intervals", table=[
                              {**r, "weights": str(r.get("weights") or "")} for r in report["results"]])
    return out


# Fusions calibration chooses among: z-score fusion at vector weights 0 (full-text only) to 1 (vector only), at
# temperature 0 (plain z-scores) and e5's (query/fusion.py), and RRF; fixed weights (agreement 0), since a user's
# judged questions say which side to trust better than any signal.
CALIBRATION_GRID = [{"method": "zscore", "vector_weight": w / 10, "fulltext_weight": round(1 - w / 10, 1),
                     "agreement": 0.0, "temperature": t} for t in (0.0, EMBEDDER_FUSION["e5"].temperature)
                    for w in range(11)] + [
                        {"method": "rrf", "vector_weight": 1.0, "fulltext_weight": 1.0, "agreement": 0.0,
                         "temperature": 0.0}]


def _fusion(params: dict, rrf_k: int) -> dict:
    return {"rrf_k": rrf_k, **params}


def calibrate_fusion(runs: dict[str, QueryRun], dataset: Dataset, rrf_k: int, folds: int = 5,
                     seed: int = 0) -> dict:
    """Choose the fusion on the questions by k-fold cross-validation: per-question nDCG@10 out of sample.

    Each fold's questions are scored with the grid point that did best on the other folds, so the
    "after" figure is what calibrating does for questions it was not fitted on. The chosen
    parameters are the best on all questions.
    """
    qids = list(runs)
    scores = {i: per_query(runs, dataset, "hybrid", K_CHUNKS, fusion=_fusion(p, rrf_k))["ndcg@10"]
              for i, p in enumerate(CALIBRATION_GRID)}
    order = np.random.default_rng(seed).permutation(len(qids))
    fold_of = np.empty(len(qids), dtype=int)
    fold_of[order] = np.arange(len(qids)) % max(1, min(folds, len(qids)))
    out_of_sample = np.zeros(len(qids))
    for fold in np.unique(fold_of):
        train = fold_of != fold
        best = max(scores, key=lambda i: (scores[i][train].mean() if train.any() else 0.0, -i))
        out_of_sample[~train] = scores[best][~train]
    chosen = max(scores, key=lambda i: (scores[i].mean(), -i))
    return {"chosen": CALIBRATION_GRID[chosen], "after": out_of_sample, "fitted": scores[chosen]}


@flow(name="calibrate fusion", log_prints=True)
def calibrate(questions: str, config_path: str = str(DEFAULT_CONFIG), workdir: str | None = None,
              folds: int = 5) -> dict:
    """Fit the hybrid fusion to a questions CSV over the config's own sources; report before/after, print the YAML.

    The corpus is ingested into an eval store (as `inlet eval` does), every question asked through
    query.search; "before" is the config's default mode, "after" the k-fold out-of-sample score of
    the calibrated fusion, both nDCG@10 per question with 95% intervals (and the paired difference).
    The config file is not rewritten (its comments would be lost): the YAML to paste is returned.
    """
    data = load_dataset(questions)
    base = Path(config_path)
    work = Path(workdir) if workdir else eval_root(base) / data.name
    cfg_path = build_store(base, data, work, {"default": {}})
    qcfg = load_config(cfg_path).query
    runs = run_queries(str(cfg_path), data, sample_queries(data, None), K_CHUNKS, None)
    before = per_query(runs, data, "default", K_CHUNKS)["ndcg@10"]
    fit = calibrate_fusion(runs, data, qcfg.rrf_k, folds)
    chosen = fit["chosen"]
    yaml_text = yaml.safe_dump({"query": {"mode": "hybrid", "fusion": chosen["method"],
                                          "vector_weight": chosen["vector_weight"],
                                          "fulltext_weight": chosen["fulltext_weight"],
                                          "agreement": chosen["agreement"],
                                          "temperature": chosen["temperature"]}}, sort_keys=False)
    report = {"questions": len(runs), "folds": min(folds, len(runs)), "chosen": chosen, "yaml": yaml_text,
              "before": interval([before]), "after": interval([fit["after"]]),
              "gain": interval([fit["after"] - before]), "fitted": interval([fit["fitted"]])}
    get_run_logger().info("calibrated on %d questions: nDCG@10 %.3f before, %.3f after (out of sample); %s",
                          len(runs), report["before"][0], report["after"][0], chosen)
    create_table_artifact(key="fusion-calibration", description=f"Fusion calibrated on {data.name}", table=[
        {"figure": name, "ndcg@10": round(v[0], 4), "lo": round(v[1], 4), "hi": round(v[2], 4)}
        for name, v in (("before (config's default)", report["before"]), ("after (k-fold, out of sample)",
                        report["after"]), ("gain (paired)", report["gain"]), ("fitted (in sample)", report["fitted"]))])
    return report
