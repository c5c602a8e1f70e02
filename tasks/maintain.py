"""Store maintenance: compact and prune tables, refresh indexes, check integrity and repair what it finds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runtime.memory import release_memory
from runtime.stage import stage
from schemas.arrow import PUBLISHED_TAG
from store.commit import refresh_indexes
from store.tables import connect, open_table, sql_list, table_names

FINDINGS_SCHEMA = pa.schema([
    pa.field("table", pa.string(), nullable=False),  # the chunks table the finding is about
    pa.field("check", pa.string(), nullable=False),  # one of CHECKS
    pa.field("doc_id", pa.string()),
    pa.field("chunk_id", pa.string()),
    pa.field("detail", pa.string(), nullable=False),
])
CHECKS = ("orphan_chunk", "document_without_chunks", "chunk_count_mismatch", "bad_vector", "unindexed_rows")
_FOREVER = timedelta(days=36_500)  # optimize() without pruning
_VECTOR_BATCH = 20_000  # vectors checked at a time: memory stays flat however large the table


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.astimezone(UTC)


def expired_tags(tags: dict[str, dict], versions: list[dict], cutoff: datetime) -> list[str]:
    """Name the run tags on versions older than cutoff (or on versions already gone): they would block pruning.

    The published tag is never one of them: readers follow it, and compaction moves it along.
    """
    stamps = {v["version"]: _aware(v["timestamp"]) for v in versions}
    return sorted(name for name, tag in tags.items() if name != PUBLISHED_TAG
                  and (tag["version"] not in stamps or stamps[tag["version"]] < cutoff))


def published_at_latest(store_uri: str, chunks_tables: list[str]) -> list[str]:
    """Name the chunks tables whose published tag is on their latest version (nothing unpublished after it)."""
    db = connect(store_uri)
    found = []
    for name in chunks_tables:
        table = open_table(db, name)
        if table is not None and table.tags.list().get(PUBLISHED_TAG, {}).get("version") == table.version:
            found.append(name)
    return found


def republish(store_uri: str, chunks_tables: list[str]) -> None:
    """Move the published tag of these tables to their latest version: maintenance changed files, not runs' rows."""
    db = connect(store_uri)
    for name in chunks_tables:
        table = open_table(db, name)
        if table is not None:
            table.tags.update(PUBLISHED_TAG, table.version)


def _finding(table: str, check: str, detail: str, doc_id: str | None = None, chunk_id: str | None = None) -> dict:
    return {"table": table, "check": check, "doc_id": doc_id, "chunk_id": chunk_id, "detail": detail}


def integrity_findings(table: str, documents: pa.Table, chunks: pa.Table) -> list[dict]:
    """Find chunks without a document, documents without chunks and chunk counts that disagree.

    documents: doc_id, total_chunks; chunks: chunk_id, doc_id, total_chunks (no vectors needed).
    """
    known = documents["doc_id"]
    orphans = chunks.filter(pc.invert(pc.is_in(chunks["doc_id"], value_set=known)))
    found = [_finding(table, "orphan_chunk", "its document is not in the documents table", r["doc_id"],
                      r["chunk_id"]) for r in orphans.to_pylist()]
    counts = chunks.group_by("doc_id").aggregate([("chunk_id", "count"), ("total_chunks", "min"),
                                                   ("total_chunks", "max")])
    by_doc = {r["doc_id"]: r for r in counts.to_pylist()}
    for doc in documents.select(["doc_id", "total_chunks"]).to_pylist():
        have = by_doc.get(doc["doc_id"])
        if have is None:
            if doc["total_chunks"]:
                found.append(_finding(table, "document_without_chunks",
                                      f"expects {doc['total_chunks']} chunks, the table holds none", doc["doc_id"]))
            continue
        n, low, high = have["chunk_id_count"], have["total_chunks_min"], have["total_chunks_max"]
        if not n == low == high == doc["total_chunks"]:
            found.append(_finding(table, "chunk_count_mismatch",
                                  f"document expects {doc['total_chunks']} chunks, the table holds {n} "
                                  f"(their total_chunks: {low}..{high})", doc["doc_id"]))
    return found


def bad_vectors(table: str, batch: pa.RecordBatch | pa.Table) -> list[dict]:
    """Find vectors with non-finite values or zero length in a batch of (chunk_id, doc_id, vector)."""
    dim = batch.schema.field("vector").type.list_size
    values = batch["vector"].combine_chunks() if isinstance(batch, pa.Table) else batch["vector"]
    matrix = values.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
    finite = np.isfinite(matrix).all(axis=1)
    norms = np.linalg.norm(np.where(np.isfinite(matrix), matrix, 0.0), axis=1)
    bad = np.flatnonzero(~finite | (norms == 0))
    ids, docs = batch["chunk_id"].to_pylist(), batch["doc_id"].to_pylist()
    return [_finding(table, "bad_vector", "non-finite values" if not finite[i] else "all zeros", docs[i], ids[i])
            for i in bad]


def _shape(table: lancedb.table.Table) -> dict[str, int]:
    return {"versions": len(table.list_versions()), "fragments": table.stats()["fragment_stats"]["num_fragments"],
            "rows": table.count_rows()}


def compact_and_prune(table: lancedb.table.Table, older_than: timedelta) -> None:
    """Merge the table's small data files, then delete the files of untagged versions older than older_than.

    Lance's own calls, not LanceDB's optimize(): that also merged every index, which at 100k documents made
    it 187 s at a 2.6 GB peak; compaction alone is 32 s at 1.2 GB, and index_stage merges the indexes after
    (67 s, 0.6 GB). Tagged versions are kept, as optimize() kept them.
    """
    table.to_lance().optimize.compact_files()
    table.checkout_latest()
    table.to_lance().cleanup_old_versions(older_than=older_than, error_if_tagged_old_versions=False)
    table.checkout_latest()


