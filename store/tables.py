"""LanceDB access for the write path: open tables, look rows up by key, create with the right schema."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

import lancedb
import pyarrow as pa
import pyarrow.compute as pc
import tenacity
from filelock import FileLock, Timeout

from schemas.arrow import DOCUMENT_ROWS_SCHEMA, KEPT_SCHEMA, RUNS_SCHEMA, conform
from schemas.errors import StoreBusyError, StoreError

DOCUMENTS = "documents"
RUNS = "runs"
QUARANTINE = "quarantine"
EXTRACTIONS = "extractions"  # kept extractions (tasks/kept.py): one row per document, shared by the store's indexes
IN_BATCH = 5000  # keys per IN (...) filter: keeps each SQL predicate small
# Lance file format for new tables. 2.2 (this LanceDB's default) compresses data blocks, so fetching
# the ~17 columns of 10 search hits from 1M rows took ~39 ms; 2.1, the format Lance marks stable, takes
# ~6 ms at the same size on disk (bench/README.md). Tables already written keep their own format.
FILE_FORMAT = "2.1"


_OPTIONS: dict[str, dict[str, str]] = {}  # store URI -> LanceDB storage options, set once per process


def is_remote_store(uri: str | Path) -> bool:
    """Tell a store on object storage (s3://bucket/lancedb) from a local folder."""
    return "://" in str(uri)


def use_store_options(uri: str | Path, options: dict[str, str]) -> None:
    """Remember the storage options (endpoint, region, credentials) connect() uses for the store at uri."""
    if options:
        _OPTIONS[str(uri)] = dict(options)


# Connections by (process, uri, options): a connection took ~1-4 ms to make (a round trip through LanceDB's
# event loop thread), and a run made one per stage. The process id keeps a forked worker off its parent's.
_CONNECTIONS: dict[tuple[int, str, str], lancedb.DBConnection] = {}
# The writer side's LanceDB caches (index pages, manifests and fragment metadata), bounded: LanceDB keeps what it
# read of every version it opened. A run's bounds; a long-lived watcher sets smaller ones (live_cache_bounds).
INDEX_CACHE_BYTES = 128 << 20
METADATA_CACHE_BYTES = 64 << 20
_CACHE_BYTES = {"index": INDEX_CACHE_BYTES, "metadata": METADATA_CACHE_BYTES}
_KEPT_CONNECTIONS = 16
_CONNECTING = threading.Lock()  # stages in threads connect at once


def connect(uri: str | Path) -> lancedb.DBConnection:
    """Open (creating if needed) the LanceDB database at uri; tables it creates use FILE_FORMAT.

    A process keeps its connections: a table opened through one reads the table's latest version all the same.
    """
    if not is_remote_store(uri):
        Path(uri).mkdir(parents=True, exist_ok=True)
    options = {**_OPTIONS.get(str(uri), {}), "new_table_data_storage_version": FILE_FORMAT}
    key = (os.getpid(), str(uri), json.dumps(options, sort_keys=True, default=str))
    with _CONNECTING:
        db = _CONNECTIONS.get(key)
        if db is None:
            session = lancedb.Session(index_cache_size_bytes=_CACHE_BYTES["index"],
                                      metadata_cache_size_bytes=_CACHE_BYTES["metadata"])
            db = lancedb.connect(str(uri), storage_options=options, session=session)
            if len(_CONNECTIONS) >= _KEPT_CONNECTIONS:
                del _CONNECTIONS[next(iter(_CONNECTIONS))]
            _CONNECTIONS[key] = db
        return db


def live_cache_bounds(index_bytes: int = 16 << 20, metadata_bytes: int = 16 << 20) -> None:
    """Bound the LanceDB caches of connections made from now on (the watcher's): a micro-batch opens a new version.

    In 300 in-process micro-batches (bench/README.md, "Live freshness"), with a run's bounds (128 + 64 MB) the
    memory in use grew 0.46 MB a micro-batch until the caches were full; with 16 + 16 MB it stayed flat from
    the 50th, and micro-batches took as long (p50 0.58-0.63 s). A micro-batch reads a few rows and index pages.
    """
    with _CONNECTING:
        _CACHE_BYTES.update(index=index_bytes, metadata=metadata_bytes)
        _CONNECTIONS.clear()


def table_names(db: lancedb.DBConnection) -> set[str]:
    """Return the names of the tables in db."""
    listed = db.list_tables()
    return set(getattr(listed, "tables", listed))


def open_table(db: lancedb.DBConnection, name: str) -> lancedb.table.Table | None:
    """Open a table, or return None when it does not exist yet.

    Opened straight away, not looked up in the table list first: a run opens tables ~10 times, and each
    listing was a round trip to the store (~0.6 ms here, more on object storage).
    """
    try:
        return db.open_table(name)
    except ValueError as exc:
        # LanceDB's word for no such table, and for a folder whose writer has not finished creating it.
        if "was not found" not in str(exc):
            raise
        return None


def tagged_version(table: lancedb.table.Table, tag: str) -> int | None:
    """Return the version a tag points at, or None when the table has no such tag (one small read, however many tags)."""
    try:
        return table.tags.get_version(tag)
    except (RuntimeError, ValueError) as exc:
        if "does not exist" not in str(exc) and "not found" not in str(exc):
            raise
        return None


def _tag_vanished(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and "Not found" in str(exc) and "_refs/tags" in str(exc)


@tenacity.retry(retry=tenacity.retry_if_exception(_tag_vanished), stop=tenacity.stop_after_attempt(10),
                wait=tenacity.wait_random(0.001, 0.02), reraise=True)
def tag_versions(table: lancedb.table.Table) -> dict[str, int]:
    """Each tag of the table and the version it points at, read again if a tag went while they were read.

    Lance lists the tag files, then reads each: a tag deleted in between (maintenance moves the published tag
    to a compacted version by deleting and creating it; old run tags are dropped) fails the whole listing.
    """
    return {name: info["version"] for name, info in table.tags.list().items()}


def sql_list(values: Iterable[str]) -> str:
    """Render values as a SQL IN list of single-quoted literals."""
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def select_where_in(table: lancedb.table.Table | None, column: str, values: Iterable[str],
                    columns: list[str], schema: pa.Schema) -> pa.Table:
    """Return rows whose column is in values, only the named columns; empty when table is None."""
    values = sorted(set(values))
    parts = [pa.Table.from_pylist([], schema=pa.schema([schema.field(c) for c in columns]))]
    if table is not None:
        for i in range(0, len(values), IN_BATCH):
            where = f"{column} IN ({sql_list(values[i : i + IN_BATCH])})"
            parts.append(table.search().where(where).select(columns).limit(None).to_arrow())
    return pa.concat_tables([conform(p, parts[0].schema) for p in parts])


def select_one_per_key(table: lancedb.table.Table | None, column: str, values: Iterable[str],
                       columns: list[str], schema: pa.Schema) -> pa.Table:
    """Return one row (any) for each of values found in column, only the named columns; empty when table is None.

    For cache lookups: a text shared by many documents has as many rows, and fetching them all grew
    with the corpus (at 100k generated documents a batch's 4,000 keys matched ~250k rows of vectors).
    The keys' row ids are read first (the key column only), then one row per key is taken by id.
    """
    wanted = pa.schema([schema.field(c) for c in columns])
    values = sorted(set(values))
    if table is None or not values:
        return wanted.empty_table()
    found = [table.search().where(f"{column} IN ({sql_list(values[i : i + IN_BATCH])})").select([column])
             .with_row_id(True).limit(None).to_arrow() for i in range(0, len(values), IN_BATCH)]
    first = _lowest_row_per_key(pa.concat_tables(found), column).to_pylist()
    if not first:
        return wanted.empty_table()
    # The handle stays on the version it opened, so these ids are the rows the first read saw.
    return conform(table.take_row_ids(first).select(columns).to_arrow().select(columns), wanted)


def _lowest_row_per_key(rows: pa.Table, column: str) -> pa.Array:
    """The lowest _rowid of each distinct value of column, in the order the values first occur by row id.

    By kernels, not Table.group_by: Arrow's query engine set itself up on its first group-by in a
    process (~20 ms of a 1% run's lookup; later ones ~0.4 ms).
    """
    order = pc.sort_indices(rows["_rowid"])
    keys, ids = rows[column].take(order), rows["_rowid"].take(order)
    return ids.take(pc.index_in(pc.unique(keys), value_set=keys)).combine_chunks()


def _kept_reads(store_uri: str, pairs: Iterable[tuple[str, str]], fingerprint: str,
                columns: list[str]) -> Iterator[pa.Table]:
    """The columns of the extractions table's entries for these (doc id, content hash) pairs under fingerprint."""
    pairs = sorted(set(pairs))
    table = open_table(connect(store_uri), EXTRACTIONS) if pairs else None
    for i in range(0, len(pairs) if table is not None else 0, IN_BATCH):
        ids, hashes = zip(*pairs[i : i + IN_BATCH])
        # Hashes and fingerprint in the filter too: a changed document's old entry is not read at all.
        where = (f"doc_id IN ({sql_list(ids)}) AND content_hash IN ({sql_list(set(hashes))}) "
                 f"AND extraction_fp IN ({sql_list([fingerprint])})")
        yield table.search().where(where).select(columns).limit(None).to_arrow()


def kept_extractions(store_uri: str, pairs: Iterable[tuple[str, str]], fingerprint: str) -> pa.Table:
    """The extractions table's entries for these (doc id, content hash) pairs made under fingerprint (tasks/kept.py)."""
    parts = [conform(t, KEPT_SCHEMA) for t in _kept_reads(store_uri, pairs, fingerprint, KEPT_SCHEMA.names)]
    return pa.concat_tables([KEPT_SCHEMA.empty_table(), *parts])


def kept_keys(store_uri: str, pairs: Iterable[tuple[str, str]], fingerprint: str) -> set[tuple[str, str]]:
    """Which of these (doc id, content hash) pairs have an entry under fingerprint: keys only, no elements read."""
    return {(d, h) for t in _kept_reads(store_uri, pairs, fingerprint, ["doc_id", "content_hash"])
            for d, h in zip(t["doc_id"].to_pylist(), t["content_hash"].to_pylist(), strict=True)}


def ensure_columns(table: lancedb.table.Table, schema: pa.Schema) -> None:
    """Add the columns of schema that a table written by an older Inlet lacks (null in its old rows)."""
    have = set(table.schema.names)  # one schema read: table.schema goes to the store each time
    missing = [pa.field(f.name, f.type, nullable=True) for f in schema if f.name not in have]
    if missing:
        table.add_columns(missing)


def known_documents(db: lancedb.DBConnection, name: str = DOCUMENTS) -> pa.Table:
    """Return every row of the documents table (no vectors: it stays small)."""
    table = open_table(db, name)
    if table is None:
        return DOCUMENT_ROWS_SCHEMA.empty_table()
    ensure_columns(table, DOCUMENT_ROWS_SCHEMA)
    return conform(table.to_arrow(), DOCUMENT_ROWS_SCHEMA)


def _lock_folder(folder: Path) -> Path:
    """Create the folder a lock file lives in; a folder that cannot be made is a StoreError naming it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = f"{folder}: cannot create the store folder (store.uri): {exc.strerror or exc}"
        raise StoreError(msg) from None
    return folder


WRITER_LOCK = ".inlet-writer.lock"
WRITER_INFO = ".inlet-writer.json"


@contextmanager
def writer_lock(uri: str | Path, run: str, wait_s: float = 0) -> Iterator[None]:
    """Hold the store's one-writer lock while a run writes; refuse (after wait_s) while another run holds it.

    An OS file lock (flock): it dies with its process, so a killed run never leaves the store locked.
    A store on object storage has no such lock: there a Prefect global concurrency limit of 1, named
    after the store, stands in for it (its lease lapses a minute after a killed run).
    Ingest and maintenance take it; readers never do (they read whole versions).
    """
    if is_remote_store(uri):
        with _remote_writer_lock(str(uri), run, wait_s):
            yield
        return
    folder = _lock_folder(Path(uri))
    lock, info = FileLock(folder / WRITER_LOCK), folder / WRITER_INFO
    if wait_s < WATCHED_WAIT_S and watched_elsewhere(folder):
        # A watcher holds the lock for a micro-batch at a time (about a second): a scheduled run or maintenance
        # waits for a gap between them, where refusing at once would fail it about as often as the watcher writes.
        wait_s = WATCHED_WAIT_S
    try:
        lock.acquire(timeout=wait_s)
    except Timeout:
        try:
            holder = json.loads(info.read_text(encoding="utf-8"))
            who = f"{holder['run']} (pid {holder['pid']} on {holder['host']}, since {holder['since']})"
        except (OSError, ValueError, KeyError):
            who = "another run"
        msg = (f"{folder} is being written by {who}; {run} wrote nothing. Run it again when that one has "
               "finished, or set store.lock_wait_s to wait for it")
        raise StoreBusyError(msg) from None
    try:
        info.write_text(json.dumps({"run": run, "pid": os.getpid(), "host": socket.gethostname(),
                                    "since": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}"}), encoding="utf-8")
        yield
    finally:
        info.unlink(missing_ok=True)
        lock.release()


WATCHER_LOCK = ".inlet-watcher.lock"
WATCHED_WAIT_S = 120.0  # how long another writer waits for the lock on a watched store, whatever lock_wait_s says
_WATCHING: set[Path] = set()  # store folders this process watches


def watched_elsewhere(folder: Path) -> bool:
    """Whether another process's `inlet watch` keeps the local store in folder current."""
    if folder in _WATCHING or not (folder / WATCHER_LOCK).exists():
        return False
    probe = FileLock(folder / WATCHER_LOCK)
    try:
        probe.acquire(timeout=0)
    except Timeout:
        return True
    probe.release()
    return False


def _watcher_folder(uri: str | Path) -> Path:
    """Where a store's watcher lock lives: the store folder, or for object storage one in this machine's home."""
    import hashlib

    if is_remote_store(uri):
        return Path.home() / ".inlet" / "watchers" / hashlib.sha256(str(uri).encode()).hexdigest()[:12]
    return Path(uri)


def works_for_watcher(uri: str | Path) -> None:
    """Mark this process as the watcher's worker: its parent holds the watcher lock, so its writes do not wait on it."""
    _WATCHING.add(_watcher_folder(uri))


@contextmanager
def watcher_lock(uri: str | Path) -> Iterator[None]:
    """Hold the one-watcher-per-store lock while `inlet watch` lives; a second watcher is refused at once.

    A file lock in the store folder (or, for a store on object storage, in this machine's home, keyed by the
    store): it dies with its process, so a killed watcher never blocks the next one. Runs do not take it.
    """
    folder = _watcher_folder(uri)
    _lock_folder(folder)
    lock = FileLock(folder / WATCHER_LOCK)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        msg = f"{uri} is already watched by another `inlet watch` process (lock {folder / WATCHER_LOCK})"
        raise StoreBusyError(msg) from None
    _WATCHING.add(folder)
    try:
        yield
    finally:
        _WATCHING.discard(folder)
        lock.release()


def _is_locked(cause: BaseException | None) -> bool:
    """Whether an error from the Prefect API is its 423 answer: the limit's one slot is taken."""
    response = getattr(cause, "response", None)
    return response is not None and response.status_code == 423


@contextmanager
def _remote_writer_lock(uri: str, run: str, wait_s: float) -> Iterator[None]:
    """One writer per store on object storage, through a Prefect global concurrency limit of 1."""
    import hashlib

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists

    name = f"inlet-writer-{hashlib.sha256(uri.encode()).hexdigest()[:12]}"
    with get_client(sync_client=True) as client:
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:
            pass
    # wait_s == 0 asks the server once and refuses on its 423 (busy) answer: a wall-clock timeout
    # would also refuse when the API is merely slow (a loaded CI machine took over 0.5 s to answer).
    waiting = {"timeout_seconds": wait_s, "max_retries": None} if wait_s > 0 else {"max_retries": 0}
    held = ExitStack()
    try:  # acquiring only: a TimeoutError from the run itself is not a busy store
        held.enter_context(concurrency(name, occupy=1, lease_duration=60, strict=True, **waiting))
    except (TimeoutError, ConcurrencySlotAcquisitionError) as exc:
        if not isinstance(exc, TimeoutError) and not _is_locked(exc.__cause__):
            raise
        msg = (f"{uri} is being written by another run (Prefect concurrency limit {name}); {run} wrote nothing. "
               "Run it again when that one has finished, or set store.lock_wait_s to wait for it")
        raise StoreBusyError(msg) from None
    with held:
        yield


def open_runs_table(db: lancedb.DBConnection, name: str = RUNS) -> lancedb.table.Table:
    """Open the runs table, creating it, or adding columns that a newer Inlet records (null for old runs)."""
    table = open_table(db, name)
    if table is None:
        return db.create_table(name, schema=RUNS_SCHEMA)
    ensure_columns(table, RUNS_SCHEMA)
    return table
