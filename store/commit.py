"""Commits to LanceDB in their crash-safe order: chunks, then quarantine rows, then documents rows (the marker).

Also the rows each table gets (pure functions over Arrow tables), index upkeep, and publishing to readers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lancedb.index import FTS, Bitmap, BTree, HnswSq

from runtime.failpoints import failpoint
from runtime.memory import release_memory
from schemas.arrow import (
    DOCUMENT_ROWS_SCHEMA,
    ENRICHMENT_PENDING,
    KEPT_SCHEMA,
    PUBLISHED_TAG,
    QUARANTINE_SCHEMA,
    Change,
    chunk_rows_schema,
    conform,
    failed_mask,
)
from schemas.config import FTS_LANGUAGES
from schemas.errors import INVALID, EmbedderMismatchError
from store import inflight
from store.tables import (
    DOCUMENTS,
    EXTRACTIONS,
    IN_BATCH,
    QUARANTINE,
    connect,
    ensure_columns,
    known_documents,
    open_table,
    select_where_in,
    sql_list,
    tagged_version,
)

if TYPE_CHECKING:
    from lance.indices import IndexDescription

_DOC_FIELDS = ["source", "title", "uri", "doc_type", "tags", "access_level", "language", "extra", "expires_at"]


@dataclass(frozen=True)
class CommitTarget:
    """Where and as what a run commits one index: its tables, its vector size, its settings, the run's id and time."""

    store_uri: str
    chunks_table: str
    documents_table: str = DOCUMENTS
    quarantine_table: str = QUARANTINE
    dim: int = 0
    settings_fp: str = ""  # the index's settings fingerprint, kept on each documents row
    run_id: str = ""
    now: datetime | None = None  # the run's start: quarantine rows' "since"
    inflight_dir: str | None = None  # where commit groups leave their in-flight markers (store/inflight.py)
    fulltext_language: str = "auto"  # query.fulltext_language: the full-text index's stemming language


@dataclass
class LoadResult:
    """What the upsert changed."""

    chunks_added: int = 0
    chunks_removed: int = 0
    chunks_reused: int = 0
    chunks_written: int = 0
    docs_quarantined: int = 0
    versions: dict[str, int] = field(default_factory=dict)
    indexes: dict[str, dict[str, int]] = field(default_factory=dict)  # per index: indexed and unindexed rows
    held: bool = False  # the new version is tagged, not published: the publish gate decides


# --- pure: build the rows to commit ----------------------------------------------------------


_OWN_METADATA = ("language", "tags", "extra", "access_level", "expires_at")


def with_own_metadata(documents: pa.Table, extracted: pa.Table) -> pa.Table:
    """Put each extracted document's own metadata (front matter, detected language, access) over its listing's."""
    # Column by column in Arrow: row dicts of a whole group were a cold run's largest allocations in its commits.
    where = pc.index_in(documents["doc_id"], value_set=extracted["doc_id"].combine_chunks())
    for name in _OWN_METADATA:
        field = documents.schema.field(name)
        own = extracted[name].combine_chunks().take(where).cast(field.type)
        if own.null_count == len(own):
            continue
        documents = documents.set_column(documents.schema.get_field_index(name), field,
                                         pc.coalesce(own, documents[name].combine_chunks()))
    return documents


def withdraws(row: dict) -> bool:
    """Tell whether an extracted row takes its document's indexed chunks out of search.

    A document that now declares an access level or expiry Inlet cannot read: nobody can say who may read
    its last good version any longer, so it is withdrawn (older table versions keep it) until it is fixed.
    """
    return row["status"] == "quarantined" and row["reason"] == INVALID and row["stage"] == "extract"


def kept_for(kept: pa.Table, ok: list[str]) -> pa.Table:
    """The kept extractions of the documents a commit group indexed without error: what the group keeps."""
    if not kept.num_rows or not ok:
        return KEPT_SCHEMA.empty_table()
    return kept.filter(pc.is_in(kept["doc_id"], value_set=pa.array(ok, pa.string())))


def chunk_rows(embedded: pa.Table, documents: pa.Table, extracted: pa.Table, run_id: str, dim: int) -> pa.Table:
    """Join each embedded chunk with its document's filter fields and the run id."""
    position = {d: i for i, d in enumerate(documents["doc_id"].to_pylist())}
    title_of = dict(zip(extracted["doc_id"].to_pylist(), extracted["title"].to_pylist()))
    doc_ids = embedded["doc_id"].to_pylist()
    take = pa.array([position[d] for d in doc_ids], pa.int64())
    rows = embedded
    for name in _DOC_FIELDS:
        column = pa.array([title_of.get(d) for d in doc_ids], pa.string()) if name == "title" else documents[name].take(take)
        rows = rows.append_column(name, column)
    rows = rows.append_column("run_id", pa.array([run_id] * rows.num_rows, pa.string()))
    return conform(rows, chunk_rows_schema(dim))


