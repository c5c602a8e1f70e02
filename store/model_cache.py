"""The model cache: every vector and enrichment a model made, by content key, in a LanceDB table of the store.

Enrich and embed look their keys up here first, and append each model call's answers right after the call, so
a run killed before its commit (SIGKILL, OOM, a lost worker, a redeploy) loses at most the calls in flight:
the next run finds the rest here. The chunks table no longer doubles as the cache; a chunk copies its
enrichment and vector from it. Failed or malformed answers are never written.

One batch at a time talks to the models per store (models_lock: a file lock beside the store, which threads,
worker processes and Dask workers on this machine all honour): each batch reads the cache with the lock
held, sends only its misses, and has appended their answers before the next batch looks. Two workers so never
pay for the same text. The cost: model calls of different batches do not overlap, which the provider's quota
and in-flight bound mostly forbid anyway. A store on object storage locks per machine (a lock file in the
temp folder): batches on different machines that reach the same new text at the same moment may both pay.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import lancedb
import pyarrow as pa
import pyarrow.compute as pc
from filelock import FileLock
from lancedb.index import BTree

from runtime.failpoints import failpoint
from schemas.arrow import EMBED, ENRICH, MODEL_CACHE_SCHEMA, conform, model_cache_rows
from store.tables import connect, is_remote_store, open_table, select_one_per_key

MODELS_LOCK = ".inlet-models.lock"
LOCAL_FLUSH_S = 2.0  # a local model's answers reach the cache every this many seconds (a paid one's after each call)
_SEED_BATCH = 20_000  # chunk rows read at a time when an older store's chunks seed a new cache
# Every append is a fragment, and a lookup scans each: with 200 fragments of 1,000 answers a batch's lookup took
# 0.24 s, merged and indexed on the key 0.04 s (bench/cache_lookup.py, bench/README.md).
MOST_FRAGMENTS = 24  # past this many, tidy_cache merges the small ones
FRAGMENT_ROWS = 32_768  # ...into fragments of this many rows; fragments this large are left alone


def models_lock_path(store_uri: str) -> Path:
    """The lock file that lets one batch at a time talk to the models for this store."""
    if not is_remote_store(store_uri):
        Path(store_uri).mkdir(parents=True, exist_ok=True)
        return Path(store_uri) / MODELS_LOCK
    digest = hashlib.sha256(store_uri.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"inlet-models-{digest}.lock"


@contextmanager
def models_lock(store_uri: str) -> Iterator[None]:
    """Hold the store's model lock: an OS file lock, released when its process dies (a killed run holds nothing)."""
    with FileLock(models_lock_path(store_uri)):
        yield


def cached_rows(store_uri: str, name: str, keys: Iterable[str], columns: list[str]) -> pa.Table:
    """One cache row per key found (any of its rows: a key's answers are all alike), only the named columns."""
    keys = list(keys)
    if not keys:  # enrichment off, or an empty batch: no table to open
        return pa.schema([MODEL_CACHE_SCHEMA.field(c) for c in columns]).empty_table()
    return select_one_per_key(open_table(connect(store_uri), name), "key", keys, columns, MODEL_CACHE_SCHEMA)


def open_cache(db: lancedb.DBConnection, name: str) -> lancedb.table.Table:
    """Open the cache table, creating it empty when the store has none."""
    table = open_table(db, name)
    return table if table is not None else db.create_table(name, schema=MODEL_CACHE_SCHEMA, exist_ok=True)


class CacheWriter:
    """Appends one stage's model answers to the cache: after every call when paid, else every flush_s seconds.

    A paid model's answers are each a small append right after their call (a kill loses the calls in flight
    only). A local model's are gathered for flush_s seconds: a free answer lost to a kill costs only its
    compute, and an append per call of a fast local embedder would cost more than the embedding.
    """

    def __init__(self, store_uri: str, name: str, kind: str, *, flush_s: float = 0.0) -> None:
        self._uri, self._name, self._kind, self._flush_s = store_uri, name, kind, flush_s
        self._waiting: list[pa.Table] = []
        self._last = time.monotonic()
        self.written = 0

    def add(self, rows: pa.Table) -> None:
        """Take one call's answers; append them (and any waiting) when due."""
        if rows.num_rows:
            self._waiting.append(rows)
        if time.monotonic() - self._last >= self._flush_s:
            self.flush()

    def flush(self) -> None:
        """Append what is waiting, as one table version."""
        self._last = time.monotonic()
        if not self._waiting:
            return
        rows = pa.concat_tables(self._waiting)
        open_cache(connect(self._uri), self._name).add(rows)
        self._waiting = []
        self.written += rows.num_rows
        failpoint(f"{self._kind}-cached")  # the crash tests kill a run here: these answers are safe, later ones not


def _seed_rows(batch: pa.RecordBatch, seen: set[str], now: datetime) -> pa.Table:
    """Cache rows for the enrichments and vectors one batch of an older store's chunk rows holds, each key once."""
    rows = pa.Table.from_batches([batch])
    parts = []
    for kind, key, fp in ((EMBED, "embed_key", "embedder"), (ENRICH, "enrich_key", "enricher")):
        have = rows.filter(pc.is_valid(rows[key]))
        if kind == ENRICH:
            have = have.filter(pc.is_valid(have["enrichment"]))
        keep = []
        for i, k in enumerate(have[key].to_pylist()):
            if k not in seen:
                seen.add(k)
                keep.append(i)
        have = have.take(keep)
        answer = ({"vector": pc.cast(have["vector"], pa.list_(pa.float32())), "truncated": have["truncated"]}
                  if kind == EMBED else {"enrichment": have["enrichment"]})
        parts.append(model_cache_rows(kind, have[key], have[fp], now, **answer))  # cost unknown: null
    return pa.concat_tables(parts)


