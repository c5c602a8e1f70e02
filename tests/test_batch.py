"""Batch planning: which documents go into which batch."""

from __future__ import annotations

import pyarrow as pa

from schemas.arrow import DOCUMENTS_SCHEMA, REFRESH_ENRICHMENT
from tasks.batch import plan_batches


def _documents(rows: list[tuple[str, str, str | None, int]]) -> pa.Table:
    return pa.Table.from_pylist([{"doc_id": d, "source": "s", "path": d, "uri": d, "size": size, "mtime_ns": 0,
                                  "access_level": "public", "meta_hash": "m", "change": change, "reason": reason}
                                 for d, change, reason, size in rows], schema=DOCUMENTS_SCHEMA)


def test_batches_hold_the_documents_with_work_in_listing_order_closing_at_a_count_or_a_size():
    mb = 1024 * 1024
    docs = _documents([("a", "new", None, 1), ("b", "unchanged", None, 1), ("c", "changed", None, 1),
                       ("d", "unchanged", REFRESH_ENRICHMENT, 1), ("e", "deleted", None, 1),
                       ("f", "new", None, 3 * mb), ("g", "new", None, 1)])
    assert plan_batches([docs], batch_docs=2, batch_mb=64) == [["a", "c"], ["d", "f"], ["g"]]
    # A document larger than batch_mb is a batch of its own; unchanged and deleted ones are in none.
    assert plan_batches([docs], batch_docs=10, batch_mb=2) == [["a", "c", "d"], ["f"], ["g"]]


def test_a_document_any_index_has_work_for_is_planned_once():
    main = _documents([("a", "unchanged", None, 1), ("b", "new", None, 1)])
    variant = _documents([("a", "changed", None, 1), ("b", "new", None, 1)])
    assert plan_batches([main, variant], batch_docs=5, batch_mb=64) == [["a", "b"]]
