"""Change detection at the document level: stat first, then bytes, then settings and metadata."""

from __future__ import annotations

import pyarrow as pa

from schemas.arrow import DOCUMENT_ROWS_SCHEMA, LISTING_SCHEMA
from tasks.detect import classify_documents


def _listed(doc_id: str, size: int = 10, mtime: int = 1, meta: str = "m") -> dict:
    return {"doc_id": doc_id, "source": "s", "path": f"/x/{doc_id}", "uri": f"file:///x/{doc_id}", "size": size,
            "mtime_ns": mtime, "mime": None, "doc_type": None, "tags": [], "access_level": "public",
            "language": None, "extra": "{}", "meta_hash": meta}


def _known(doc_id: str, digest: str | None = "h", status: str = "ok", fp: str = "fp", **listed) -> dict:
    return {**_listed(doc_id, **listed), "title": None, "content_hash": digest, "settings_fp": fp,
            "status": status, "error": None, "total_chunks": 1, "first_run_id": "r", "last_run_id": "r",
            "updated_at": pa.scalar(0, pa.timestamp("us", tz="UTC")).as_py()}


def _classify(listing: list[dict], known: list[dict], hashes: dict[str, str | None], **kw) -> dict[str, tuple]:
    hashed: list[str] = []

    def hasher(path: str) -> str | None:
        hashed.append(path)
        return hashes[path.rsplit("/", 1)[1]]

    out = classify_documents(pa.Table.from_pylist(listing, schema=LISTING_SCHEMA),
                             pa.Table.from_pylist(known, schema=DOCUMENT_ROWS_SCHEMA), "fp",
                             hasher=hasher, sources={"s"}, **kw)
    result = {r["doc_id"]: (r["change"], r["reason"]) for r in out.to_pylist()}
    result["_hashed"] = tuple(sorted(p.rsplit("/", 1)[1] for p in hashed))
    return result


def test_same_stat_is_unchanged_without_reading_the_file():
    got = _classify([_listed("a")], [_known("a")], {})
    assert got == {"a": ("unchanged", None), "_hashed": ()}


def test_new_changed_touched_deleted():
    listing = [_listed("new"), _listed("edit", size=11), _listed("touch", mtime=2)]
    known = [_known("edit"), _known("touch"), _known("gone")]
    got = _classify(listing, known, {"new": "n", "edit": "h2", "touch": "h"})
    assert got == {"new": ("new", None), "edit": ("changed", "content"), "touch": ("unchanged", "touched"),
                   "gone": ("deleted", None), "_hashed": ("edit", "new", "touch")}


def test_settings_or_metadata_change_reprocesses():
    got = _classify([_listed("a"), _listed("b", meta="other")], [_known("a", fp="old"), _known("b")], {})
    assert got["a"] == ("changed", "settings") and got["b"] == ("changed", "metadata")


def test_quarantined_unchanged_waits_unless_asked_or_changed():
    known = [_known("q", status="quarantined")]
    assert _classify([_listed("q")], known, {})["q"] == ("unchanged", "quarantined")
    assert _classify([_listed("q")], known, {}, retry_quarantined=True)["q"] == ("changed", "retry")
    assert _classify([_listed("q", size=3)], known, {"q": "fixed"})["q"] == ("changed", "content")


def test_unreadable_file_is_flagged_and_retried_next_time():
    assert _classify([_listed("u")], [], {"u": None})["u"] == ("new", "unreadable")
    was_unreadable = [_known("u", digest=None, status="quarantined")]
    assert _classify([_listed("u")], was_unreadable, {"u": "now"})["u"] == ("changed", "content")


def test_documents_of_unlisted_sources_are_not_deleted():
    other = {**_known("o"), "source": "removed-source"}
    got = _classify([], [other], {})
    assert "o" not in got


def test_enricher_change_or_pending_enrichment_refreshes_without_reprocessing():
    known = [_known("a", fp="fp/old-enricher"), _known("b", fp="fp/+enrichment-pending"),
             _known("c", fp="other/old-enricher")]
    got = _classify([_listed("a"), _listed("b"), _listed("c")], known, {})
    assert got["a"] == ("unchanged", "enrichment") and got["b"] == ("unchanged", "enrichment")
    assert got["c"] == ("changed", "settings"), "chunk settings changed too: reprocessed from the bytes"


def test_files_judged_over_whole_columns_are_classified_as_one_by_one_and_keep_the_listing_order():
    # unchanged_by_stat settles most files without _classify; every case must come out as _classify says.
    from tasks.detect import _classify as one_by_one

    listing = [_listed("same"), _listed("same2"), _listed("nohash"), _listed("q"), _listed("oldfp"),
               _listed("meta", meta="new"), _listed("touch", mtime=9), _listed("new"), _listed("grown", size=99)]
    known = [_known("same"), _known("same2"), _known("nohash", digest=None), _known("q", status="quarantined"),
             _known("oldfp", fp="fp/other"), _known("meta"), _known("touch"), _known("grown"), _known("gone")]
    hashes = {"nohash": "h", "touch": "h", "new": "h", "q": "h", "grown": "h2"}
    got = _classify(listing, known, hashes)
    by_id = {k["doc_id"]: k for k in known}
    expected = {row["doc_id"]: one_by_one(row, by_id.get(row["doc_id"]), "fp", lambda p: hashes[p.rsplit("/", 1)[1]],
                                          False, float("inf"))[:2] for row in listing}
    assert {k: v for k, v in got.items() if k not in ("_hashed", "gone")} == expected
    assert got["same"] == got["same2"] == ("unchanged", None) and got["gone"] == ("deleted", None)
    assert got["_hashed"] == ("grown", "new", "nohash", "touch"), "a file judged by its stat is never read"
    out = classify_documents(pa.Table.from_pylist(listing, schema=LISTING_SCHEMA),
                             pa.Table.from_pylist(known, schema=DOCUMENT_ROWS_SCHEMA), "fp",
                             hasher=lambda p: "h", sources={"s"})
    assert out["doc_id"].to_pylist() == [r["doc_id"] for r in listing] + ["gone"]
    assert out["content_hash"].to_pylist()[0] == "h"


def test_a_document_a_killed_run_was_committing_is_changed_whatever_its_bytes_say():
    listing = [_listed("kept"), _listed("putback", mtime=5), _listed("other")]
    known = [_known("kept"), _known("putback"), _known("other")]
    got = _classify(listing, known, {"putback": "h"}, interrupted={"kept", "putback", "gone-anyway"})
    assert got["kept"] == got["putback"] == ("changed", "interrupted")
    assert got["other"] == ("unchanged", None) and got["_hashed"] == ("putback",)
