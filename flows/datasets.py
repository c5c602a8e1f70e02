"""Judged questions: a data set's documents, queries and judgements, and a questions CSV over the config's sources."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from schemas.errors import ConfigError


@dataclass
class Dataset:
    """Documents to index (empty when the config's own sources are the corpus), queries and judgements."""

    name: str
    documents: list[dict] = field(default_factory=list)  # {_id, title, text}
    queries: dict[str, str] = field(default_factory=dict)
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)


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