def document_rows(documents: pa.Table, extracted: pa.Table, embedded: pa.Table, known: pa.Table,
                  settings_fp: str, run_id: str, now: datetime) -> pa.Table:
    """Build document rows for processed, quarantined and touched documents."""
    read = ["doc_id", "status", "title", "content_hash", "reason", "message", "stage"]  # what the rows below take
    done = {r["doc_id"]: r for r in extracted.select(read).to_pylist()}
    pending = set(embedded.filter(failed_mask(embedded))["doc_id"].to_pylist()) if embedded.num_rows else set()
    totals = pc.value_counts(embedded["doc_id"]).to_pylist() if embedded.num_rows else []
    chunk_counts = {t["values"]: t["counts"] for t in totals}
    # Only this group's rows of the store's documents: the whole table grows with the corpus, the group does not.
    mine = known.filter(pc.is_in(known["doc_id"], value_set=documents["doc_id"].combine_chunks()))
    old = {r["doc_id"]: r for r in mine.to_pylist()}
    rows = []
    for doc in documents.to_pylist():
        prev = old.get(doc["doc_id"], {})
        ext = done.get(doc["doc_id"])
        if ext is None and not (doc["change"] == Change.UNCHANGED and doc["reason"] == "touched"):
            continue
        row = {k: doc[k] for k in DOCUMENT_ROWS_SCHEMA.names if k in doc}
        row |= {"first_run_id": prev.get("first_run_id") or run_id, "last_run_id": run_id, "updated_at": now}
        if ext is None:  # bytes unchanged, mtime moved: remember the new mtime so we skip hashing next time
            row |= {k: prev[k] for k in ("title", "content_hash", "settings_fp", "status", "error", "total_chunks",
                                         *_OWN_METADATA)}
        elif ext["status"] == "ok":
            fp = settings_fp + (ENRICHMENT_PENDING if doc["doc_id"] in pending else "")
            row |= {"title": ext["title"], "content_hash": ext["content_hash"], "settings_fp": fp,
                    "status": "ok", "error": None, "total_chunks": chunk_counts.get(doc["doc_id"], 0)}
        else:  # quarantined: the chunks of its last good version stay searchable, unless withdrawn
            row |= {"title": prev.get("title"), "content_hash": ext["content_hash"], "settings_fp": settings_fp,
                    "status": "quarantined", "error": f"{ext['reason']}: {ext['message']}",
                    "total_chunks": 0 if withdraws(ext) else prev.get("total_chunks") or 0}
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=DOCUMENT_ROWS_SCHEMA)


def quarantine_rows(documents: pa.Table, extracted: pa.Table, run_id: str, now: datetime,
                    previous: pa.Table | None = None) -> pa.Table:
    """Build quarantine rows for documents that failed in this run.

    previous: the stored quarantine rows of these documents; a document still quarantined keeps its `since`
    and counts one more attempt (a row of an older Inlet, without them, counts as its first).
    """
    failed = extracted.filter(pc.equal(extracted["status"], "quarantined"))
    if not failed.num_rows:
        return QUARANTINE_SCHEMA.empty_table()
    mine = documents.filter(pc.is_in(documents["doc_id"], value_set=failed["doc_id"].combine_chunks()))
    by_id = {r["doc_id"]: r for r in mine.select(["doc_id", "source", "uri"]).to_pylist()}
    before = {r["doc_id"]: r for r in previous.to_pylist()} if previous is not None else {}
    rows = []
    for e in failed.to_pylist():
        old = before.get(e["doc_id"])
        since = now if old is None else (old.get("since") or old["at"])
        attempts = 1 if old is None else (old.get("attempts") or 1) + (old["run_id"] != run_id)
        rows.append({"doc_id": e["doc_id"], "source": by_id[e["doc_id"]]["source"], "uri": by_id[e["doc_id"]]["uri"],
                     "stage": e["stage"] or "extract", "reason": e["reason"], "message": e["message"],
                     "content_hash": e["content_hash"], "run_id": run_id, "at": now, "since": since,
                     "attempts": attempts})
    return pa.Table.from_pylist(rows, schema=QUARANTINE_SCHEMA)


def stored_quarantine(db: lancedb.DBConnection, doc_ids: list[str], name: str = QUARANTINE) -> pa.Table | None:
    """Return the quarantine rows the store holds for doc_ids (None when there are none to look for)."""
    table = open_table(db, name) if doc_ids else None
    if table is None:
        return None
    ensure_columns(table, QUARANTINE_SCHEMA)
    return select_where_in(table, "doc_id", doc_ids, QUARANTINE_SCHEMA.names, QUARANTINE_SCHEMA)


