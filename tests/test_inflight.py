"""In-flight markers of commit groups: written whole, read back, and a foreign file refused by its path."""

from __future__ import annotations

import pytest

from schemas.errors import StoreError
from tasks import inflight


def test_a_marker_is_read_back_and_a_write_still_aside_is_not_a_marker(tmp_path):
    where = inflight.folder(str(tmp_path), "chunks")
    path = inflight.mark(where, "run-1", ["b", "a"])
    (tmp_path / "inflight" / "chunks" / "run-2.abc.json.partial-42").write_text('["c"')  # killed mid-write
    assert inflight.left(where) == {path: ["a", "b"]}
    assert not [p for p in (tmp_path / "inflight" / "chunks").iterdir() if p.name.startswith("run-1.") and
                p.name != path.rsplit("/", 1)[-1]], "the marker's own write left nothing aside"


@pytest.mark.parametrize("content", ['["c"', '{"doc": "c"}', "[1, 2]", "\xff"])
def test_a_file_that_is_not_a_marker_stops_the_run_naming_it(tmp_path, content):
    where = inflight.folder(str(tmp_path), "chunks")
    (tmp_path / "inflight" / "chunks").mkdir(parents=True)
    bad = tmp_path / "inflight" / "chunks" / "run-9.zzz.json"
    bad.write_bytes(content.encode("latin-1"))
    with pytest.raises(StoreError, match=r"run-9\.zzz\.json: not an in-flight marker"):
        inflight.left(where)
