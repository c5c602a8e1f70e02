"""Fuzzing the one-document rule: a few hundred damaged real files in one real run, and the run completes."""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from pathlib import Path

import lancedb
import pytest

from flows.ingest import ingest
from query import search
from schemas.config import ExtractionConfig, load_config
from schemas.errors import EXTRACTION_REASONS, UNEXPECTED, ExtractionError
from tasks.extract import extract_document
from tests.conftest import CORPORA, SAMPLE
from tests.fuzz import mutants, seeds

SEED = 34
PER_FORMAT = 50  # mutants of each of the five formats
REASONS = {*EXTRACTION_REASONS, UNEXPECTED, "unreadable", "invalid"}


def _extracts(path: Path) -> bool:
    """A seed is good if it extracts on its own: the run must then index it beside its damaged copies."""
    try:
        return bool(extract_document("seed", str(path), ExtractionConfig()).elements)
    except ExtractionError:
        return False


@pytest.mark.usefixtures("prefect_harness")
def test_hundreds_of_damaged_files_never_fail_a_run_and_good_ones_beside_them_are_searchable(tmp_path, write_config):
    rng = random.Random(SEED)
    picked = seeds(CORPORA if CORPORA.is_dir() else None, SAMPLE, per_format=4, rng=rng, usable=_extracts)
    made = mutants(picked, PER_FORMAT, rng)
    folder = tmp_path / "docs"
    (folder / "mutants").mkdir(parents=True)
    (folder / "good").mkdir()
    for m in made:
        (folder / "mutants" / m.name).write_bytes(m.data)
    good = []
    for fmt, files in picked.items():
        for i, path in enumerate(files):
            shutil.copyfile(path, folder / "good" / f"{fmt[1:]}-{i}{fmt}")
            good.append(f"sample:good/{fmt[1:]}-{i}{fmt}")
    config = write_config(folder, extraction={"timeout_s": 20, "workers": 2})

    summary = ingest(config_path=str(config))  # raising here is the failure this test exists for

    db = lancedb.connect(str(load_config(config).store.uri))
    documents = {r["doc_id"]: r for r in db.open_table("documents").to_arrow().to_pylist()}
    chunks = Counter(db.open_table("chunks").to_arrow()["doc_id"].to_pylist())
    outcomes: Counter[tuple[str, str]] = Counter()
    for m in made:
        row = documents[f"sample:mutants/{m.name}"]  # every mutant has its documents row
        if row["status"] == "ok":
            assert chunks[row["doc_id"]] == row["total_chunks"] > 0, row["doc_id"]
            outcomes[m.fmt, "indexed"] += 1
        else:
            reason = row["error"].split(":", 1)[0]
            assert row["status"] == "quarantined" and reason in REASONS, (row["doc_id"], row["error"])
            outcomes[m.fmt, reason] += 1
    for doc_id in good:
        assert documents[doc_id]["status"] == "ok", (doc_id, documents[doc_id]["error"])
        first = db.open_table("chunks").search().where(f"doc_id = '{doc_id}'").limit(1).to_list()[0]
        hits = search(first["text"][:300], k=3, where={"doc_id": doc_id}, config=config, mode="vector")
        assert hits and hits[0].doc_id == doc_id
    report = {f"{fmt} {outcome}": n for (fmt, outcome), n in sorted(outcomes.items())}
    print("fuzz outcomes:", json.dumps({"mutants": len(made), "failed_runs": 0, **report}, indent=1))
    assert summary["docs_new"] == len(made) + len(good)
    assert len({m.fmt for m in made}) == 5, "every format was mutated"

    again = ingest(config_path=str(config))
    assert again["docs_unchanged"] == len(made) + len(good)
    assert (again["texts_embedded"], again["chunks_written"], again["docs_quarantined"]) == (0, 0, 0)