# --- commits ----------------------------------------------------------------------------------


def check_vector_size(store_uri: str, chunks_table: str, dim: int) -> None:
    """Refuse, before any batch (a plan's too), a config whose vectors would not fit the chunks table."""
    table = open_table(connect(store_uri), chunks_table)
    if table is not None:
        _check_vectors(table, dim)


def _check_vectors(table: lancedb.table.Table, dim: int) -> None:
    field_type = table.schema.field("vector").type
    if getattr(field_type, "list_size", dim) != dim:
        msg = (f"table '{table.name}' holds {field_type.list_size}-dim vectors but this config embeds {dim}-dim: "
               "set store.chunks_table to a new name or delete the old table")
        raise EmbedderMismatchError(msg)


def commit_chunks(db: lancedb.DBConnection, name: str, rows: pa.Table | Callable[[], Iterable[pa.Table]],
                  scope: list[str], dim: int, result: LoadResult, keys: pa.Table | None = None, *,
                  run_id: str) -> int:
    """Append the rows that differ from what the store holds, then delete the scoped documents' other chunks.

    rows: chunk rows, or a callable that yields them part by part, anew on each call (keys, their chunk_id and
    embed_key columns, given): LanceDB then takes the parts as they come, without a concatenated copy of the
    whole group in memory. A row equal in every column but run_id to the one stored under its chunk id stays as
    it is, with the run id of the run that wrote it: an edit rewrites the chunks it changed (and their
    neighbours' links), not every chunk of its document, so few rows wait for the indexes afterwards.
    """
    if isinstance(rows, pa.Table):
        keys, table_rows = rows.select(["chunk_id", "embed_key"]), rows
        parts: Callable[[], Iterable[pa.Table]] = lambda: [table_rows]  # noqa: E731
    elif keys is None:
        msg = "commit_chunks: parts given without their keys"
        raise TypeError(msg)
    else:
        parts = rows
    table = open_table(db, name)
    if table is None:
        first = _rows_reader(parts(), dim) if keys.num_rows else chunk_rows_schema(dim).empty_table()
        table = db.create_table(name, first, schema=chunk_rows_schema(dim))
        result.chunks_added = result.chunks_written = keys.num_rows
        return table.version
    _check_vectors(table, dim)
    ensure_columns(table, chunk_rows_schema(dim))
    if not scope:
        return table.version
    # What the scoped documents hold now, also those without a documents row: a run killed between its
    # chunk and documents commits leaves such chunks.
    schema = chunk_rows_schema(dim)
    stored = select_where_in(table, "doc_id", scope, ["doc_id", "chunk_id", "embed_key"], schema)
    same = unchanged_chunks(table, parts, keys, stored, schema)
    new_ids = set(keys["chunk_id"].to_pylist())
    old_ids = stored["chunk_id"].to_pylist()
    # A chunk id names a doc id and a text: one kept across the edit is a chunk whose vector came from the cache.
    result.chunks_reused = len(new_ids.intersection(old_ids))
    result.chunks_added = keys.num_rows - result.chunks_reused
    result.chunks_written = keys.num_rows - len(same)
    result.chunks_removed = sum(1 for i in old_ids if i not in new_ids)
    if result.chunks_written:
        table.add(_rows_reader(parts(), dim, skip=same))
    failpoint("chunks-written")
    if len(old_ids) > len(same):
        # An append and a delete, not a merge on chunk_id: a merge joins the rows against the whole table (a
        # 1% run's commit 29 ms against 9 ms here, on the bench's 11k rows; bench/README.md). Every row this run
        # wrote carries its run id, and the rows it left as they were are named, so the older rows are the rest.
        # A crash between the two leaves both beside each other; the documents rows still carry the old hashes,
        # so the next run does these documents again (their vectors now stored) and deletes the older rows then.
        # The shorter list names them: the older rows by id, or the documents less the rows left as they were.
        mine = f"run_id != {sql_list([run_id])}"
        older = sorted(set(old_ids) - same)
        if same and len(older) <= len(same):
            table.delete(f"chunk_id IN ({sql_list(older)}) AND {mine}")
        else:
            where = f"doc_id IN ({sql_list(sorted(set(stored['doc_id'].to_pylist())))}) AND {mine}"
            table.delete(where + (f" AND chunk_id NOT IN ({sql_list(sorted(same))})" if same else ""))
    return table.version


