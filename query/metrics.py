"""Retrieval metrics over ranked document ids and graded relevance judgements (qrels)."""

from __future__ import annotations

import math


def match_gold(ranked: list[str], gold: dict[str, int]) -> list[str]:
    """Let gold entries name a document by its id, or by a path its id ends with (a questions CSV's form)."""
    out = []
    for doc in ranked:
        named = next((g for g in gold if doc == g or doc.endswith("/" + g) or doc.endswith(":" + g)), None)
        out.append(named or doc)
    return out


def recall_at(ranked: list[str], relevant: dict[str, int], k: int) -> float:
    """Share of the relevant documents found in the first k."""
    wanted = {d for d, grade in relevant.items() if grade > 0}
    return len(wanted & set(ranked[:k])) / len(wanted) if wanted else 0.0


def mrr_at(ranked: list[str], relevant: dict[str, int], k: int = 10) -> float:
    """Reciprocal rank of the first relevant document within the first k (0 when none)."""
    for rank, doc in enumerate(ranked[:k], 1):
        if relevant.get(doc, 0) > 0:
            return 1.0 / rank
    return 0.0


def ndcg_at(ranked: list[str], relevant: dict[str, int], k: int = 10) -> float:
    """nDCG@k with linear gains (the grade) and log2 discounts, as trec_eval's ndcg_cut computes it."""
    dcg = sum(relevant.get(doc, 0) / math.log2(rank + 1) for rank, doc in enumerate(ranked[:k], 1))
    ideal = sorted((g for g in relevant.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(rank + 1) for rank, g in enumerate(ideal, 1))
    return dcg / idcg if idcg else 0.0


def mean_metrics(runs: dict[str, list[str]], qrels: dict[str, dict[str, int]], k: int = 10) -> dict[str, float]:
    """Average recall@k, MRR@10 and nDCG@10 over the queries that have judgements."""
    judged = [q for q in runs if qrels.get(q)]
    if not judged:
        return {f"recall@{k}": 0.0, "mrr@10": 0.0, "ndcg@10": 0.0, "queries": 0}
    return {
        f"recall@{k}": sum(recall_at(runs[q], qrels[q], k) for q in judged) / len(judged),
        "mrr@10": sum(mrr_at(runs[q], qrels[q]) for q in judged) / len(judged),
        "ndcg@10": sum(ndcg_at(runs[q], qrels[q]) for q in judged) / len(judged),
        "queries": len(judged),
    }
