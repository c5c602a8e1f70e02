"""Planning a run's batches: which documents have work, cut into batches by count and size. Pure, but for the writes."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from runtime.artifacts import batch_dir, write_artifact
from schemas.arrow import DOCUMENTS_SCHEMA, REFRESH_ENRICHMENT, WORK, Change

_WORK = pa.array(WORK)


def needs_work(documents: pa.Table) -> pa.ChunkedArray:
    """Mask the documents a batch has work for: new or changed ones, and those whose enrichment alone is stale."""
    refresh = pc.and_(pc.equal(documents["change"], Change.UNCHANGED), pc.equal(documents["reason"], REFRESH_ENRICHMENT))
    return pc.or_(pc.is_in(documents["change"], _WORK), pc.fill_null(refresh, False))


def plan_batches(per_index: list[pa.Table], batch_docs: int, batch_mb: float, workers: int = 1) -> list[list[str]]:
    """Cut the documents any index has work for into batches of doc ids, in listing order. Pure.

    A batch closes at batch_docs documents or once its listed bytes reach batch_mb; a document larger
    than that is a batch of its own. With several workers, batch_docs is a ceiling: the documents are
    shared evenly over a multiple of workers batches, so that no worker is left alone with the last one
    (1,384 documents, 500 a batch, 2 workers: 4 batches of 346, not 500, 500 and 384).
    """
    wanted: set[str] = set()
    for documents in per_index:
        wanted.update(documents.filter(needs_work(documents))["doc_id"].to_pylist())
    if workers > 1 and len(wanted) > batch_docs:
        rounds = -(-len(wanted) // (batch_docs * workers))  # ceil: rounds of `workers` batches each
        batch_docs = -(-len(wanted) // (rounds * workers))
    limit = batch_mb * 1024 * 1024
    batches: list[list[str]] = []
    current: list[str] = []
    size = 0
    seen: set[str] = set()
    for documents in per_index:  # every index lists the same documents; later ones only add their own deletions
        for doc_id, nbytes in zip(documents["doc_id"].to_pylist(), documents["size"].to_pylist()):
            if doc_id not in wanted or doc_id in seen:
                continue
            seen.add(doc_id)
            if current and (len(current) >= batch_docs or size + (nbytes or 0) > limit):
                batches.append(current)
                current, size = [], 0
            current.append(doc_id)
            size += nbytes or 0
    if current:
        batches.append(current)
    return batches


def batch_bytes(documents: pa.Table, batches: list[list[str]]) -> list[int]:
    """Listed bytes of each batch's documents. Pure."""
    ids = pa.array([d for batch in batches for d in batch], pa.string())
    planned = documents.filter(pc.is_in(documents["doc_id"], ids))
    size_of = dict(zip(planned["doc_id"].to_pylist(), planned["size"].to_pylist()))
    return [sum(size_of.get(d) or 0 for d in ids) for ids in batches]


def write_batch_documents(per_index: list[pa.Table], run_dirs: list[str], batches: list[list[str]]) -> None:
    """Write each batch's share of each index's documents table where the batch will read it."""
    for number, ids in enumerate(batches):
        value_set = pa.array(ids, pa.string())
        for documents, run_dir in zip(per_index, run_dirs):
            write_artifact(documents.filter(pc.is_in(documents["doc_id"], value_set)),
                           batch_dir(run_dir, number), "documents", DOCUMENTS_SCHEMA)