def unchanged_chunks(table: lancedb.table.Table, parts: Callable[[], Iterable[pa.Table]], keys: pa.Table,
                     stored: pa.Table, schema: pa.Schema) -> set[str]:
    """The chunk ids whose new row equals the stored one in every column but run_id (nothing read when none can).

    Only ids held once on each side with the same embed_key are compared: a chunk a killed run left twice is
    written again (and its copies deleted), and a change of embedder or enrichment compares nothing. The stored
    rows are read part by part, so a group's whole rows (vectors and texts) are never in memory at once.
    """
    candidates = sorted(_single_matches(keys, stored))
    if not candidates:
        return set()
    wanted = pa.array(candidates, pa.string())
    columns = [n for n in schema.names if n != "run_id"]
    same: set[str] = set()
    for part in parts():
        mine = part.filter(pc.is_in(part["chunk_id"], value_set=wanted))
        if mine.num_rows:
            old = select_where_in(table, "chunk_id", mine["chunk_id"].to_pylist(), columns, schema)
            same.update(identical_rows(mine.select(columns), old).to_pylist())
    return same


def _single_matches(keys: pa.Table, stored: pa.Table) -> set[str]:
    """Chunk ids present once in keys and once in stored, with the same embed_key on both sides."""
    def once(t: pa.Table) -> dict[str, str | None]:
        counts = pc.value_counts(t["chunk_id"]).to_pylist() if t.num_rows else []
        single = {c["values"] for c in counts if c["counts"] == 1}
        return {i: k for i, k in zip(t["chunk_id"].to_pylist(), t["embed_key"].to_pylist()) if i in single}
    new, old = once(keys), once(stored)
    return {i for i, k in new.items() if k is not None and old.get(i) == k}


def identical_rows(new: pa.Table, old: pa.Table) -> pa.Array:
    """The chunk ids of new's rows that have a row in old (chunk ids unique there) equal in each of new's columns."""
    where = pc.index_in(new["chunk_id"], value_set=old["chunk_id"].combine_chunks())
    found = pc.is_valid(where)
    new, old = new.filter(found), old.take(where.filter(found))
    equal = np.ones(new.num_rows, dtype=bool)
    for name in new.schema.names:
        equal &= _equal_values(new[name].combine_chunks(), old[name].combine_chunks().cast(new.schema.field(name).type))
    return new["chunk_id"].combine_chunks().filter(pa.array(equal))


