"""Uncommitted model outputs shared between the batches of one run, until the writer commits them."""

from __future__ import annotations

import contextlib

import numpy as np
import pyarrow as pa
import pytest

from runtime.artifacts import use_storage_options, write_artifact
from schemas.arrow import embedded_chunks_schema
from tasks import uncommitted
from tests.conftest import bucket_store

SCHEMA = embedded_chunks_schema(2)
COLUMNS = ["embed_key", "truncated", "vector"]


def _embedded(folder, keys: list[str], reused: tuple[str, ...] = ()) -> str:
    base = {f.name: None for f in SCHEMA}
    rows = [{**base, "chunk_id": f"c{i}", "doc_id": "d", "chunk_index": i, "total_chunks": len(keys), "text": "t",
             "text_hash": "h", "token_count": 1, "enriched_now": False, "embed_key": k, "embedder": "e",
             "embedded_now": k not in reused, "truncated": False, "vector": [float(i), 1.0]}
            for i, k in enumerate(keys)]
    return write_artifact(pa.Table.from_pylist(rows, schema=SCHEMA), str(folder), "embedded_chunks", SCHEMA)


def _outputs(keys: set[str], folder: str | None = None) -> pa.Table:
    """What an earlier batch of the run made for keys and the writer has not committed: where(), then read."""
    return uncommitted.read_outputs(uncommitted.where("embed", keys, folder), "embed", "embed_key", keys, COLUMNS,
                                    SCHEMA)


def test_a_later_batch_reads_one_row_per_key_until_the_batch_is_committed(tmp_path):
    first = _embedded(tmp_path / "batches" / "00000", ["k1", "k2", "k1"])
    with uncommitted.sharing():
        uncommitted.remember("embed", ["k1", "k2"], first)
        got = _outputs({"k1", "k3"})
        assert got["embed_key"].to_pylist() == ["k1"]
        assert np.allclose(got["vector"].to_pylist()[0], [0.0, 1.0])
        uncommitted.forget([str(tmp_path / "batches" / "00001")])  # another batch's commit: still there
        assert _outputs({"k2"}).num_rows == 1
        uncommitted.forget([str(tmp_path / "batches" / "00000")])
        assert _outputs({"k1", "k2"}).num_rows == 0


def test_nothing_is_shared_outside_a_run_or_after_it(tmp_path):
    path = _embedded(tmp_path / "b", ["k1"])
    uncommitted.remember("embed", ["k1"], path)  # no run: ignored
    with uncommitted.sharing():
        assert _outputs({"k1"}).num_rows == 0
        uncommitted.remember("embed", ["k1"], path)
        assert _outputs({"k1"}).num_rows == 1
    assert _outputs({"k1"}).num_rows == 0


def _recall(keys: set[str], folder) -> list[str]:
    return sorted(_outputs(keys, str(folder))["embed_key"].to_pylist())


def test_batches_in_other_processes_share_through_markers_until_the_writer_commits(tmp_path):
    # No sharing() block: as in a worker process of the process or Dask runner.
    batches = tmp_path / "run" / "batches"
    first = _embedded(batches / "00000", ["k1", "k2", "k1", "k4"], reused=("k4",))
    assert _recall({"k1"}, batches / "00001") == [], "no marker yet: the artifact may still be being written"
    uncommitted.remember("embed", ["k1", "k2"], first)
    assert (tmp_path / "run" / "uncommitted" / "embed.00000").is_file()
    got = _outputs({"k1", "k3"}, str(batches / "00001"))
    assert got["embed_key"].to_pylist() == ["k1"] and np.allclose(got["vector"].to_pylist()[0], [0.0, 1.0])
    assert _recall({"k4"}, batches / "00001") == [], "a row the batch reused is not what it sent to the model"
    assert _recall({"k1"}, batches / "00000") == [], "a batch does not borrow from itself"
    second = _embedded(batches / "00001", ["k2", "k5"])
    uncommitted.remember("embed", ["k5"], second)
    assert _recall({"k1", "k2", "k5"}, batches / "00002") == ["k1", "k2", "k5"]
    uncommitted.forget([str(batches / "00000")])  # the writer committed batch 0: the table serves it now
    assert _recall({"k1", "k2", "k5"}, batches / "00002") == ["k2", "k5"]
    assert _recall({"k1"}, tmp_path / "elsewhere") == [], "a folder outside a run's batches shares nothing"


def test_a_marker_is_left_only_once_its_artifact_is_whole_on_disk(tmp_path):
    # A batch in another process reads what a marker names: artifacts are written (aside, then renamed) before
    # write_artifact returns, so the file a marker names is whole.
    import pyarrow.parquet as pq

    batches = tmp_path / "run" / "batches"
    first = _embedded(batches / "00000", ["k1"])
    uncommitted.remember("embed", ["k1"], first)
    assert (tmp_path / "run" / "uncommitted" / "embed.00000").is_file()
    assert pq.read_table(first).num_rows == 1, "whole on disk, for a batch in another process"
    assert [p.name for p in (batches / "00000").iterdir()] == ["embedded_chunks.parquet"], "no partial file left"


def test_markers_in_a_bucket_are_seen_by_a_batch_in_another_process(s3, monkeypatch):
    import fsspec.config

    monkeypatch.setattr(fsspec.config, "conf", {})  # this test's endpoint does not outlive its server
    endpoint, client, _ = s3
    client.create_bucket(Bucket="runs")
    store = bucket_store(endpoint, "runs")
    use_storage_options(store["artifacts"], store["artifacts_options"])
    batches = f"{store['artifacts']}/run-1/batches"
    first = _embedded(f"{batches}/00000", ["k1", "k2"])
    assert _recall({"k1"}, f"{batches}/00001") == []  # listed once while empty: the next listing must not be stale
    uncommitted.remember("embed", ["k1", "k2"], first)
    assert _recall({"k1", "k3"}, f"{batches}/00001") == ["k1"]
    uncommitted.forget([f"{batches}/00000"])
    assert _recall({"k1"}, f"{batches}/00001") == []


@pytest.mark.parametrize("in_process", [True, False], ids=["thread runner", "worker processes"])
def test_a_batch_committed_while_a_lookup_reads_the_table_is_still_found(tmp_path, monkeypatch, in_process):
    # The writer commits batch 0 and forgets it just after a later batch read the table without its rows:
    # that batch must still find batch 0's vectors (in its artifact), or it sends the text to the model again.
    batches = tmp_path / "run" / "batches"
    first = _embedded(batches / "00000", ["k1", "k2"])
    read_table = uncommitted.select_one_per_key

    def committed_meanwhile(*args: object) -> pa.Table:
        rows = read_table(*args)  # the table as the later batch read it: without batch 0
        uncommitted.forget([str(batches / "00000")])
        return rows

    monkeypatch.setattr(uncommitted, "select_one_per_key", committed_meanwhile)
    with uncommitted.sharing() if in_process else contextlib.nullcontext():
        uncommitted.remember("embed", ["k1", "k2"], first)
        got = uncommitted.lookup(str(tmp_path / "store"), "chunks", "embed", "embed_key", ["k1", "k3"], COLUMNS,
                                 SCHEMA, str(batches / "00001"))
    assert got["embed_key"].to_pylist() == ["k1"]
