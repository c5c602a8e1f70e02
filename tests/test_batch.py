"""Batch planning: which documents go into which batch."""

from __future__ import annotations

import pyarrow as pa

from schemas.arrow import DOCUMENTS_SCHEMA, REFRESH_ENRICHMENT
from tasks.plan import plan_batches


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


def test_with_several_workers_batches_are_even_and_a_multiple_of_the_workers():
    docs = _documents([(f"d{n:04d}", "new", None, 1) for n in range(1384)])
    sizes = [len(b) for b in plan_batches([docs], batch_docs=500, batch_mb=64, workers=2)]
    assert sizes == [346, 346, 346, 346]
    sizes = [len(b) for b in plan_batches([docs], batch_docs=500, batch_mb=64, workers=3)]
    assert sizes == [462, 462, 460], "one round of three batches, none over 500"
    assert [len(b) for b in plan_batches([docs], batch_docs=2000, batch_mb=64, workers=2)] == [1384], \
        "one batch holds them all: nothing to share"
