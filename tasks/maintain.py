"""Store maintenance stages: compact and prune tables, refresh indexes, check integrity and repair what it finds.

The checks are pure functions over Arrow tables; the tasks read and write through store/maintenance.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prefect import task
from prefect.cache_policies import NO_CACHE

from runtime.artifacts import prune_run_folders
from store import maintenance
from store.commit import refresh_indexes
from store.tables import connect, open_table

FINDINGS_SCHEMA = pa.schema([
    pa.field("table", pa.string(), nullable=False),  # the chunks table the finding is about
    pa.field("check", pa.string(), nullable=False),  # one of CHECKS
    pa.field("doc_id", pa.string()),
    pa.field("chunk_id", pa.string()),
    pa.field("detail", pa.string(), nullable=False),
])
CHECKS = ("orphan_chunk", "document_without_chunks", "chunk_count_mismatch", "bad_vector", "unindexed_rows",
          "cache_bad_vector", "cache_foreign_model")


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


def table_findings(chunks_name: str, documents: pa.Table, chunks: pa.Table, held_dim: int, dim: int,
                   vector_batches: Iterable[pa.RecordBatch], unindexed: dict[str, int]) -> list[dict]:
    """Every integrity finding of one chunks table: counts against documents, vector sizes and values, indexes."""
    found = integrity_findings(chunks_name, documents, chunks)
    if held_dim != dim:
        found.append(_finding(chunks_name, "bad_vector", f"the table holds {held_dim}-dim vectors, the config embeds {dim}"))
    for batch in vector_batches:
        found += bad_vectors(chunks_name, batch)
    found += [_finding(chunks_name, "unindexed_rows", f"{n} rows not yet in index {name}")
              for name, n in unindexed.items() if n]
    return found


def repair_plan(findings: pa.Table, chunks_name: str) -> tuple[list[str], list[str]]:
    """The chunks to delete (orphans, bad vectors) and the documents to send back through ingest, of one table."""
    mine = findings.filter(pc.equal(findings["table"], chunks_name)).to_pylist()
    drop = sorted({f["chunk_id"] for f in mine if f["check"] in ("orphan_chunk", "bad_vector") and f["chunk_id"]})
    requeue = sorted({f["doc_id"] for f in mine if f["doc_id"] and f["check"] != "orphan_chunk"})
    return drop, requeue


@dataclass(frozen=True)
class CacheSweep:
    """What maintenance does to the model cache: entries to mark unused now, to mark used again, to drop."""

    mark: list[str]
    unmark: list[str]
    drop: list[str]


def cache_sweep(entries: pa.Table, used: pa.Array, now: datetime, retention_days: float, keep: bool) -> CacheSweep:
    """Mark entries no chunk uses (since now), clear the mark of those used again, drop those unused past retention.

    entries: key and unused_since of each cache row. An answer a killed run paid for and never committed is
    unused too: kept for retention_days, so the next run finds it.
    """
    in_use = pc.is_in(entries["key"], value_set=used)
    marked = pc.is_valid(entries["unused_since"])
    mark = entries.filter(pc.and_(pc.invert(in_use), pc.invert(marked)))["key"]
    unmark = entries.filter(pc.and_(in_use, marked))["key"]
    cutoff = pa.scalar(now - timedelta(days=retention_days), entries.schema.field("unused_since").type)
    old = pc.and_(pc.and_(pc.invert(in_use), marked), pc.less(entries["unused_since"], cutoff))
    drop = [] if keep else entries.filter(old)["key"].unique().to_pylist()
    return CacheSweep(mark.unique().to_pylist(), unmark.unique().to_pylist(), drop)


def cache_findings(table: str, entries: pa.Table, expected: dict[str, int | None],
                   judged: tuple[str, ...] = ("embed", "enrich")) -> list[dict]:
    """Cache entries the config cannot use: vectors of the wrong size for its embedder, models it does not name.

    expected: each fingerprint the config's indexes use -> its vector size (None for an enricher). Entries of
    other models are no damage (an older model, another config): reported as one count per model, for the
    kinds judged (an enricher this machine cannot build, for want of a key, leaves its kind unjudged).
    """
    found = []
    sizes = {fp: dim for fp, dim in expected.items() if dim is not None}
    embed = entries.filter(pc.is_in(entries["fingerprint"], value_set=pa.array(list(sizes), pa.string())))
    for row in embed.select(["key", "fingerprint", "size"]).to_pylist():
        if row["size"] != sizes[row["fingerprint"]]:
            found.append(_finding(table, "cache_bad_vector", f"entry {row['key']} holds a {row['size']}-dim vector, "
                                  f"{row['fingerprint']} makes {sizes[row['fingerprint']]}"))
    foreign = entries.filter(pc.and_(pc.invert(pc.is_in(entries["fingerprint"], value_set=pa.array(
        list(expected), pa.string()))), pc.is_in(entries["kind"], value_set=pa.array(list(judged), pa.string()))))
    for item in pc.value_counts(foreign["fingerprint"]).to_pylist() if foreign.num_rows else []:
        found.append(_finding(table, "cache_foreign_model", f"{item['counts']} entries of {item['values']}, which "
                              "this config does not use (dropped once unused for the retention, unless kept)"))
    return found


@task(name="sweep model cache", cache_policy=NO_CACHE)
def cache_stage(store_uri: str, cache_table: str, chunks_tables: list[str], retention_days: float, keep: bool,
                now: datetime) -> dict[str, int]:
    """Mark model cache entries no chunk uses, drop those unused past the retention (unless kept); count them."""
    db = connect(store_uri)
    entries = maintenance.cache_entries(db, cache_table)
    if entries is None:
        return {"entries": 0, "unused": 0, "dropped": 0}
    sweep = cache_sweep(entries, maintenance.used_model_keys(db, chunks_tables), now, retention_days, keep)
    maintenance.set_unused_since(db, cache_table, sweep.mark, now)
    maintenance.set_unused_since(db, cache_table, sweep.unmark, None)
    dropped = maintenance.delete_cache_keys(db, cache_table, sweep.drop)
    unused = int(pc.sum(pc.is_valid(entries["unused_since"])).as_py() or 0) + len(sweep.mark) - len(sweep.unmark)
    return {"entries": entries.num_rows, "unused": unused - dropped, "dropped": dropped}


@task(name="compact and prune", cache_policy=NO_CACHE)
def compact_stage(store_uri: str, retention_days: float, now: datetime) -> dict[str, dict]:
    """Compact every table of the store, drop run tags older than the retention, prune older versions."""
    return maintenance.compact_store(store_uri, retention_days, now)


@task(name="compact and thin", cache_policy=NO_CACHE)
def compact_live_stage(store_uri: str, retention_days: float, keep_recent_s: float, now: datetime) -> dict[str, dict]:
    """Live mode: compact every table, prune untagged versions past keep_recent_s, keep one run tag per hour."""
    return maintenance.compact_store(store_uri, retention_days, now, keep_recent=timedelta(seconds=keep_recent_s))


@task(name="prune run folders", cache_policy=NO_CACHE)
def prune_runs_stage(artifacts: str, keep: int) -> list[str]:
    """Delete all but the newest run artifact folders; return the names deleted."""
    return prune_run_folders(artifacts, keep)


@task(name="refresh indexes", cache_policy=NO_CACHE)
def index_stage(store_uri: str, chunks_tables: list[str], fulltext: bool, ann_min_rows: int,
                language: str = "auto", live: bool = False) -> dict[str, dict]:
    """Create missing indexes, fold unindexed rows in and merge the runs' delta segments, for each chunks table.

    The full-text index is rebuilt if the table's most common language is no longer the one it stems for.
    live: fold every unindexed row in as a delta segment, merging segments only past a run's limit: a merge
    rewrites the whole index, a fold only the new rows.
    """
    db = connect(store_uri)
    return {name: refresh_indexes(table, fulltext=fulltext, ann_min_rows=ann_min_rows, merge=not live,
                                  language=language, fold_all=live)
            for name in chunks_tables if (table := open_table(db, name)) is not None}


@task(name="check integrity", cache_policy=NO_CACHE)
def integrity_stage(store_uri: str, pairs: list[tuple[str, str, int]], cache_table: str | None = None,
                    fingerprints: dict[str, int | None] | None = None,
                    judged: tuple[str, ...] = ("embed", "enrich")) -> pa.Table:
    """Run every integrity check over each (chunks table, documents table, dim) and the model cache; the findings."""
    db = connect(store_uri)
    rows = []
    entries = maintenance.cache_entries(db, cache_table) if cache_table else None
    if entries is not None:
        rows += cache_findings(cache_table, entries, fingerprints or {}, judged)
    for chunks_name, documents_name, dim in pairs:
        held = maintenance.IntegrityInputs(db, chunks_name, documents_name)
        if held.chunks_table is not None:
            rows += table_findings(chunks_name, held.documents, held.chunks(), held.vector_size(), dim,
                                   held.vector_batches(), held.unindexed())
    return pa.Table.from_pylist(rows, schema=FINDINGS_SCHEMA)


@task(name="repair", cache_policy=NO_CACHE)
def repair_stage(store_uri: str, findings: pa.Table, pairs: list[tuple[str, str, int]]) -> dict[str, int]:
    """Delete orphan chunks, bad vectors and cache entries of the wrong size; send damaged documents back to ingest.

    A document is sent back by clearing its content hash: the next run hashes the file again, finds
    it changed and rebuilds all its chunks. Unindexed rows are not repaired here: the index stage
    before the check already folded in what it could.
    """
    db = connect(store_uri)
    repaired = {"chunks_deleted": 0, "documents_requeued": 0, "cache_entries_deleted": 0}
    bad = [f for f in findings.to_pylist() if f["check"] == "cache_bad_vector"]
    if bad:  # the stages skip them and embed the text again; gone, the good vector made then is found
        keys = [f["detail"].split()[1] for f in bad]  # "entry <key> holds ..." (cache_findings)
        repaired["cache_entries_deleted"] = maintenance.delete_cache_keys(db, bad[0]["table"], keys)
    for chunks_name, documents_name, _ in pairs:
        drop, requeue = repair_plan(findings, chunks_name)
        repaired["chunks_deleted"] += maintenance.delete_chunks(db, chunks_name, drop)
        repaired["documents_requeued"] += maintenance.requeue_documents(db, documents_name, requeue)
    return repaired
