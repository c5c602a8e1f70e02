"""The eval flow on a tiny BEIR dataset whose rankings can be worked out by hand."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from flows.eval import evaluate, load_dataset

pytestmark = pytest.mark.usefixtures("prefect_harness")

DOCS = {
    "d1": ("Albatross", "The albatross glides over the southern ocean for days without flapping."),
    "d2": ("Puffin", "The puffin dives for sand eels near the northern cliffs."),
    "d3": ("Cormorant", "The cormorant dries its wings on harbour posts after diving."),
    "d4": ("Gannet", "The gannet plunges into shoals of mackerel from great heights."),
}
QUERIES = {"q1": "albatross southern ocean", "q2": "puffin sand eels", "q3": "zeppelin"}
QRELS = [("q1", "d1", 2), ("q1", "d4", 1), ("q2", "d2", 1), ("q3", "d3", 1)]


@pytest.fixture
def beir(tmp_path: Path) -> Path:
    folder = tmp_path / "birds"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps({"_id": i, "title": t, "text": x})
                                                   for i, (t, x) in DOCS.items()))
    (folder / "queries.jsonl").write_text("\n".join(json.dumps({"_id": q, "text": t}) for q, t in QUERIES.items()))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                               + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in QRELS))
    return folder


def _rows(report: dict, **match: object) -> dict:
    return {(r["mode"], tuple(r.get("weights") or ())): r for r in report["results"]
            if all(r[k] == v for k, v in match.items())}


def test_eval_metrics_match_a_hand_computation(beir, tmp_path, write_config):
    config = write_config(tmp_path)  # embedding: hashing; sources are replaced by the dataset's corpus
    report = evaluate(dataset=str(beir), config_path=str(config), workdir=str(tmp_path / "work"),
                      modes=("fulltext", "hybrid"), sweep=[(0.0, 1.0)],
                      variants={"default": {}, "fixed": {"chunking": {"strategy": "fixed"}}})
    assert {r["variant"] for r in report["results"]} == {"default", "fixed"}
    rows = _rows(report, variant="default")
    fulltext = rows[("fulltext", ())]
    # BM25 ranks the only document holding the query's words first: q1 -> d1 (grade 2; d4 is also
    # relevant but shares no word), q2 -> d2, q3 -> nothing ("zeppelin" is in no document).
    ndcg_q1 = (2 / math.log2(2)) / (2 / math.log2(2) + 1 / math.log2(3))
    assert fulltext["queries"] == 3
    assert fulltext["ndcg@10"] == pytest.approx((ndcg_q1 + 1.0 + 0.0) / 3, abs=1e-4)
    assert fulltext["mrr@10"] == pytest.approx((1 + 1 + 0) / 3, abs=1e-4)
    assert fulltext["recall@10"] == pytest.approx((0.5 + 1 + 0) / 3, abs=1e-4)
    assert fulltext["ndcg@10_lo"] <= fulltext["ndcg@10"] <= fulltext["ndcg@10_hi"]
    assert rows[("hybrid", (0.0, 1.0))]["ndcg@10"] == pytest.approx(fulltext["ndcg@10"]), \
        "hybrid with the vector side weighted 0 is full-text search"
    assert ("default", ()) in rows and {c["variant"] for c in report["checks"]} == {"default", "fixed"}
    assert Path(report["path"]).is_file() and report["best_hybrid"]["default"]["mode"] == "hybrid"


def test_a_folder_of_sets_is_evaluated_set_by_set_and_overall(beir, tmp_path, write_config):
    sets = tmp_path / "sets"
    sets.mkdir()
    shutil.copytree(beir, sets / "birds")
    shutil.copytree(beir, sets / "more" / "birds-again")
    report = evaluate(dataset=str(sets), config_path=str(write_config(tmp_path)), workdir=str(tmp_path / "work"),
                      max_queries=2)
    assert report["sets"] == ["birds", "more/birds-again"]
    for name in report["sets"]:
        assert _rows(report, set=name)[("default", ())]["queries"] == 2, "a seeded sample of two queries"
    overall = _rows(report, set="overall")
    one = _rows(report, set="birds")
    for mode in ("vector", "fulltext", "default"):
        assert overall[(mode, ())]["ndcg@10"] == pytest.approx(one[(mode, ())]["ndcg@10"], abs=1e-4), \
            "two copies of one set average to that set"
        assert overall[(mode, ())]["queries"] == 4


def test_the_default_row_is_what_query_search_returns(beir, tmp_path, write_config):
    from flows.eval import load_beir, per_query, run_queries
    from query import search

    config = write_config(tmp_path)
    report = evaluate(dataset=str(beir), config_path=str(config), workdir=str(tmp_path / "work"))
    cfg_path = str(tmp_path / "work" / "inlet.yaml")
    data = load_beir(beir)
    runs = run_queries.fn(cfg_path, data, sorted(data.queries), 30, None)
    for qid, run in runs.items():
        assert run.default == [h.chunk_id for h in search(data.queries[qid], k=30, clearance="confidential",
                                                          config=cfg_path)]
    from schemas.config import load_config

    cfg = load_config(cfg_path)
    shipped = cfg.query.for_embedder(cfg.embedding.kind)  # the fusion search runs over this store
    hybrid = per_query(runs, data, "hybrid", 30, fusion={"method": shipped.fusion, "vector_weight": shipped.vector_weight,
                                                          "fulltext_weight": shipped.fulltext_weight, "rrf_k": 60,
                                                          "agreement": shipped.agreement,
                                                          "temperature": shipped.temperature})
    default = _rows(report, set="birds")[("default", ())]
    assert default["ndcg@10"] == pytest.approx(float(hybrid["ndcg@10"].mean()), abs=1e-4), \
        "the shipped default (zscore hybrid) equals the fusion scored on the sides' candidates"


def test_the_bootstrap_interval_covers_the_mean_and_narrows_with_more_queries():
    from flows.eval import interval

    rng = np.random.default_rng(1)
    few, many = rng.random(30), rng.random(3000)
    mean, lo, hi = interval([few])
    assert lo < mean < hi and mean == pytest.approx(few.mean())
    _, lo2, hi2 = interval([many])
    assert hi2 - lo2 < (hi - lo) / 5
    assert interval([np.ones(10)])[1:] == (1.0, 1.0)


def test_the_check_says_where_the_sides_disagree_and_whether_the_default_reached_the_better_one():
    from flows.eval import default_check
    from inlet.cli import check_line

    def values(vector: list[float], fulltext: list[float], default: list[float]) -> dict:
        return {m: {"ndcg@10": np.asarray(v)} for m, v in (("vector", vector), ("fulltext", fulltext),
                                                           ("default", default))}

    near = default_check(values([0.9, 0.8, 0.7, 0.6], [0.88, 0.79, 0.69, 0.6], [0.91, 0.79, 0.69, 0.59]))
    assert not near["disagree"] and not near["reached_better"] and near["ok"], near  # within the interval suffices
    apart = values([0.9, 0.8, 0.7, 0.6], [0.3, 0.2, 0.3, 0.2], [0.9, 0.8, 0.7, 0.58])
    below = default_check(apart)
    assert below["vector_minus_fulltext"] == pytest.approx(0.5) and below["disagree"] and below["better_side"] == "vector"
    assert below["not_worse"] and not below["reached_better"] and not below["ok"], below
    assert "(the sides disagree)" in check_line({"set": "s", "variant": "v", **below})
    assert check_line({"set": "s", "variant": "v", **below}).endswith("BELOW the better side where the sides disagree")
    apart["default"]["ndcg@10"] = np.asarray([0.9, 0.8, 0.7, 0.61])
    reached = default_check(apart)
    assert reached["reached_better"] and reached["ok"] and check_line({"set": "s", "variant": "v", **reached}).endswith(" ok")
    worse = default_check(values([0.9, 0.8, 0.7, 0.6], [0.3, 0.2, 0.3, 0.2], [0.3, 0.2, 0.3, 0.2]))
    assert not worse["not_worse"] and check_line({"set": "s", "variant": "v", **worse}).endswith("WORSE")


def test_questions_csv_over_the_configs_own_sources(corpus, tmp_path, write_config):
    questions = tmp_path / "questions.csv"
    questions.write_text("question,gold\nWhat are the wind limits for laser dinghies?,policies/safety-policy.html\n"
                         "How do I winterize the outboard engine?,guides/boat-maintenance.md\n")
    assert load_dataset(questions).qrels == {"1": {"policies/safety-policy.html": 1},
                                             "2": {"guides/boat-maintenance.md": 1}}
    report = evaluate(dataset=str(questions), config_path=str(write_config(corpus)),
                      workdir=str(tmp_path / "work"), modes=("fulltext",))
    assert report["results"][0]["mrr@10"] > 0.5


def test_bad_datasets_are_refused_naming_the_file(tmp_path):
    from schemas.errors import ConfigError

    folder = tmp_path / "half"
    folder.mkdir()
    (folder / "corpus.jsonl").write_text('{"_id": "1", "text": "x"}\n')
    with pytest.raises(ConfigError, match=r"half: a BEIR folder needs queries.jsonl, qrels/test.tsv"):
        load_dataset(folder)
    (folder / "queries.jsonl").write_text('{"_id": "q1", "text": "x"}\nnot json\n')
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t1\tthree\n")
    with pytest.raises(ConfigError, match=r"test.tsv:2: expected query-id, corpus-id and an integer score"):
        load_dataset(folder)
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t1\t1\n")
    with pytest.raises(ConfigError, match=r"queries.jsonl:2: not a JSON object"):
        load_dataset(folder)
    bad_csv = tmp_path / "q.csv"
    bad_csv.write_text("question,answer\nx,y\n")
    with pytest.raises(ConfigError, match="needs the columns question and gold"):
        load_dataset(bad_csv)
    for body in ("question,gold\n", "question,gold\nwhere is the slipway?, ;\n"):  # no rows; no gold given
        bad_csv.write_text(body)
        with pytest.raises(ConfigError, match=r"q.csv: no question has a judged document"):
            load_dataset(bad_csv)


def _synthetic(n: int = 40) -> tuple[dict, object]:
    """Questions whose full-text side ranks the gold document first and whose vector side is noise."""
    from flows.eval import Dataset, QueryRun

    rng = np.random.default_rng(3)
    runs, qrels = {}, {}
    for q in range(n):
        gold = f"d{q}"
        others = [f"d{(q + j) % n}" for j in range(1, 20)]
        fulltext = [(f"{gold}#0", 9.0), *((f"{d}#0", 1.0 + rng.random()) for d in others)]
        noise = rng.permutation([gold, *others]).tolist()
        vector = [(f"{d}#0", 0.5 + 0.01 * rng.random()) for d in noise]
        doc_of = {c: c.split("#")[0] for c, _ in [*fulltext, *vector]}
        # The "default" here ranks by the vector side, as a badly chosen default would.
        runs[str(q)] = QueryRun(vector, fulltext, [c for c, _ in vector], doc_of)
        qrels[str(q)] = {gold: 1}
    return runs, Dataset("synthetic", [], {q: q for q in runs}, qrels)


def test_calibration_picks_the_side_that_finds_the_gold_and_reports_it_out_of_sample():
    from flows.eval import calibrate_fusion, per_query

    runs, data = _synthetic()
    fit = calibrate_fusion(runs, data, rrf_k=60, folds=5)
    assert fit["chosen"]["method"] == "zscore" and fit["chosen"]["vector_weight"] <= 0.5
    before = per_query(runs, data, "default", 30)["ndcg@10"]
    assert fit["after"].mean() > before.mean() + 0.3 and fit["after"].mean() > 0.95
    assert len(fit["after"]) == 40, "every question scored once, by a fit that did not see it"


def test_calibrate_from_the_cli_prints_before_after_and_the_yaml(corpus, tmp_path, write_config):
    import yaml
    from typer.testing import CliRunner

    from inlet.cli import app
    from schemas.config import QueryConfig

    questions = tmp_path / "questions.csv"
    questions.write_text("question,gold\nWhat are the wind limits for laser dinghies?,policies/safety-policy.html\n"
                         "How do I winterize the outboard engine?,guides/boat-maintenance.md\n"
                         "gelcoat hardener,guides/boat-maintenance.md\n"
                         "Who won the regatta?,reports/regatta-report-2025.pdf\n")
    config = write_config(corpus)
    result = CliRunner().invoke(app, ["eval", "--calibrate", str(questions), "--config", str(config),
                                      "--workdir", str(tmp_path / "work")])
    assert result.exit_code == 0, result.output
    assert "before nDCG@10" in result.output and "after  nDCG@10" in result.output and "out of sample" in result.output
    pasted = yaml.safe_load(result.output[result.output.index("query:"):])
    QueryConfig(**pasted["query"])  # what it prints is a valid query section


def test_kept_runs_score_as_the_report_did_and_feed_the_fusion_bench(beir, tmp_path, write_config):
    import importlib.util

    from flows.eval import load_runs, per_query

    sets = tmp_path / "sets"
    shutil.copytree(beir, sets / "a")
    shutil.copytree(beir, sets / "b")
    report = evaluate(dataset=str(sets), config_path=str(write_config(tmp_path)), workdir=str(tmp_path / "work"),
                      keep_runs=True)
    runs, data = load_runs(tmp_path / "work" / "a" / "runs-default.json")
    assert all(r.vector_read is True for r in runs.values()), "kept: the hashing embedder reads every query"
    for mode in ("vector", "fulltext", "default"):
        assert per_query(runs, data, mode, 30)["ndcg@10"].mean() == pytest.approx(
            _rows(report, set="a")[(mode, ())]["ndcg@10"], abs=1e-4)
    spec = importlib.util.spec_from_file_location("fusion_bench", Path(__file__).parent.parent / "bench" / "fusion.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    fusions = bench.grid(20)
    table = bench.scores(bench.load_sets(tmp_path / "work"), fusions)
    assert set(table) == {"a", "b"}
    loso = bench.leave_one_out(table, [bench.label(p) for p in fusions])
    assert [r["held_out"] for r in loso] == ["a", "b"] and loso[0]["fitted_on"] == ["b"]
