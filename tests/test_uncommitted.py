"""Uncommitted model outputs shared between the batches of one run, until the writer commits them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from schemas.arrow import embedded_chunks_schema
from tasks import uncommitted
from tasks.artifacts import write_artifact

SCHEMA = embedded_chunks_schema(2)
COLUMNS = ["embed_key", "truncated", "vector"]


def _embedded(folder, keys: list[str]) -> str:
    base = {f.name: None for f in SCHEMA}
    rows = [{**base, "chunk_id": f"c{i}", "doc_id": "d", "chunk_index": i, "total_chunks": len(keys), "text": "t",
             "text_hash": "h", "token_count": 1, "enriched_now": False, "embed_key": k, "embedder": "e",
             "embedded_now": True, "truncated": False, "vector": [float(i), 1.0]} for i, k in enumerate(keys)]
    return write_artifact(pa.Table.from_pylist(rows, schema=SCHEMA), str(folder), "embedded_chunks", SCHEMA)


def test_a_later_batch_reads_one_row_per_key_until_the_batch_is_committed(tmp_path):
    first = _embedded(tmp_path / "batches" / "00000", ["k1", "k2", "k1"])
    with uncommitted.sharing():
        uncommitted.remember("embed", ["k1", "k2"], first)
        got = uncommitted.recall("embed", "embed_key", {"k1", "k3"}, COLUMNS, SCHEMA)
        assert got["embed_key"].to_pylist() == ["k1"]
        assert np.allclose(got["vector"].to_pylist()[0], [0.0, 1.0])
        uncommitted.forget([str(tmp_path / "batches" / "00001")])  # another batch's commit: still there
        assert uncommitted.recall("embed", "embed_key", {"k2"}, COLUMNS, SCHEMA).num_rows == 1
        uncommitted.forget([str(tmp_path / "batches" / "00000")])
        assert uncommitted.recall("embed", "embed_key", {"k1", "k2"}, COLUMNS, SCHEMA).num_rows == 0


def test_nothing_is_shared_outside_a_run_or_after_it(tmp_path):
    path = _embedded(tmp_path / "b", ["k1"])
    uncommitted.remember("embed", ["k1"], path)  # no run: ignored
    with uncommitted.sharing():
        assert uncommitted.recall("embed", "embed_key", {"k1"}, COLUMNS, SCHEMA).num_rows == 0
        uncommitted.remember("embed", ["k1"], path)
        assert uncommitted.recall("embed", "embed_key", {"k1"}, COLUMNS, SCHEMA).num_rows == 1
    assert uncommitted.recall("embed", "embed_key", {"k1"}, COLUMNS, SCHEMA).num_rows == 0
