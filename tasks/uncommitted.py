"""Model outputs that earlier batches of this run made and the writer has not committed yet.

A batch looks its embed and enrich keys up in the chunks table, which holds only what is committed.
The writer commits every `execution.commit_rows` rows, so a text that two batches of one commit group
share would go to the model twice (a cold run of 100k generated documents embedded 228,937 texts
without this, 193,314 with it). While `sharing()` is on, each batch registers the keys it sent to the model with the
artifact that holds their outputs, later batches read those outputs back from it, and the writer
drops a batch's keys once it has committed them, so at most a commit group's keys are held.

In the flow's own process (the thread runner) the register is a dict, and a batch's enrich and embed
stages run under the process's model lock (flows/batch.py), lookup and remember included, so no two
batches can both miss a text and send it. Batches in worker processes or on Dask workers share through
the artifact folder instead: a batch that sent keys to a model leaves an empty marker file
`<index>/uncommitted/<kind>.<batch>` once its artifact is written, the writer leaves
`committed.<batch>` once it has committed that batch, and a later batch reads the artifacts of the
batches marked done and not committed (one listing, then at most a commit group's artifacts). Two
batches running at the same moment can there both send a text: a lock across machines would cost more
than the rare duplicate. Either way a lookup notes where the uncommitted outputs are before it reads
the table, so a batch committed in between is found in one or the other.

A batch reuses what an earlier one embedded even if validation later quarantines that earlier
document: the same text gives the same vector again, and the check quarantines this document too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.compute as pc

from runtime.artifacts import (
    batch_dir,
    join,
    list_names,
    read_artifact,
    split_batch_dir,
    write_bytes,
)
from store.tables import connect, open_table, select_one_per_key

_LOCK = threading.Lock()
_SHARED: dict[str, dict[str, str]] | None = None  # kind ("embed", "enrich") -> {key: artifact path}
_BY_PATH: dict[str, list[tuple[str, list[str]]]] = {}  # artifact path -> the (kind, keys) it was registered for
MARKS = "uncommitted"  # beside an index's batches/ folder: the markers of batches in other processes
ARTIFACTS = {"embed": "embedded_chunks.parquet", "enrich": "enriched_chunks.parquet"}  # what a kind's batch wrote
MADE_NOW = {"embed": "embedded_now", "enrich": "enriched_now"}  # its rows that the batch sent to the model


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
    if not keys:
        return
    with _LOCK:
        if _SHARED is not None:
            known = _SHARED.setdefault(kind, {})
            for key in keys:
                known.setdefault(key, path)
            _BY_PATH.setdefault(path, []).append((kind, keys))
            return
    folder, name = path.rsplit("/", 1)
    batch = split_batch_dir(folder)
    if batch is not None and name == ARTIFACTS[kind]:
        _mark(*batch, kind)


def forget(folders: Iterable[str]) -> None:
    """Drop what the artifacts in these (batch) folders hold: committed, the table serves it now."""
    folders = set(folders)
    with _LOCK:
        if _SHARED is not None:
            for path in [p for p in _BY_PATH if p.rsplit("/", 1)[0] in folders]:
                for kind, keys in _BY_PATH.pop(path):
                    known = _SHARED.get(kind, {})
                    for key in keys:
                        if known.get(key) == path:
                            del known[key]
            return
    for index, number in filter(None, map(split_batch_dir, folders)):  # batches of other processes read these
        _mark(index, number, "committed")


def _mark(index: str, number: int, what: str) -> None:
    """Leave the empty marker <index>/uncommitted/<what>.<batch number>."""
    write_bytes(join(index, MARKS), f"{what}.{number:05d}", b"")


def _marked(kind: str, folder: str | None) -> list[str]:
    """The artifacts of kind that other batches of this folder's index marked done and the writer has not committed."""
    batch = split_batch_dir(folder) if folder is not None else None
    if batch is None:
        return []
    index, own = batch
    marks = [name.split(".", 1) for name in list_names(join(index, MARKS))]
    numbers = {what: {int(m[1]) for m in marks if m[0] == what and m[-1].isdigit()} for what in (kind, "committed")}
    return [join(batch_dir(index, n), ARTIFACTS[kind])
            for n in sorted(numbers[kind] - numbers["committed"] - {own})]


def where(kind: str, keys: Iterable[str], folder: str | None = None) -> dict[str, list[str] | None]:
    """The artifacts that may hold keys' outputs now: {path: the keys registered there, or None for any}.

    folder is the asking batch's own: outside the flow's process, the markers beside it say where to look.
    """
    with _LOCK:
        if _SHARED is not None:
            known = _SHARED.get(kind, {})
            by_path: dict[str, list[str]] = {}
            for key in keys:
                if key in known:
                    by_path.setdefault(known[key], []).append(key)
            return dict(by_path)
    return dict.fromkeys(_marked(kind, folder))  # another process's batches: any marked artifact may hold any key


def read_outputs(sources: dict[str, list[str] | None], kind: str, column: str, keys: Iterable[str],
                 columns: list[str], schema: pa.Schema) -> pa.Table:
    """One row per key found in the artifacts where() named, read in that order; empty when none holds one."""
    wanted = pa.schema([schema.field(c) for c in columns])
    keys = set(keys)
    parts = []
    for path, registered in sources.items():
        if not keys:
            break
        found = None if registered is None else [k for k in registered if k in keys]
        if found == []:
            continue
        rows = read_artifact(path, schema)
        if found is None:  # a marked batch's artifact: only the rows it sent to the model, as remember() registers
            rows = rows.filter(rows[MADE_NOW[kind]])
        rows = rows.select(columns)
        rows = rows.filter(pc.is_in(rows[column], pa.array(sorted(keys if found is None else found), pa.string())))
        if not rows.num_rows:
            continue
        first: dict[str, int] = {}
        for i, key in enumerate(rows[column].to_pylist()):
            first.setdefault(key, i)  # a text repeated inside one batch has as many rows
        parts.append(rows.take(list(first.values())))
        keys -= first.keys()  # the next artifact is asked only for what is still missing
    return pa.concat_tables(parts) if parts else wanted.empty_table()


def lookup(store_uri: str, table_name: str, kind: str, column: str, keys: list[str], columns: list[str],
           schema: pa.Schema, folder: str | None = None) -> pa.Table:
    """One row per key: from the committed table, else from this run's uncommitted artifacts (folder: the batch's).

    Where the uncommitted outputs are is noted before the table is opened and read: a batch that the
    writer commits and forgets in between is then read from one or the other, and never missed (its
    artifact stays until the run ends). Read the other way round, a text of that batch went to the
    model again: a few texts in a cold run of 100k generated documents.
    """
    pending = where(kind, keys, folder)
    stored = select_one_per_key(open_table(connect(store_uri), table_name), column, keys, columns, schema)
    missing = set(keys) - set(stored[column].to_pylist())
    if not missing:
        return stored
    borrowed = read_outputs(pending, kind, column, missing, columns, schema)
    return pa.concat_tables([stored, borrowed]) if borrowed.num_rows else stored