@stage("compact and prune")
def compact_stage(store_uri: str, retention_days: float, now: datetime) -> dict[str, dict]:
    """Compact every table of the store, drop run tags older than the retention, prune older versions."""
    db = connect(store_uri)
    cutoff = now - timedelta(days=retention_days)
    out = {}
    for name in sorted(table_names(db)):
        table = db.open_table(name)
        before = _shape(table)
        tags = table.tags.list()
        dropped = expired_tags(tags, table.list_versions(), cutoff)
        for tag in dropped:  # a tagged version cannot be pruned: the tag goes with the version it keeps
            table.tags.delete(tag)
        published = tags.get(PUBLISHED_TAG, {}).get("version")
        at_latest = published == table.version
        stamps = {v["version"]: _aware(v["timestamp"]) for v in table.list_versions()}
        # Readers still need a published version that is not the latest (a run committed after it and did not
        # finish): past the cutoff, nothing is pruned until the next run publishes.
        kept = (f"version {published} is still the published one: versions were not pruned"
                if published is not None and not at_latest and stamps.get(published, now) < cutoff else None)
        if at_latest:  # the tag would block pruning its version; readers see the same rows at the latest meanwhile
            table.tags.delete(PUBLISHED_TAG)
        compact_and_prune(table, _FOREVER if kept else timedelta(days=retention_days))
        if at_latest:  # same rows, fewer files: readers move on to the compacted version
            table.tags.create(PUBLISHED_TAG, table.version)
        out[name] = {"before": before, "after": _shape(table), "tags_removed": dropped, **({"kept": kept} if kept else {})}
    return out


@stage("refresh indexes")
def index_stage(store_uri: str, chunks_tables: list[str], fulltext: bool, ann_min_rows: int) -> dict[str, dict]:
    """Create missing indexes, fold unindexed rows in and merge the runs' delta segments, for each chunks table."""
    db = connect(store_uri)
    return {name: refresh_indexes(table, fulltext=fulltext, ann_min_rows=ann_min_rows, merge=True)
            for name in chunks_tables if (table := open_table(db, name)) is not None}


def _check_one(db: lancedb.DBConnection, chunks_name: str, documents_name: str, dim: int) -> list[dict]:
    release_memory()  # what compaction and the index merge freed goes back before the columns are read
    chunks_table = open_table(db, chunks_name)
    if chunks_table is None:
        return []
    docs_table = open_table(db, documents_name)
    documents = (docs_table.search().select(["doc_id", "total_chunks"]).limit(None).to_arrow()
                 if docs_table is not None else pa.table({"doc_id": pa.array([], pa.string()),
                                                          "total_chunks": pa.array([], pa.int32())}))
    chunks = chunks_table.search().select(["chunk_id", "doc_id", "total_chunks"]).limit(None).to_arrow()
    found = integrity_findings(chunks_name, documents, chunks)
    held = chunks_table.schema.field("vector").type.list_size
    if held != dim:
        found.append(_finding(chunks_name, "bad_vector", f"the table holds {held}-dim vectors, the config embeds {dim}"))
    # Lance's scanner with a small read-ahead: LanceDB's query buffered ~730 MB of vectors at 864k rows, this ~470.
    for batch in chunks_table.to_lance().to_batches(columns=["chunk_id", "doc_id", "vector"], batch_size=_VECTOR_BATCH,
                                                    io_buffer_size=16 * 2**20, batch_readahead=1, fragment_readahead=1):
        found += bad_vectors(chunks_name, batch)
    for index in chunks_table.list_indices():
        unindexed = chunks_table.index_stats(index.name).num_unindexed_rows
        if unindexed:
            found.append(_finding(chunks_name, "unindexed_rows", f"{unindexed} rows not yet in index {index.name}"))
    return found


@stage("check integrity")
def integrity_stage(store_uri: str, pairs: list[tuple[str, str, int]]) -> pa.Table:
    """Run every integrity check over each (chunks table, documents table, dim); return the findings."""
    db = connect(store_uri)
    rows = [f for chunks, documents, dim in pairs for f in _check_one(db, chunks, documents, dim)]
    return pa.Table.from_pylist(rows, schema=FINDINGS_SCHEMA)


@stage("repair")
def repair_stage(store_uri: str, findings: pa.Table, pairs: list[tuple[str, str, int]]) -> dict[str, int]:
    """Delete orphan chunks and bad vectors; send documents with missing or bad chunks back through ingest.

    A document is sent back by clearing its content hash: the next run hashes the file again, finds
    it changed and rebuilds all its chunks. Unindexed rows are not repaired here: the index stage
    before the check already folded in what it could.
    """
    db = connect(store_uri)
    repaired = {"chunks_deleted": 0, "documents_requeued": 0}
    for chunks_name, documents_name, _ in pairs:
        mine = findings.filter(pc.equal(findings["table"], chunks_name)).to_pylist()
        drop = sorted({f["chunk_id"] for f in mine if f["check"] in ("orphan_chunk", "bad_vector") and f["chunk_id"]})
        requeue = sorted({f["doc_id"] for f in mine if f["doc_id"] and f["check"] != "orphan_chunk"})
        if drop and (chunks := open_table(db, chunks_name)) is not None:
            chunks.delete(f"chunk_id IN ({sql_list(drop)})")
            repaired["chunks_deleted"] += len(drop)
        if requeue and (documents := open_table(db, documents_name)) is not None:
            documents.update(where=f"doc_id IN ({sql_list(requeue)})", values={"content_hash": None})
            repaired["documents_requeued"] += len(requeue)
    return repaired
