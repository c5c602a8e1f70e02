"""Parquet artifacts: what write_artifact encodes, and that a table reads back as it was written."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runtime.artifacts import read_artifact, write_artifact
from schemas.arrow import embedded_chunks_schema
from schemas.errors import StoreError


def _embedded(rows: int, dim: int) -> pa.Table:
    schema = embedded_chunks_schema(dim)
    values = np.random.default_rng(7).random(rows * dim, dtype=np.float32)
    data = {"doc_id": [f"doc-{i // 4}" for i in range(rows)], "chunk_id": [f"chunk-{i}" for i in range(rows)],
            "text": ["same text"] * rows, "vector": pa.FixedSizeListArray.from_arrays(pa.array(values), dim)}
    return pa.table({f.name: data[f.name] if f.name in data else _filler(f.type, rows) for f in schema},
                    schema=schema)


def _filler(kind: pa.DataType, rows: int) -> pa.Array:
    """A column of one plain value of the type (the checks here look only at doc ids and vectors)."""
    if pa.types.is_string(kind):
        return pa.array(["x"] * rows, kind)
    if pa.types.is_boolean(kind):
        return pa.array([False] * rows, kind)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return pa.array([1] * rows, kind)
    return pa.nulls(rows, kind)


def test_an_embedded_table_reads_back_exactly_as_written(tmp_path: Path) -> None:
    table = _embedded(40, 8)
    path = write_artifact(table, tmp_path, "embedded_chunks", table.schema)
    assert read_artifact(path, table.schema).equals(table)


def test_an_artifact_is_written_without_dictionaries_or_statistics_and_reads_back_whole(tmp_path: Path) -> None:
    table = _embedded(12, 4)
    path = write_artifact(table, tmp_path, "embedded_chunks", table.schema)
    meta = pq.ParquetFile(path).metadata
    columns = [meta.row_group(0).column(i) for i in range(meta.num_columns)]
    assert not any(c.has_dictionary_page or any("DICTIONARY" in e for e in c.encodings) for c in columns)
    assert all(c.statistics is None for c in columns)
    assert pq.read_table(path).cast(table.schema).equals(table)


def test_a_file_rewritten_after_this_process_wrote_it_is_read_from_disk(tmp_path: Path) -> None:
    table = _embedded(12, 4)
    path = write_artifact(table, tmp_path, "embedded_chunks", table.schema)
    other = _embedded(3, 4)
    pq.write_table(other, path + ".tmp")  # another worker's write, put in place as a new file
    os.replace(path + ".tmp", path)
    assert read_artifact(path, table.schema).equals(other)


def test_a_failed_write_raises_in_the_stage_naming_the_file_and_leaves_no_partial_file(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    import runtime.artifacts

    def broken(table, where, **kwargs):
        Path(where).write_bytes(b"half")
        raise OSError(28, "No space left on device", where)

    monkeypatch.setattr(runtime.artifacts.pq, "write_table", broken)
    with pytest.raises(StoreError, match=r"full\.parquet: the artifact could not be written.*No space left"):
        write_artifact(_embedded(12, 4), tmp_path, "full", _embedded(1, 4).schema)
    assert list(tmp_path.iterdir()) == [], "no half-written file, under its name or aside"
