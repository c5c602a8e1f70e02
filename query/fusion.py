"""Hybrid fusion: the vector and full-text rankings of one query made into one, as pure functions.

Each side is a list of (id, score), best first (a chunk id, or a row id within one table version): cosine similarity for the vector side, BM25 for the
full-text side. Two fusions are offered (query.fusion):

- zscore (default): each side's scores are standardised over its own candidates (minus their mean, over
  their standard deviation) and added, weighted. A hit that stands far above the rest of its side (a
  BM25 match on a rare term: often 5 or more deviations) outweighs the other side's best when that side's
  scores are spread evenly (evenly spread scores reach about 1.7 deviations; an embedder reading a language
  it was not trained on gives such scores). Ranks alone cannot tell these apart. A candidate one side did
  not return gets that side's lowest standardised score. Measured against RRF on every set in
  ../shared/corpora/eval (bench/README.md, "Retrieval across data sets").
- rrf: weighted reciprocal rank fusion, weight / (rrf_k + rank) summed over the sides. Ranks only: a
  weak side drags the fused ranking as much as a strong one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Key = str | int
Ranked = Sequence[tuple[Key, float]]


def fuse(rankings: list[tuple[float, list[Key]]], rrf_k: int) -> dict[Key, float]:
    """Weighted reciprocal rank fusion: each id scores the sum of weight / (rrf_k + rank) over the rankings.

    A ranking weighted 0 contributes no candidates at all, so fusion can reduce to one side exactly.
    """
    scores: dict[Key, float] = {}
    for weight, ids in rankings:
        if weight <= 0:
            continue
        for rank, chunk_id in enumerate(ids, 1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + weight / (rrf_k + rank)
    return scores


def standardised(side: Ranked) -> dict[Key, float]:
    """Each candidate's score minus the side's mean, over its standard deviation (all 0 when they are equal)."""
    if not side:
        return {}
    values = [s for _, s in side]
    mean = sum(values) / len(values)
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return {c: (s - mean) / spread if spread > 0 else 0.0 for c, s in side}


def zscore_fusion(dense: Ranked, sparse: Ranked, vector_weight: float, fulltext_weight: float) -> dict[Key, float]:
    """Weighted sum of the sides' standardised scores; a side weighted 0 contributes no candidates."""
    sides = [(w, standardised(side)) for w, side in ((vector_weight, dense), (fulltext_weight, sparse)) if w > 0]
    candidates = {c for _, z in sides for c in z}
    scores = dict.fromkeys(candidates, 0.0)
    for weight, z in sides:
        floor = min(z.values(), default=0.0)  # what this side thinks of a candidate it did not return
        for c in candidates:
            scores[c] += weight * z.get(c, floor)
    return scores


def fuse_sides(dense: Ranked, sparse: Ranked, *, method: str, vector_weight: float, fulltext_weight: float,
               rrf_k: int) -> dict[Key, float]:
    """Fuse the two sides by the configured method; returns each candidate's fused score."""
    if method == "rrf":
        return fuse([(vector_weight, [c for c, _ in dense]), (fulltext_weight, [c for c, _ in sparse])], rrf_k)
    return zscore_fusion(dense, sparse, vector_weight, fulltext_weight)


def ranked(scores: dict[Key, float], k: int | None = None) -> list[Key]:
    """Ids by fused score, best first; ties by id, so the order never depends on set iteration."""
    return sorted(scores, key=lambda c: (-scores[c], c))[:k]