def _equal_values(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Element-wise equality of two arrays of one type, a null equal to a null."""
    if pa.types.is_fixed_size_list(a.type) and not a.null_count and not b.null_count:
        width = a.type.list_size
        left = a.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
        right = b.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
        return (left == right).all(axis=1)
    if pa.types.is_nested(a.type):  # lists of strings (headings, tags): few rows, compared as Python values
        return np.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)], dtype=bool)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return pc.fill_null(pc.or_(pc.equal(a, b), both_null), both_null).to_numpy(zero_copy_only=False).astype(bool)


def upsert_keyed(db: lancedb.DBConnection, name: str, key: str, rows: pa.Table, schema: pa.Schema,
                 delete_ids: list[str], *, held: bool = False) -> int | None:
    """Upsert rows by key and delete delete_ids in one commit, creating the table if needed; return its version.

    held: the caller knows the table holds every id of delete_ids (else they are looked up first).
    """
    table = open_table(db, name)
    if table is None:
        if rows.num_rows == 0:
            return None
        return db.create_table(name, conform(rows, schema), schema=schema).version
    ensure_columns(table, schema)
    if delete_ids and not held:
        # Only ids the table holds: a delete that matches nothing would still cost a commit. A count first, one
        # round trip: most runs have none of them (the quarantine list is mostly empty), and a select is ~4 ms.
        where = f"{key} IN ({sql_list(delete_ids)})"
        present = (select_where_in(table, key, delete_ids, [key], schema)[key].to_pylist()
                   if len(delete_ids) > IN_BATCH or table.count_rows(where) else [])
        delete_ids = present
    if delete_ids:
        upserted = set(rows[key].to_pylist())
        delete_ids = [i for i in delete_ids if i not in upserted]
    if rows.num_rows == 0 and not delete_ids:
        return table.version
    if rows.num_rows == 0:
        table.delete(f"{key} IN ({sql_list(delete_ids)})")
        return table.version
    merge = table.merge_insert(key).when_matched_update_all().when_not_matched_insert_all()
    if delete_ids:
        merge = merge.when_not_matched_by_source_delete(f"{key} IN ({sql_list(delete_ids)})")
    return merge.execute(conform(rows, schema)).version


def commit_kept(db: lancedb.DBConnection, rows: pa.Table, new: list[str], deleted: list[str]) -> int | None:
    """Keep extractions (tasks/kept.py): others' entries of the documents dropped, then the group's appended.

    A delete and an append, not a merge by doc id: a merge joins the rows against the whole table (a 1% run's
    commit spent more there than on its chunks). New documents (a cold run's every group) need no delete. A kill
    between the two leaves some changed documents without an entry: their next run reads their files again,
    as for any document without one; no entry is ever served for bytes it was not made from.
    """
    table = open_table(db, EXTRACTIONS)
    if table is None:
        return db.create_table(EXTRACTIONS, conform(rows, KEPT_SCHEMA), schema=KEPT_SCHEMA).version \
            if rows.num_rows else None
    ensure_columns(table, KEPT_SCHEMA)
    fresh = set(new)
    gone = sorted({d for d in rows["doc_id"].to_pylist() if d not in fresh}.union(deleted))
    if gone:
        table.delete(f"doc_id IN ({sql_list(gone)})")
    if rows.num_rows:
        table.add(conform(rows, KEPT_SCHEMA))
    return table.version


def commit_documents(db: lancedb.DBConnection, rows: pa.Table, deleted: list[str], name: str = DOCUMENTS) -> int | None:
    """Write document rows: the content hash in them marks their chunks as committed."""
    # Deleted documents are the stored ones a run no longer finds: the table holds them (one writer at a time).
    return upsert_keyed(db, name, "doc_id", rows, DOCUMENT_ROWS_SCHEMA, deleted, held=True)


# Rows added after an index was built are still found (searched without the index); past this many, the index
# is brought up to date so searches stay fast.
MAX_UNINDEXED = 5_000
SCALAR_MIN_ROWS = 1_000  # smaller tables: their scalar columns are scanned quickly without indexes
# The columns reads look rows up by, each with its index: the clearance and expiry prefilter of every search;
# chunk_id and doc_id for a context (the chunk, then its neighbours), a run's deletions and an as_of level check.
# Without them each is a scan of the column: a context at 19.2k chunks took ~50 ms of CPU, with them ~27.
SCALAR_INDEXES = {"access_level": Bitmap, "expires_at": BTree, "chunk_id": BTree, "doc_id": BTree}
# The full-text index sooner: each row it lacks is tokenized again by every full-text or hybrid query (~29 us a
# row: 4,718 such rows made a query 136 ms instead of 2 ms; bench/README.md, "Searches through the servers").
# On a 19.2k-chunk copy of the load store (the other core busy), 100 / 200 / 500 such rows cost a query 17 / 26 /
# 42 ms of CPU against 9 with none, while folding them in took 0.04-0.10 s of CPU once: under a served load a fold
# pays for itself within a few queries. 64 rows cost a query a few ms; a run that changes a few documents
# (the 1% scenario adds ~18) still publishes without a fold.
MAX_UNINDEXED_FULLTEXT = 64
# A fold adds its rows to an index as a delta segment and merges into it the newest deltas not more than this many
# times its size (tiered: sizes grow geometrically, so a table keeps a few deltas and a row is rewritten a few
# times). Never into the base segment built over the whole table: that is the maintenance flow's work.
# Every segment costs every search a graph search per partition and a prefilter: on a 19.2k-chunk store served to
# 32 clients, five small deltas made a request 26.5-33 ms of server CPU, one 19-23 (bench/README.md, "Under
# load"); merging those five took 0.15 s, where the former limit of 8 deltas let them pile up.
DELTA_RATIO = 4


def deltas_to_merge(delta_sizes: Sequence[float], pending: float, ratio: float = DELTA_RATIO) -> int:
    """How many of an index's delta segments (sizes newest first) a fold merges with the pending rows' part."""
    merged, count = pending, 0
    for size in delta_sizes:
        if size > ratio * merged:
            break
        merged += size
        count += 1
    return count


def index_state(table: lancedb.table.Table, column: str) -> tuple[str | None, int, int]:
    """The name of the index on column (None: there is none), and its indexed and unindexed rows."""
    index = next((i for i in table.list_indices() if list(i.columns) == [column]), None)
    if index is None:
        return None, 0, 0
    stats = table.index_stats(index.name)
    return index.name, stats.num_indexed_rows, stats.num_unindexed_rows


def refresh_indexes(table: lancedb.table.Table, *, fulltext: bool, ann_min_rows: int, merge: bool = False,
                    language: str = "auto", fold_all: bool = False) -> dict[str, dict[str, int]]:
    """Create the full-text index and, past ann_min_rows, the ANN vector index; fold new rows in; return coverage.

    merge (maintenance): also merge every index's segments into one, however few rows wait, and rebuild the
    full-text index if the store's most common language changed. language: query.fulltext_language.
    fold_all (live maintenance): fold in every unindexed row as a delta segment, merged in tiers (DELTA_RATIO):
    a search scores unindexed rows by scanning them (332 such rows doubled a full-text query, 7 -> 14 ms).
    """
    rows = table.count_rows()
    if rows == 0:
        return {}
    # One look at the indexes serves the checks below; it is taken again only after something was built or folded.
    coverage = index_coverage(table)
    # The builds are a run's largest allocations (at 864k rows the vector index adds ~680 MB, the full-text one
    # less): the larger first, each after freed pages have gone back to the system (bench/README.md, 100k).
    if rows >= ann_min_rows and "vector" not in coverage:
        release_memory()
        # HNSW graphs inside IVF partitions with 8-bit scalar quantisation: high recall without a refine step.
        # About 4,000 rows a partition: at 1M rows, 256 partitions gave recall@10 0.95 and built in 2.4 min,
        # where the library's default (sqrt(rows), 1,000) took 13.5 min.
        table.create_index("vector", config=HnswSq(distance_type="cosine", num_partitions=max(1, rows // 4096)),
                           replace=True)
        coverage = index_coverage(table)
    if rows >= SCALAR_MIN_ROWS or "vector" in coverage:
        # Every search prefilters on clearance (and expiry, where rows expire): without these the prefilter reads
        # both columns of every row, and an exact vector search at 19k rows took 90 ms instead of 25 (~20 ms to build).
        for column in missing_scalar_indexes(table):
            table.create_index(column, config=SCALAR_INDEXES[column](), replace=True)
    if fulltext and ("fulltext" not in coverage or not fulltext_current(table, language, recount=merge)):
        create_fulltext_index(table, language)
        coverage = index_coverage(table)
    limits = {"fulltext": min(MAX_UNINDEXED, MAX_UNINDEXED_FULLTEXT)}
    waiting = any(c["unindexed"] > (0 if merge or fold_all else limits.get(name, MAX_UNINDEXED))
                  for name, c in coverage.items())
    if waiting or (merge and any(len(i.segments) > 1 for i in table.to_lance().describe_indices())):
        fold_in(table, merge_all=merge)
        coverage = index_coverage(table)
    return coverage


def fold_in(table: lancedb.table.Table, *, merge_all: bool = False) -> None:
    """Add the unindexed rows to every index of table: as a new delta segment, or merged into one (merge_all).

    Not LanceDB's optimize(): that also compacts the table, which rewrites every small fragment, so the first
    run to pass MAX_UNINDEXED after a 100k-document cold build took 156 s and 2.7 GB to fold in 8,589 rows
    (a delta: 0.5 s). Lance's own API folds without compacting; old versions stay for as_of.
    """
    release_memory()
    by_merge: dict[int, list[str]] = {}  # indexes folded alike go in one call: one table version, not one each
    rows = {f.metadata.id: f.metadata.physical_rows for f in table.to_lance().get_fragments()}
    for index in table.to_lance().describe_indices():
        merge = len(index.segments) if merge_all else _tiered_merge(table, index, rows)
        by_merge.setdefault(merge, []).append(index.name)
    for merge, names in sorted(by_merge.items()):
        # to_lance() opens the version this handle is on: each fold commits one, so move the handle after it.
        table.to_lance().optimize.optimize_indices(index_names=names, num_indices_to_merge=merge)
        table.checkout_latest()


def _tiered_merge(table: lancedb.table.Table, index: IndexDescription, rows: dict[int, int]) -> int:
    """How many delta segments of index a fold merges (deltas_to_merge); rows: each fragment's rows, by id."""
    # The oldest is the base. By the table version each was written at: their creation time may be unknown (None).
    segments = sorted(index.segments, key=lambda s: s.dataset_version_at_last_update)
    # A segment's rows are those of the fragments it covers (bytes would not do: a small segment is mostly overhead).
    sizes = [sum(rows.get(f, 0) for f in s.fragment_ids) for s in reversed(segments[1:])]
    return deltas_to_merge(sizes, table.index_stats(index.name).num_unindexed_rows)


# The full-text index is named for its tokenizer and language: text_icu_<code>, or text_icu_plain (no stemming,
# no stop words). An index named otherwise was built by an older Inlet (a whitespace/punctuation tokenizer that
# cannot split Chinese, Japanese or Thai) and is rebuilt when the table is next published.
FTS_PREFIX = "text_icu_"


def fulltext_language(table: lancedb.table.Table, setting: str = "auto") -> str | None:
    """The language the full-text index stems for: the setting, or with "auto" its chunks' most common language.

    None: no stemming and no stop words (a language LanceDB has no stemmer for, "none", or no known language).
    """
    if setting != "auto":
        return setting if setting in FTS_LANGUAGES else None
    if "language" not in table.schema.names:
        return None
    counts = pc.value_counts(table.search().select(["language"]).limit(None).to_arrow()["language"].combine_chunks())
    known = [(c["counts"].as_py(), c["values"].as_py()) for c in counts if c["values"].as_py()]
    return max(known)[1] if known and max(known)[1] in FTS_LANGUAGES else None


def fulltext_index_config(language: str | None) -> FTS:
    """ICU word segmentation (dictionaries for Chinese, Japanese, Thai, ...) split again at punctuation, stemmed in
    language: on ../shared/corpora/eval it beat the whitespace tokenizer everywhere it differed (bench/README.md)."""
    if language is None:
        return FTS(with_position=False, base_tokenizer="icu/split", stem=False, remove_stop_words=False)
    return FTS(with_position=False, base_tokenizer="icu/split", language=FTS_LANGUAGES[language])


def fulltext_index_name(table: lancedb.table.Table) -> str | None:
    """The name of the full-text index on text, if there is one."""
    return next((i.name for i in table.list_indices() if list(i.columns) == ["text"]), None)


def create_fulltext_index(table: lancedb.table.Table, language: str = "auto") -> None:
    """Build the full-text index over the text column in the store's language (replacing one that exists)."""
    release_memory()
    code = fulltext_language(table, language)
    old = fulltext_index_name(table)
    if old is not None:  # one index on a column: a differently named one goes first
        table.drop_index(old)
    table.create_index("text", config=fulltext_index_config(code), name=FTS_PREFIX + (code or "plain"))


def fulltext_current(table: lancedb.table.Table, language: str = "auto", *, recount: bool = False) -> bool:
    """Tell whether the text column's full-text index is Inlet's current kind (and, recount: in the right language)."""
    name = fulltext_index_name(table)
    if name is None or not name.startswith(FTS_PREFIX):
        return False
    if not recount and language == "auto":
        return True  # the language is decided when the index is built; maintenance recounts it
    return name == FTS_PREFIX + (fulltext_language(table, language) or "plain")


def missing_scalar_indexes(table: lancedb.table.Table) -> list[str]:
    """The columns of SCALAR_INDEXES that the table has and that have no index yet."""
    indexed = {c for i in table.list_indices() for c in i.columns}
    return [c for c in SCALAR_INDEXES if c in table.schema.names and c not in indexed]


def index_coverage(table: lancedb.table.Table) -> dict[str, dict[str, int]]:
    """Indexed and unindexed rows of the full-text and vector indexes that exist (one listing of the indexes)."""
    indices = table.list_indices()
    coverage = {}
    for name, column in (("fulltext", "text"), ("vector", "vector")):
        index = next((i for i in indices if list(i.columns) == [column]), None)
        if index is not None:
            stats = table.index_stats(index.name)
            coverage[name] = {"indexed": stats.num_indexed_rows, "unindexed": stats.num_unindexed_rows}
    return coverage


def tag_version(table: lancedb.table.Table, tag: str) -> None:
    """Tag the table's current version (no-op if the tag exists)."""
    if tagged_version(table, tag) is None:
        table.tags.create(tag, table.version)


def _ids(table: pa.Table, mask: pa.ChunkedArray) -> list[str]:
    return table.filter(mask)["doc_id"].to_pylist()


def _rows_reader(parts: Iterable[pa.Table], dim: int, skip: set[str] | None = None) -> pa.RecordBatchReader:
    """Stream chunk rows part by part, without the chunk ids in skip."""
    schema = chunk_rows_schema(dim)
    dropped = pa.array(sorted(skip or ()), pa.string())

    def batches() -> Iterator[pa.RecordBatch]:
        for part in parts:
            if len(dropped):
                part = part.filter(pc.invert(pc.is_in(part["chunk_id"], value_set=dropped)))
            if part.num_rows:
                yield from conform(part, schema).to_batches()

    return pa.RecordBatchReader.from_batches(schema, batches())


def commit_group(db: lancedb.DBConnection, target: CommitTarget, documents: pa.Table, extracted: pa.Table,
                 embedded: pa.Table, *, parts: Callable[[], Iterable[pa.Table]] | None = None,
                 known: pa.Table | None = None, kept: pa.Table | None = None) -> LoadResult:
    """Commit one group of batches: kept extractions, chunks, quarantine rows, then documents' rows (the commit marker).

    documents holds the rows this group settles: the batches' documents, and in a run's last group the
    deleted and touched ones too. A crash between two commits leaves chunks whose document row still
    carries the old hash: the next run does those documents again and converges.

    known: the documents table as the run read it under the writer lock (read here if None). Its rows of this
    group's documents are still current: each document is in one group, and no other writer runs.
    target.inflight_dir: where the group leaves its marker from before the chunk commit to after the documents
    commit (store/inflight.py), so that a next run redoes these documents even if their files went back to old bytes.
    kept (the main index's writer): the group's fresh extractions (tasks/kept.py); those of documents indexed
    without error are kept, in one merge that also drops the entries of deleted documents. First: a kill after
    it leaves documents whose next run re-chunks them without reading their files.
    """
    known = known_documents(db, target.documents_table) if known is None else known
    documents = with_own_metadata(documents, extracted)
    ok = _ids(extracted, pc.equal(extracted["status"], "ok"))
    deleted = _ids(documents, pc.equal(documents["change"], Change.DELETED))
    # Withdrawn documents lose their chunks as deleted ones do; their documents and quarantine rows stay.
    withdrawn = [r["doc_id"] for r in extracted.select(["doc_id", "status", "reason", "stage"]).to_pylist()
                 if withdraws(r)]
    scope = ok + deleted + withdrawn  # the documents whose chunks this group replaces
    result = LoadResult()
    new = _ids(documents, pc.equal(documents["change"], Change.NEW))
    kept_version = commit_kept(db, kept_for(kept, ok), new, deleted) if kept is not None else None
    failpoint("extractions-committed")
    marker = inflight.mark(target.inflight_dir, target.run_id, scope) if target.inflight_dir and scope else None
    run_id, dim = target.run_id, target.dim
    if parts is None:  # embedded holds every column
        chunks_version = commit_chunks(db, target.chunks_table, chunk_rows(embedded, documents, extracted, run_id, dim),
                                       scope, dim, result, run_id=run_id)
    else:  # embedded holds the keys only; the rows come from parts, streamed, each joined with its documents' fields
        def rows() -> Iterator[pa.Table]:
            return (chunk_rows(part, documents, extracted, run_id, dim) for part in parts() if part.num_rows)

        chunks_version = commit_chunks(db, target.chunks_table, rows, scope, dim, result,
                                       keys=embedded.select(["chunk_id", "embed_key"]), run_id=run_id)
    failpoint("chunks-committed")
    # Quarantine rows before the documents rows: those are what tells the next run that this group's documents
    # are done. Committed after them, a kill in between left the list behind for good: a fixed document still
    # listed, a newly failed one missing (its documents row already held its hash, so no run did it again).
    failed = _ids(extracted, pc.equal(extracted["status"], "quarantined"))
    stored = stored_quarantine(db, failed, target.quarantine_table)
    quarantined = quarantine_rows(documents, extracted, run_id, target.now, stored)
    result.docs_quarantined = quarantined.num_rows
    q_version = upsert_keyed(db, target.quarantine_table, "doc_id", quarantined, QUARANTINE_SCHEMA, ok + deleted)
    failpoint("quarantine-committed")
    doc_rows = document_rows(documents, extracted, embedded, known, target.settings_fp, run_id, target.now)
    docs_version = commit_documents(db, doc_rows, deleted, target.documents_table)
    failpoint("documents-committed")
    if marker is not None:
        inflight.done(marker)
    result.versions = {k: v for k, v in {target.chunks_table: chunks_version, target.documents_table: docs_version,
                                         target.quarantine_table: q_version, EXTRACTIONS: kept_version}.items()
                       if v is not None}
    return result


def publish(table: lancedb.table.Table, run_id: str) -> None:
    """Tag the table's current version with the run id and point readers at it (the published tag)."""
    tag_version(table, run_id)
    if tagged_version(table, PUBLISHED_TAG) is None:
        table.tags.create(PUBLISHED_TAG, table.version)
    else:
        table.tags.update(PUBLISHED_TAG, table.version)


def published_current(table: lancedb.table.Table, *, fulltext: bool, language: str = "auto") -> bool:
    """Tell whether readers already see the table's latest version with the indexes the config asks for."""
    if tagged_version(table, PUBLISHED_TAG) != table.version:
        return False  # new rows, or a run that committed and stopped before publishing
    return not fulltext or fulltext_current(table, language) or table.count_rows() == 0


def settled_documents(documents: pa.Table, ids: list[str], last: bool) -> pa.Table:
    """The documents rows a commit group settles: its batches' documents, plus deleted and touched ones at the end."""
    mask = pc.is_in(documents["doc_id"], pa.array(ids, pa.string()))
    if last:
        touched = pc.and_(pc.equal(documents["change"], Change.UNCHANGED), pc.equal(documents["reason"], "touched"))
        mask = pc.or_(pc.or_(mask, pc.equal(documents["change"], Change.DELETED)), pc.fill_null(touched, False))
    return documents.filter(mask)
