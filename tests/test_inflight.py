"""In-flight markers of commit groups: written whole, read back, and a foreign file refused by its path."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.errors import StoreError
from store import inflight


def test_a_marker_is_read_back_and_a_write_still_aside_is_not_a_marker(tmp_path):
    where = inflight.folder(str(tmp_path), "/data/lancedb", "chunks")
    path = inflight.mark(where, "run-1", ["b", "a"])
    (Path(where) / "run-2.abc.json.partial-42").write_text('["c"')  # killed mid-write
    assert inflight.left(where) == {path: ["a", "b"]}
    assert not [p for p in Path(where).iterdir() if p.name.startswith("run-1.") and
                p.name != path.rsplit("/", 1)[-1]], "the marker's own write left nothing aside"


def test_two_stores_sharing_an_artifact_root_keep_their_markers_apart(tmp_path):
    staging = inflight.folder(str(tmp_path), "/data/staging/lancedb", "chunks")
    production = inflight.folder(str(tmp_path), "/data/production/lancedb", "chunks")
    assert staging != production
    inflight.mark(staging, "run-1", ["a"])
    assert inflight.left(production) == {}
    assert inflight.left(inflight.folder(str(tmp_path), "/data/staging/lancedb", "chunks")) != {}


@pytest.mark.parametrize("content", ['["c"', '{"doc": "c"}', "[1, 2]", "\xff"])
def test_a_file_that_is_not_a_marker_stops_the_run_naming_it(tmp_path, content):
    where = inflight.folder(str(tmp_path), "/data/lancedb", "chunks")
    Path(where).mkdir(parents=True)
    bad = Path(where) / "run-9.zzz.json"
    bad.write_bytes(content.encode("latin-1"))
    with pytest.raises(StoreError, match=r"run-9\.zzz\.json: not an in-flight marker"):
        inflight.left(where)
