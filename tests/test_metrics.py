"""Retrieval metrics against hand computations."""

from __future__ import annotations

import math

import pytest

from query.metrics import mean_metrics, mrr_at, ndcg_at, recall_at


def test_metrics_match_hand_computation():
    ranked = ["d3", "d1", "d9", "d2"]
    qrels = {"d1": 3, "d2": 1, "d7": 2}
    assert recall_at(ranked, qrels, 2) == pytest.approx(1 / 3)
    assert recall_at(ranked, qrels, 10) == pytest.approx(2 / 3)
    assert mrr_at(ranked, qrels) == pytest.approx(1 / 2)
    dcg = 3 / math.log2(3) + 1 / math.log2(5)
    idcg = 3 / math.log2(2) + 2 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at(ranked, qrels) == pytest.approx(dcg / idcg)


def test_perfect_and_empty_rankings():
    assert ndcg_at(["a", "b"], {"a": 2, "b": 1}) == pytest.approx(1.0)
    assert (mrr_at([], {"a": 1}), ndcg_at([], {"a": 1}), recall_at([], {"a": 1}, 10)) == (0.0, 0.0, 0.0)
    means = mean_metrics({"q1": ["a"], "q2": ["x"], "q3": ["a"]}, {"q1": {"a": 1}, "q2": {"a": 1}})
    assert means == {"recall@10": 0.5, "mrr@10": 0.5, "ndcg@10": 0.5, "queries": 2}
