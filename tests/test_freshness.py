"""query.freshness_half_life_days: recently modified documents rise in every mode; off, nothing changes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from flows.ingest import ingest
from query import search
from query.search import freshness_factor

pytestmark = pytest.mark.usefixtures("prefect_harness")
TEXT = "The slipway winch needs grease on its pawl every spring before the first launch of the season."
DAY = 86400


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Three documents with the same text: modified today, 200 days ago, and at an unknown time (epoch 0)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    now = time.time()
    for name, when in (("a-old.md", now - 200 * DAY), ("b-new.md", now - 0.5 * DAY), ("c-unknown.md", 0)):
        (docs / name).write_text(f"# Winch\n\n{TEXT}\n", encoding="utf-8")
        os.utime(docs / name, (when, when))
    return docs


@pytest.mark.parametrize("mode", ["vector", "fulltext", "hybrid"])
def test_freshness_lifts_the_recent_copy_in_every_mode_and_off_changes_nothing(folder, write_config, mode):
    off = write_config(folder, name="off.yaml")
    ingest(config_path=str(off))
    same = {round(h.score, 5) for h in search("slipway winch grease pawl", k=3, mode=mode, config=off)}
    assert len(same) == 1, "equal texts score alike when freshness is off"
    on = write_config(folder, name="on.yaml", query={"freshness_half_life_days": 30})
    hits = search("slipway winch grease pawl", k=3, mode=mode, config=on)
    assert [h.doc_id.split(":", 1)[1] for h in hits][0] == "b-new.md"
    by_doc = {h.doc_id.split(":", 1)[1]: h.score for h in hits}
    base = same.pop()
    assert by_doc["b-new.md"] == pytest.approx(base * freshness_factor(0.5, 30), rel=1e-3)
    assert by_doc["c-unknown.md"] == pytest.approx(base, rel=1e-3), "an unknown age is not boosted"
    assert by_doc["a-old.md"] == pytest.approx(base * freshness_factor(200, 30), rel=1e-3)


def test_the_factor_halves_its_boost_every_half_life():
    assert freshness_factor(0, 30) == 2.0
    assert freshness_factor(30, 30) == 1.5
    assert freshness_factor(60, 30) == 1.25
    assert freshness_factor(None, 30) == 1.0
    assert freshness_factor(-5, 30) == 2.0, "a time in the future counts as now"
