"""Cache lookups in the chunks table: one row per key, however many documents share its text."""

from __future__ import annotations

import lancedb
import pyarrow as pa
import pytest

import tasks.store
from tasks.store import select_one_per_key

SCHEMA = pa.schema([pa.field("chunk_id", pa.string()), pa.field("embed_key", pa.string()),
                    pa.field("vector", pa.list_(pa.float32(), 2))])


@pytest.fixture
def table(tmp_path) -> lancedb.table.Table:
    """Chunks in two fragments where key k0 is stored three times (three documents share its text)."""
    db = lancedb.connect(str(tmp_path / "db"))
    rows = lambda ids, keys: pa.table({"chunk_id": ids, "embed_key": keys,
                                       "vector": [[float(k[-1]), 1.0] for k in keys]}, schema=SCHEMA)
    table = db.create_table("chunks", rows(["a", "b", "c"], ["k0", "k1", "k0"]))
    table.add(rows(["d", "e"], ["k0", "k2"]))
    return table


def test_a_key_stored_by_many_chunks_comes_back_once_with_its_columns(table):
    got = select_one_per_key(table, "embed_key", ["k0", "k2", "k2", "missing"], ["embed_key", "vector"], SCHEMA)
    assert got.schema.names == ["embed_key", "vector"]
    assert sorted(got.to_pylist(), key=lambda r: r["embed_key"]) == [
        {"embed_key": "k0", "vector": [0.0, 1.0]}, {"embed_key": "k2", "vector": [2.0, 1.0]}]


def test_keys_split_over_several_filters_still_come_back_once(table, monkeypatch):
    monkeypatch.setattr(tasks.store, "_IN_BATCH", 1)
    got = select_one_per_key(table, "embed_key", ["k0", "k1", "k2"], ["embed_key"], SCHEMA)
    assert sorted(got["embed_key"].to_pylist()) == ["k0", "k1", "k2"]


def test_no_table_or_no_match_gives_an_empty_table_of_the_columns(table):
    for source, keys in ((None, ["k0"]), (table, ["nope"]), (table, [])):
        got = select_one_per_key(source, "embed_key", keys, ["embed_key", "vector"], SCHEMA)
        assert got.num_rows == 0 and got.schema.names == ["embed_key", "vector"]