def prepare_cache(store_uri: str, name: str, chunk_tables: list[str]) -> int:
    """Create the cache table if the store has none, seeded with what its chunks tables hold; return rows seeded.

    A store an older Inlet built kept its model answers in the chunks only: carried over, its changed
    documents' unchanged chunks are not paid for again. Rows stream through in batches (flat memory at 100k
    documents); the table is created under the model lock, so concurrent runs cannot both seed it. A run
    killed while seeding leaves the cache seeded in part: the texts left out are paid again when they change.
    """
    db = connect(store_uri)
    if open_table(db, name) is not None:
        return 0
    with models_lock(store_uri):
        old = [t for t in (open_table(db, n) for n in chunk_tables) if t is not None]
        if open_table(db, name) is not None or not old:  # a new store: the first answer creates the table
            return 0
        now, seen, seeded = datetime.now(UTC), set(), 0
        table = db.create_table(name, schema=MODEL_CACHE_SCHEMA, exist_ok=True)
        columns = ["embed_key", "embedder", "truncated", "vector", "enrich_key", "enricher", "enrichment"]
        for chunks in old:
            if not set(columns) <= set(chunks.schema.names):
                continue
            for batch in chunks.to_lance().to_batches(columns=columns, batch_size=_SEED_BATCH):
                rows = _seed_rows(batch, seen, now)
                if rows.num_rows:
                    table.add(rows)
                    seeded += rows.num_rows
        return seeded


def planned_rows(store_uri: str, name: str, chunk_tables: list[str], keys: Iterable[str], kind: str,
                 columns: list[str]) -> pa.Table:
    """cached_rows as a run would find them, read only: a store with no cache yet is looked up in the chunks
    tables prepare_cache would seed it from (a plan writes nothing, so it cannot seed)."""
    db = connect(store_uri)
    if open_table(db, name) is not None:
        return cached_rows(store_uri, name, keys, columns)
    key, answer = ("enrich_key", "enrichment") if kind == ENRICH else ("embed_key", "vector")
    wanted = pa.schema([MODEL_CACHE_SCHEMA.field(c) for c in columns])
    keys = list(keys)
    found = []
    for table in (open_table(db, n) for n in chunk_tables):
        if table is None or not {key, answer} <= set(table.schema.names):
            continue
        own = [c for c in columns if c in table.schema.names and c != "key"]
        rows = select_one_per_key(table, key, keys, [key, *own], table.schema)
        rows = rows.filter(pc.is_valid(rows[answer])) if answer in own else rows
        found.append(pa.table({c: rows[key] if c == "key" else rows[c] if c in own
                               else pa.nulls(rows.num_rows, wanted.field(c).type) for c in columns}))
        keys = sorted(set(keys) - set(rows[key].to_pylist()))
    return conform(pa.concat_tables(found), wanted) if found else wanted.empty_table()


HISTORY_ROWS = 2_000  # earlier answers read to estimate an answer's tokens


def earlier_answers(store_uri: str, name: str, fingerprint: str, family: str | None = None) -> pa.Table:
    """Up to HISTORY_ROWS of an enricher's answers in the cache: (output_tokens, enrichment); empty without any.

    family: a fingerprint prefix (kind and model) whose answers stand in when this enricher has none yet: a new
    prompt version answers much as the one before it.
    """
    wanted = pa.schema([MODEL_CACHE_SCHEMA.field("output_tokens"), MODEL_CACHE_SCHEMA.field("enrichment")])
    table = open_table(connect(store_uri), name)
    if table is None:
        return wanted.empty_table()
    rows = wanted.empty_table()
    for where in (f"fingerprint = '{_quoted(fingerprint)}'",
                  *([f"starts_with(fingerprint, '{_quoted(family)}')"] if family else [])):
        rows = (table.search().where(f"kind = '{ENRICH}' AND {where}").select(wanted.names)
                .limit(HISTORY_ROWS).to_arrow())
        if rows.num_rows:
            break
    return conform(rows, wanted)


def _quoted(text: str) -> str:
    return text.replace("'", "''")


def needs_tidy(store_uri: str, name: str) -> bool:
    """Whether lookups in the cache would scan more than MOST_FRAGMENTS fragments (one listing of its files)."""
    table = open_table(connect(store_uri), name)
    return table is not None and _fragments(table) > MOST_FRAGMENTS


def _fragments(table: lancedb.table.Table) -> int:
    """How many fragments the table's latest version has (LanceDB's stats: no Lance dataset opened, ~0.3 ms)."""
    return table.stats()["fragment_stats"]["num_fragments"]


def tidy_cache(store_uri: str, name: str) -> dict[str, int] | None:
    """Merge the cache's small fragments and index its keys when lookups would scan too many; None when not needed.

    Only the small fragments of recent appends are rewritten (up to FRAGMENT_ROWS rows each), so the work follows
    what was added since the last tidy, not the cache's size. A few fragments are left as they are, index or not:
    a small cache is read as fast without (bench/README.md). Old files stay until maintenance prunes them: a
    batch reading the version before the merge still finds them. Under the model lock, between batches' model work.
    """
    table = open_table(connect(store_uri), name)
    if table is None:
        return None
    fragments = _fragments(table)
    if fragments <= MOST_FRAGMENTS:
        return None
    with models_lock(store_uri):
        table.checkout_latest()
        table.to_lance().optimize.compact_files(target_rows_per_fragment=FRAGMENT_ROWS)
        table.checkout_latest()  # to_lance() committed a version this handle has not seen
        table.create_index("key", config=BTree(), replace=True)
        return {"fragments_before": fragments, "fragments_after": _fragments(table)}
