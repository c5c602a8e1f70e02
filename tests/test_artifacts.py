"""Parquet artifacts: what write_artifact encodes, and that a table reads back as it was written."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.arrow import embedded_chunks_schema
from schemas.errors import StoreError
from tasks.artifacts import (
    _RecentWrites,
    artifacts_flushed,
    flush_artifacts,
    read_artifact,
    write_artifact,
)


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
    flush_artifacts()
    meta = pq.ParquetFile(path).metadata
    columns = [meta.row_group(0).column(i) for i in range(meta.num_columns)]
    assert not any(c.has_dictionary_page or any("DICTIONARY" in e for e in c.encodings) for c in columns)
    assert all(c.statistics is None for c in columns)
    assert pq.read_table(path).cast(table.schema).equals(table)


def test_a_stage_reads_back_what_this_process_just_wrote_without_parsing_the_file(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    table = _embedded(12, 4)
    path = write_artifact(table, tmp_path, "embedded_chunks", table.schema)

    def no_parsing(*args, **kwargs):
        raise AssertionError("parsed the file")

    monkeypatch.setattr(pq, "read_table", no_parsing)
    assert read_artifact(path, table.schema).equals(table)


def test_a_file_rewritten_after_this_process_wrote_it_is_read_from_disk(tmp_path: Path) -> None:
    table = _embedded(12, 4)
    path = write_artifact(table, tmp_path, "embedded_chunks", table.schema)
    flush_artifacts()  # written: what the other writers below replace
    other = _embedded(3, 4)
    pq.write_table(other, path + ".tmp")  # another worker's write, put in place as a new file
    os.replace(path + ".tmp", path)
    assert read_artifact(path, table.schema).equals(other)
    pq.write_table(_embedded(5, 4), path)  # and rewritten in place
    assert read_artifact(path, table.schema).num_rows == 5


def test_recent_writes_keep_within_their_byte_bounds(tmp_path: Path) -> None:
    recent = _RecentWrites(max_bytes=3_000, max_entry_bytes=2_000)
    small, large = _embedded(4, 8), _embedded(60, 8)
    assert small.nbytes < 1_000 and large.nbytes > 2_000
    paths = [write_artifact(small, tmp_path, f"small-{i}", small.schema) for i in range(8)]
    flush_artifacts()
    for path in paths:
        recent.keep(path, small)
    big = write_artifact(large, tmp_path, "large", large.schema)
    flush_artifacts()
    recent.keep(big, large)
    assert recent.get(big) is None  # over the entry bound: not kept
    kept = [p for p in paths if recent.get(p) is not None]
    assert kept == paths[-len(kept):] and 0 < len(kept) * small.nbytes <= 3_000  # the latest, within the total


def test_an_artifact_reads_back_before_its_file_is_written_and_a_failed_write_raises_at_the_flush(
        tmp_path: Path, monkeypatch) -> None:
    import tasks.artifacts

    table = _embedded(12, 4)
    gate = __import__("threading").Event()
    real = tasks.artifacts.pq.write_table

    def slow(*args, **kwargs):
        gate.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(tasks.artifacts.pq, "write_table", slow)
    path = write_artifact(table, tmp_path, "chunks", table.schema)
    assert not Path(path).exists() and read_artifact(path, table.schema).equals(table), "read from memory meanwhile"
    gate.set()
    flush_artifacts()
    assert pq.read_table(path).cast(table.schema).equals(table)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device", args[1])

    monkeypatch.setattr(tasks.artifacts.pq, "write_table", broken)
    full = write_artifact(table, tmp_path, "full", table.schema)
    time.sleep(0.2)  # the write has failed by now: a stage still reads the table, the flush says what failed
    assert read_artifact(full, table.schema).equals(table)
    with pytest.raises(StoreError, match=f"{full}: the artifact could not be written.*No space left"):
        flush_artifacts()
    flush_artifacts()  # reported once; nothing left waiting

    # A block that fails already waits for its writes without raising theirs, and leaves none for the next flush.
    with pytest.raises(ValueError, match="the real failure"), artifacts_flushed():
        write_artifact(table, tmp_path, "lost", table.schema)
        raise ValueError("the real failure")
    flush_artifacts()
