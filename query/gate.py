"""The publish gate's measure: recall@k of a table version on a questions CSV, and the verdict against the published."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from query.metrics import match_gold, recall_at
from query.search import search
from schemas.config import GateConfig, InletConfig


@dataclass(frozen=True)
class GateResult:
    """What the gate found: the run's recall@k, the published version's, the verdict and the questions it lost."""

    status: str  # passed | held
    recall: float
    baseline: float | None  # the published version's recall (None: nothing was published before)
    version: int
    baseline_version: int | None
    reason: str
    lost: list[dict] = field(default_factory=list)  # {question, gold}: found in the published top k, not in the new

    def as_dict(self) -> dict:
        """The result as plain data, for the run summary and the runs table."""
        return asdict(self)


def question_recalls(cfg: InletConfig, questions: list[tuple[str, dict[str, int]]], version: int, k: int,
                     mode: str | None) -> list[float]:
    """Recall@k of each question against one table version, searched as readers search (every access level)."""
    out = []
    for text, gold in questions:
        hits = search(text, k=k, mode=mode, clearance="confidential", as_of=version, config=cfg)
        docs = match_gold(list(dict.fromkeys(h.doc_id for h in hits)), gold)
        out.append(recall_at(docs, gold, k))
    return out


def judge(questions: list[tuple[str, dict[str, int]]], new: list[float], old: list[float] | None,
          rule: GateConfig, version: int, baseline_version: int | None) -> GateResult:
    """Pass or hold the new version: its mean recall against the floor, and against the published one's less max_drop."""
    recall = sum(new) / len(new) if new else 0.0
    baseline = sum(old) / len(old) if old else None
    why = []
    if rule.min_recall is not None and recall < rule.min_recall:
        why.append(f"recall@{rule.k} {recall:.3f} is below the floor {rule.min_recall:.3f}")
    if rule.max_drop is not None and baseline is not None and recall < baseline - rule.max_drop - 1e-12:
        why.append(f"recall@{rule.k} {recall:.3f} fell {baseline - recall:.3f} below the published version's "
                   f"{baseline:.3f} (at most {rule.max_drop:.3f} allowed)")
    lost = [{"question": q, "gold": "; ".join(sorted(g))} for (q, g), a, b in zip(questions, new, old or [])
            if a < b]
    if why:
        return GateResult("held", round(recall, 4), None if baseline is None else round(baseline, 4), version,
                          baseline_version, "; ".join(why), lost)
    said = (f"recall@{rule.k} {recall:.3f}" + ("" if baseline is None else f" vs {baseline:.3f} published"))
    return GateResult("passed", round(recall, 4), None if baseline is None else round(baseline, 4), version,
                      baseline_version, said, lost)
