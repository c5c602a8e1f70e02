"""Hybrid fusion: the vector and full-text rankings of one query made into one, as pure functions.

Each side is a list of (id, score), best first (a chunk id, or a row id within one table version): cosine similarity for the vector side, BM25 for the
full-text side. Two fusions are offered (query.fusion):

- zscore (default): each side's scores are standardised over its own candidates (minus their mean, over
  their standard deviation) and added, weighted. A hit that stands far above the rest of its side (a
  BM25 match on a rare term: often 5 or more deviations) outweighs the other side's best when that side's
  scores are spread evenly (evenly spread scores reach about 1.7 deviations; an embedder reading a language
  it was not trained on gives such scores). Ranks alone cannot tell these apart. A candidate one side did
  not return gets that side's lowest standardised score. Measured against RRF on every set in
  ../shared/corpora/eval (bench/README.md, "Retrieval across data sets"). With a temperature T above 0
  (query.temperature; e5's own: 3), each standardised score z counts as T x exp(z / T) instead: close to z
  for the bulk of a list, but a best hit far above its side's rest counts more than in proportion. So a
  side sure of one candidate carries the query, and a side whose scores are spread evenly (a full-text
  list of near-equal partial matches, or a vector list of near-equal cosines) moves it little, query by
  query, with no label: it keeps the default from losing to its better side where the sides disagree
  (vector search far ahead, bench/README.md "Fusion with a temperature").
- rrf: weighted reciprocal rank fusion, weight / (rrf_k + rank) summed over the sides. Ranks only: a
  weak side drags the fused ranking as much as a strong one.

Either way, the vector side's weight can follow the sides' agreement on the query (query.agreement): the
share of their first AGREEMENT_WINDOW candidates they have in common. A weak embedder (the static one, or a
model reading text unlike what it was trained on) returns lists that share little with BM25's, and
standardising makes its best guess look as sure as BM25's best match; below the configured overlap, the
vector side keeps that fraction of its weight (at half of it, half its weight). Where both sides are good
they share a third or more of their lists (0.34-0.45 on the e5 runs of every set of ../shared/corpora/eval;
the static embedder's runs 0.09-0.24), so their fusion is mostly left as it was. Off for every embedder: it
lifts the static embedder's rows at 0.5 / 0.5 but costs e5's sets 0.003 mean nDCG@10, and over the static and
hashing embedders hybrid is full-text alone (their weights, schemas/config.py EMBEDDER_FUSION).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Key = str | int
Ranked = Sequence[tuple[Key, float]]
# Candidates of each side compared for their agreement: enough to be more than a handful of ids at the default
# k of 5 (a hybrid search of k fetches k x query.candidates a side, at least this many when agreement is on).
# Judged over 120 the overlap is steadier (at 0.3 it keeps e5's mean over every eval set, which 20 does not), but
# fetching 120 a side costs a hybrid search 6 ms at 1M chunks, over issue 54's 2 ms (bench/README.md).
AGREEMENT_WINDOW = 20


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


def tempered(z: dict[Key, float], temperature: float) -> dict[Key, float]:
    """Standardised scores as fusion weighs them: z itself at temperature 0, else T x exp(z / T) (rising with z,
    faster the further a candidate stands above its side's mean)."""
    if temperature <= 0:
        return z
    return {c: temperature * math.exp(v / temperature) for c, v in z.items()}


def zscore_fusion(dense: Ranked, sparse: Ranked, vector_weight: float, fulltext_weight: float,
                  temperature: float = 0.0) -> dict[Key, float]:
    """Weighted sum of the sides' standardised (and tempered) scores; a side weighted 0 contributes no candidates."""
    sides = [(w, tempered(standardised(side), temperature))
             for w, side in ((vector_weight, dense), (fulltext_weight, sparse)) if w > 0]
    candidates = {c for _, z in sides for c in z}
    scores = dict.fromkeys(candidates, 0.0)
    for weight, z in sides:
        floor = min(z.values(), default=0.0)  # what this side thinks of a candidate it did not return
        for c in candidates:
            scores[c] += weight * z.get(c, floor)
    return scores


def side_overlap(dense: Ranked, sparse: Ranked, window: int = AGREEMENT_WINDOW) -> float:
    """Share of the sides' first `window` candidates (or of the shorter side's, when fewer) held by both."""
    n = min(window, len(dense), len(sparse))
    if n == 0:
        return 0.0
    return len({c for c, _ in dense[:n]} & {c for c, _ in sparse[:n]}) / n


def agreement_share(dense: Ranked, sparse: Ranked, full_at: float, window: int = AGREEMENT_WINDOW) -> float:
    """How much of its weight the vector side keeps: all of it where the sides agree on full_at of their first
    candidates or more (or full_at is 0: off), in proportion below; all of it when one side found nothing."""
    if full_at <= 0 or not dense or not sparse:
        return 1.0
    return min(1.0, side_overlap(dense, sparse, window) / full_at)


def fuse_sides(dense: Ranked, sparse: Ranked, *, method: str, vector_weight: float, fulltext_weight: float,
               rrf_k: int, agreement: float = 0.0, window: int = AGREEMENT_WINDOW,
               temperature: float = 0.0) -> dict[Key, float]:
    """Fuse the two sides by the configured method (z-score at the given temperature), the vector side's weight
    scaled by agreement_share over their first `window` candidates (off at agreement 0); returns each candidate's
    fused score."""
    vector_weight *= agreement_share(dense, sparse, agreement, window)
    if method == "rrf":
        return fuse([(vector_weight, [c for c, _ in dense]), (fulltext_weight, [c for c, _ in sparse])], rrf_k)
    return zscore_fusion(dense, sparse, vector_weight, fulltext_weight, temperature)


def ranked(scores: dict[Key, float], k: int | None = None) -> list[Key]:
    """Ids by fused score, best first; ties by id, so the order never depends on set iteration."""
    return sorted(scores, key=lambda c: (-scores[c], c))[:k]
