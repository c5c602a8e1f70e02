"""Model outputs that earlier batches of this run made and the writer has not committed yet.

A batch looks its embed and enrich keys up in the chunks table, which holds only what is committed.
The writer commits every `execution.commit_rows` rows, so a text that two batches of one commit group
share would go to the model twice (a cold run of 100k generated documents embedded 228,937 texts
without this, 193,314 with it). While `sharing()` is on, each batch registers the keys it sent to the model with the
artifact that holds their outputs, later batches read those outputs back from it, and the writer
drops a batch's keys once it has committed them, so at most a commit group's keys are held.

Only batches in the flow's own process (the thread runner) share: worker processes and Dask workers
keep to the table. There, a batch's enrich and embed stages run under the process's model lock
(tasks/batch.py), lookup and remember included, so no two batches can both miss a text and send it.
A batch reuses what an earlier one embedded even if validation later quarantines that earlier document:
the same text gives the same vector again, and the check quarantines this document too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import lancedb
import pyarrow as pa
import pyarrow.compute as pc

from tasks.artifacts import read_artifact
from tasks.store import select_one_per_key

_LOCK = threading.Lock()
_SHARED: dict[str, dict[str, str]] | None = None  # kind ("embed", "enrich") -> {key: artifact path}
_BY_PATH: dict[str, list[tuple[str, list[str]]]] = {}  # artifact path -> the (kind, keys) it was registered for


@contextmanager
def sharing() -> Iterator[None]:
    """Let the batches of this process share uncommitted model outputs while the block runs (one run)."""
    global _SHARED
    with _LOCK:
        _SHARED = {}
        _BY_PATH.clear()
    try:
        yield
    finally:
        with _LOCK:
            _SHARED = None
            _BY_PATH.clear()


def remember(kind: str, keys: list[str], path: str) -> None:
    """Record that the artifact at path holds the outputs of keys; a key keeps its first artifact."""
    with _LOCK:
        if _SHARED is not None and keys:
            known = _SHARED.setdefault(kind, {})
            for key in keys:
                known.setdefault(key, path)
            _BY_PATH.setdefault(path, []).append((kind, keys))


def forget(folders: Iterable[str]) -> None:
    """Drop what the artifacts in these (batch) folders hold: committed, the table serves it now."""
    folders = set(folders)
    with _LOCK:
        if _SHARED is None:
            return
        for path in [p for p in _BY_PATH if p.rsplit("/", 1)[0] in folders]:
            for kind, keys in _BY_PATH.pop(path):
                known = _SHARED.get(kind, {})
                for key in keys:
                    if known.get(key) == path:
                        del known[key]


def recall(kind: str, column: str, keys: Iterable[str], columns: list[str], schema: pa.Schema) -> pa.Table:
    """One row per key that an earlier batch of this run registered, read from its artifact; empty otherwise."""
    wanted = pa.schema([schema.field(c) for c in columns])
    with _LOCK:
        known = {} if _SHARED is None else _SHARED.get(kind, {})
        by_path: dict[str, list[str]] = {}
        for key in set(keys):
            if key in known:
                by_path.setdefault(known[key], []).append(key)
    parts = []
    for path, found in by_path.items():
        rows = read_artifact(path, schema).select(columns)
        rows = rows.filter(pc.is_in(rows[column], pa.array(found, pa.string())))
        first: dict[str, int] = {}
        for i, key in enumerate(rows[column].to_pylist()):
            first.setdefault(key, i)  # a text repeated inside one batch has as many rows
        parts.append(rows.take(list(first.values())))
    return pa.concat_tables(parts) if parts else wanted.empty_table()


def lookup(table: lancedb.table.Table | None, kind: str, column: str, keys: list[str], columns: list[str],
           schema: pa.Schema) -> pa.Table:
    """One row per key: from the committed table, else from this run's uncommitted artifacts."""
    stored = select_one_per_key(table, column, keys, columns, schema)
    missing = set(keys) - set(stored[column].to_pylist())
    if not missing:
        return stored
    borrowed = recall(kind, column, missing, columns, schema)
    return pa.concat_tables([stored, borrowed]) if borrowed.num_rows else stored
