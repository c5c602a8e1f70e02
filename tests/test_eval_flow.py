"""The eval flow on a tiny BEIR dataset whose rankings can be worked out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

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


def test_eval_metrics_match_a_hand_computation(beir, tmp_path, write_config):
    config = write_config(tmp_path)  # embedding: hashing; sources are replaced by the dataset's corpus
    report = evaluate(dataset=str(beir), config_path=str(config), workdir=str(tmp_path / "work"),
                      modes=("fulltext", "hybrid"), sweep=[(0.0, 1.0)],
                      variants={"default": {}, "fixed": {"chunking": {"strategy": "fixed"}}})
    assert {r["variant"] for r in report["results"]} == {"default", "fixed"}
    rows = {(r["mode"], tuple(r["weights"] or ())): r for r in report["results"] if r["variant"] == "default"}
    fulltext = rows[("fulltext", ())]
    # BM25 ranks the only document holding the query's words first: q1 -> d1 (grade 2; d4 is also
    # relevant but shares no word), q2 -> d2, q3 -> nothing ("zeppelin" is in no document).
    ndcg_q1 = (2 / math.log2(2)) / (2 / math.log2(2) + 1 / math.log2(3))
    assert fulltext["queries"] == 3
    assert fulltext["ndcg@10"] == pytest.approx((ndcg_q1 + 1.0 + 0.0) / 3)
    assert fulltext["mrr@10"] == pytest.approx((1 + 1 + 0) / 3)
    assert fulltext["recall@10"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert rows[("hybrid", (0.0, 1.0))]["ndcg@10"] == pytest.approx(fulltext["ndcg@10"]), \
        "hybrid with the vector side weighted 0 is full-text search"
    assert Path(report["path"]).is_file() and report["best_hybrid"]["default"]["mode"] == "hybrid"


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
