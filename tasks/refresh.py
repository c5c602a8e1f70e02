"""Stored chunks of documents whose enrichment is stale join this run's chunks: re-enriched without re-chunking."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from runtime.artifacts import read_artifact, write_artifact
from schemas.arrow import (
    CHUNKS_SCHEMA,
    DOCUMENTS_SCHEMA,
    EXTRACTED_SCHEMA,
    REFRESH_ENRICHMENT,
    Change,
)
from store.tables import connect, open_table, select_where_in

_OWN = ("language", "tags", "extra", "access_level", "expires_at")  # a document's merged metadata, as committed
_STORED = pa.schema([*CHUNKS_SCHEMA, pa.field("title", pa.string()),
                     *(EXTRACTED_SCHEMA.field(name) for name in _OWN)])


def refresh_ids(documents: pa.Table) -> list[str]:
    """Return the documents whose bytes and chunks are current but whose enrichment is not."""
    mask = pc.and_(pc.equal(documents["change"], Change.UNCHANGED), pc.equal(documents["reason"], REFRESH_ENRICHMENT))
    return documents.filter(pc.fill_null(mask, False))["doc_id"].to_pylist()


def stored_work(stored: pa.Table, documents: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Turn stored chunk rows into (chunks, extracted) rows, as if the documents had been chunked in this run."""
    stored = stored.sort_by([("doc_id", "ascending"), ("chunk_index", "ascending")])
    hashes = dict(zip(documents["doc_id"].to_pylist(), documents["content_hash"].to_pylist()))
    first: dict[str, dict] = {}
    for row in stored.select(["doc_id", "title", *_OWN]).to_pylist():
        first.setdefault(row["doc_id"], row)
    # The stored chunks carry the document's merged metadata (front matter, detected language, its own access
    # level and expiry): keep it.
    extracted = pa.Table.from_pylist(
        [{"doc_id": d, "title": first.get(d, {}).get("title"), "status": "ok", "reason": None, "message": None,
          "content_hash": hashes[d], **{k: first.get(d, {}).get(k) for k in _OWN}}
         for d in refresh_ids(documents)], schema=EXTRACTED_SCHEMA)
    return stored.select(CHUNKS_SCHEMA.names).cast(CHUNKS_SCHEMA), extracted


@task(name="refresh enrichment", cache_policy=NO_CACHE)
def refresh_stage(documents_path: str, chunks_path: str, extracted_path: str, store_uri: str, chunks_table: str,
                  run_dir: str) -> tuple[str, str]:
    """Add the stored chunks of stale-enrichment documents to this run's chunks and extracted artifacts."""
    documents = read_artifact(documents_path, DOCUMENTS_SCHEMA)
    ids = refresh_ids(documents)
    if not ids:
        get_run_logger().info("no document's enrichment alone is stale: nothing to refresh")
        return chunks_path, extracted_path
    stored = select_where_in(open_table(connect(store_uri), chunks_table), "doc_id", ids, _STORED.names, _STORED)
    chunks, extracted = stored_work(stored, documents)
    get_run_logger().info("re-enriching %d stored chunks of %d documents (not re-chunked)", chunks.num_rows,
                          len(ids))
    chunks = pa.concat_tables([read_artifact(chunks_path, CHUNKS_SCHEMA), chunks])
    extracted = pa.concat_tables([read_artifact(extracted_path, EXTRACTED_SCHEMA), extracted])
    return (write_artifact(chunks, run_dir, "work_chunks", CHUNKS_SCHEMA),
            write_artifact(extracted, run_dir, "work_extracted", EXTRACTED_SCHEMA))
