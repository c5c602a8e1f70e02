"""listing + documents table -> documents: each file classified new, changed, unchanged or deleted."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from providers.embedders import embedder_spec
from providers.enrichers import make_enricher
from runtime.artifacts import read_artifact, write_artifact
from schemas.arrow import DOCUMENTS_SCHEMA, LISTING_SCHEMA, REFRESH_ENRICHMENT, Change, conform
from schemas.config import InletConfig
from schemas.errors import ConfigError
from tasks.crawl import in_scope

# Bump when extraction or chunking code changes what it produces: every document is reprocessed.
# 2: Markdown cleaning, PDF running headers, HTML boilerplate, character-safe windows. 3: documents' own access
# level and expiry (tasks/access.py): a store built before honoured neither, so every document is read again
# (its chunks keep their enrichments and vectors: only extraction and chunking are repeated).
PIPELINE_VERSION = "3"

Hasher = Callable[[str], str | None]


def hash_file(path: str) -> str | None:
    """Return the sha256 of a file's bytes, or None when it cannot be read."""
    try:
        with Path(path).open("rb") as fh:
            # One reused buffer: reading 1 MiB blocks allocated (and freed) a fresh MiB per file.
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None


def _short_hash(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def settings_fingerprint(cfg: InletConfig) -> str:
    """Return '<chunk settings>/<enricher>': what decides a document's chunks and vectors, then its enrichments.

    The two halves are compared apart: a change in the first reprocesses the document from its bytes,
    a change in the second only re-enriches (and re-embeds) its stored chunks, without re-chunking.
    """
    enricher = make_enricher(cfg.enrichment).fingerprint if cfg.enrichment.enabled else None
    chunking = {
        "pipeline": PIPELINE_VERSION,
        # How many workers and how long they may take change no document's text: not part of it.
        "extraction": cfg.extraction.model_dump(mode="json", exclude={"workers", "timeout_s"}),
        "chunking": cfg.chunking.model_dump(mode="json"),
        "delimiter": cfg.enrichment.delimiter,
        "embedder": embedder_spec(cfg.embedding).fingerprint,
    }
    return f"{_short_hash(chunking)}/{_short_hash(enricher)}"


def _digest(row: dict, hasher: Hasher, max_bytes: float) -> str | None:
    """Hash the file, or, over the size limit, stand its size and mtime in for the hash without reading it.

    A hash the crawl already knows (a bundle's page) is taken as it is.
    """
    if row.get("listed_hash"):
        return row["listed_hash"]
    if "://" in row["path"]:
        # Object storage: never downloaded to be compared; a new ETag (or stat) marks it changed and
        # extraction records the real hash.
        return f"object:{row.get('validator') or ''}:{row['size']}:{row['mtime_ns']}"
    if row["size"] > max_bytes:
        return f"unread:{row['size']}:{row['mtime_ns']}"
    return hasher(row["path"])


def _classify(row: dict, known: dict | None, settings_fp: str, hasher: Hasher, retry: bool,
              max_bytes: float) -> tuple[str, str | None, str | None]:
    """Return (change, reason, content_hash) for one listed file."""
    if known is None:
        digest = _digest(row, hasher, max_bytes)
        return Change.NEW, None if digest else "unreadable", digest
    same_stat = (row["size"], row["mtime_ns"]) == (known["size"], known["mtime_ns"])
    # An object (or page) whose ETag is the stored one is unchanged whatever its timestamps say.
    same_validator = bool(row.get("validator")) and row.get("validator") == known.get("validator")
    digest = (known["content_hash"] if (same_stat or same_validator) and known["content_hash"]
              else _digest(row, hasher, max_bytes))
    if digest is None:
        return Change.CHANGED, "unreadable", None
    if digest != known["content_hash"]:
        return Change.CHANGED, "content", digest
    if known["status"] == "quarantined":
        return (Change.CHANGED, "retry", digest) if retry else (Change.UNCHANGED, "quarantined", digest)
    chunking, _, enricher = settings_fp.partition("/")
    known_chunking, _, known_enricher = (known["settings_fp"] or "").partition("/")
    if known_chunking != chunking:
        return Change.CHANGED, "settings", digest
    if known["meta_hash"] != row["meta_hash"]:
        return Change.CHANGED, "metadata", digest
    if known_enricher != enricher:  # another enricher, or some enrichments failed: its chunks are re-enriched
        return Change.UNCHANGED, REFRESH_ENRICHMENT, digest
    return Change.UNCHANGED, None if same_stat else "touched", digest


# The listed columns _classify reads.
_LISTED = ("doc_id", "path", "size", "mtime_ns", "validator", "listed_hash", "meta_hash")
# The stored columns _classify compares a listed file with.
_COMPARED = ("doc_id", "source", "size", "mtime_ns", "validator", "content_hash", "status", "settings_fp", "meta_hash")


def _same(a: pa.ChunkedArray | pa.Array, b: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray:
    """Element-wise equality where two nulls are equal, as Python's == compares None."""
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return pc.or_(pc.fill_null(pc.equal(a, b), False), both_null)


def unchanged_by_stat(listing: pa.Table, known: pa.Table, settings_fp: str) -> tuple[pa.ChunkedArray, pa.Table]:
    """Mask the listed files that _classify would call unchanged without reading them; return it and their known rows.

    Same size and mtime as stored, a stored hash, not quarantined, the same settings and metadata: most
    files of a run. Judged over whole columns, so only the rest go through _classify one by one.
    """
    if not known.num_rows:
        return pa.chunked_array([pa.array([False] * listing.num_rows)]), known
    position = pc.index_in(listing["doc_id"], value_set=known["doc_id"])
    aligned = known.take(pc.fill_null(position, 0))
    mask = pc.is_valid(position)
    for column in ("size", "mtime_ns", "meta_hash"):
        mask = pc.and_(mask, _same(listing[column], aligned[column]))
    mask = pc.and_(mask, pc.is_valid(aligned["content_hash"]))
    mask = pc.and_(mask, pc.fill_null(pc.not_equal(aligned["status"], "quarantined"), True))
    mask = pc.and_(mask, pc.fill_null(pc.equal(aligned["settings_fp"], settings_fp), False))
    return mask, aligned


def classify_documents(
    listing: pa.Table, known: pa.Table, settings_fp: str, *, hasher: Hasher = hash_file,
    sources: set[str], retry_quarantined: bool = False, max_bytes: float = float("inf"),
    interrupted: frozenset[str] | set[str] = frozenset(), scope: dict[str, list[str]] | None = None,
) -> pa.Table:
    """Classify the listing against known document rows; known rows of listed sources that vanished are deleted.

    Files over max_bytes are not read, not even to hash them: extraction quarantines them as too_large.
    interrupted: documents a killed run was committing (store/inflight.py): changed, whatever their bytes say.
    scope: sources listed only at some relative paths (live mode): only their known rows there can vanish.
    """
    # Only the columns a comparison reads: a Python copy of every stored column cost more than the comparing.
    slim = known.select([c for c in _COMPARED if c in known.column_names])
    quick, aligned = unchanged_by_stat(listing, slim, settings_fp)
    if interrupted:
        quick = pc.and_(quick, pc.invert(pc.is_in(listing["doc_id"], value_set=pa.array(sorted(interrupted),
                                                                                          pa.string()))))
    quick_rows = quick.to_pylist()
    content = aligned["content_hash"].to_pylist() if slim.num_rows else [None] * listing.num_rows
    change = [Change.UNCHANGED if q else None for q in quick_rows]
    reason: list[str | None] = [None] * listing.num_rows
    slow = [i for i, q in enumerate(quick_rows) if not q]
    if slow:  # the rest, one by one in Python (~1 in 100 files of a 1% run)
        rest = listing.take(pa.array(slow, pa.int64()))
        ids = rest["doc_id"]
        by_id = {r["doc_id"]: r for r in slim.filter(pc.is_in(slim["doc_id"], value_set=ids)).to_pylist()}
        # Only what _classify reads of a listed row: a cold run's every listed row comes through here.
        read = [c for c in _LISTED if c in rest.column_names]
        for i, row in zip(slow, rest.select(read).to_pylist()):
            change[i], reason[i], content[i] = _classify(row, by_id.get(row["doc_id"]), settings_fp, hasher,
                                                         retry_quarantined, max_bytes)
            if change[i] == Change.UNCHANGED and row["doc_id"] in interrupted:
                change[i], reason[i] = Change.CHANGED, "interrupted"
    documents = (listing.append_column("content_hash", pa.array(content, pa.string()))
                 .append_column("change", pa.array(change, pa.string()))
                 .append_column("reason", pa.array(reason, pa.string())))
    listed = pc.is_in(known["doc_id"], value_set=listing["doc_id"])
    gone = pc.and_(pc.invert(listed), pc.is_in(known["source"], value_set=pa.array(sorted(sources), pa.string())))
    gone = pc.and_(gone, outside_scope_kept(known, scope))
    vanished = known.filter(gone)
    if vanished.num_rows:
        rows = [{**{k: old.get(k) for k in LISTING_SCHEMA.names}, "content_hash": old["content_hash"],
                 "change": Change.DELETED, "reason": None} for old in vanished.to_pylist()]
        documents = pa.concat_tables([conform(documents, DOCUMENTS_SCHEMA),
                                      pa.Table.from_pylist(rows, schema=DOCUMENTS_SCHEMA)])
    return conform(documents, DOCUMENTS_SCHEMA)


def outside_scope_kept(known: pa.Table, scope: dict[str, list[str]] | None) -> pa.ChunkedArray | pa.Array:
    """Mask the known rows a listing could have seen: all but those of a scoped source outside its paths."""
    mask = pa.array([True] * known.num_rows, pa.bool_())
    for source, rels in (scope or {}).items():
        of_source = pc.equal(known["source"], source)
        mask = pc.and_(mask, pc.or_(pc.invert(of_source), in_scope(known["doc_id"], source, rels)))
    return mask


def held_deletions(listing: pa.Table, known: pa.Table, failed: dict[str, str],
                   max_share: dict[str, float], scope: dict[str, list[str]] | None = None) -> dict[str, str]:
    """Return the sources whose deletions must be held, with why: the mass-deletion guard.

    A source is held when its listing failed, came back empty, or would delete more than its
    max_delete_share of the documents the store holds for it: an unmounted drive or a broken
    sitemap must not empty the index.
    """
    known_ids: dict[str, set[str]] = {}
    seen = outside_scope_kept(known, scope).to_pylist()
    scoped: dict[str, set[str]] = {}  # what a scoped source's listing could have seen
    for doc_id, source, visible in zip(known["doc_id"].to_pylist(), known["source"].to_pylist(), seen):
        known_ids.setdefault(source, set()).add(doc_id)
        if visible:
            scoped.setdefault(source, set()).add(doc_id)
    listed: dict[str, set[str]] = {}
    for doc_id, source in zip(listing["doc_id"].to_pylist(), listing["source"].to_pylist()):
        listed.setdefault(source, set()).add(doc_id)
    held = {}
    for source, share in max_share.items():
        have = known_ids.get(source, set())
        gone = scoped.get(source, set()) - listed.get(source, set())
        if not gone:
            continue
        if source in failed:
            held[source] = f"its listing failed ({failed[source]})"
        elif not listed.get(source) and source not in (scope or {}):  # a scoped listing may rightly be empty
            held[source] = "its listing came back empty"
        elif len(gone) > share * len(have):
            held[source] = f"it would delete {len(gone)} of its {len(have)} documents (more than {share:.0%})"
    return held


def refuse_unindexed_failures(origin: str, cfg: InletConfig, failed: dict[str, str], known: pa.Table) -> None:
    """Raise a ConfigError naming the file and key for a missing source path the store holds nothing of.

    A source that was indexed before and now fails to list is held by the guard (an unmounted
    drive, say); one that never listed is most likely a mistake in the config.
    """
    indexed = set(known["source"].to_pylist())
    for i, src in enumerate(cfg.sources):
        if src.name in failed and src.name not in indexed and src.path is not None and not src.path.exists():
            msg = f"{origin}: sources.{i}.path: source '{src.name}' {failed[src.name]}"
            raise ConfigError(msg)


@task(name="detect", cache_policy=NO_CACHE)
def detect_stage(listing_path: str, known: pa.Table, settings_fp: str, cfg: InletConfig, run_dir: str,
                 retry_quarantined: bool = False, failed_sources: dict[str, str] | None = None,
                 allow_deletions: bool = False, interrupted: frozenset[str] = frozenset(),
                 scope: dict[str, list[str]] | None = None) -> tuple[str, list[str]]:
    """Classify listed files against the documents table and write the documents artifact; return it and notices.

    Sources held by the mass-deletion guard keep their vanished documents, unless allow_deletions. scope: the
    sources listed only at some paths (live mode), whose other documents are left as they are.
    """
    listing = read_artifact(listing_path, LISTING_SCHEMA)
    failed_sources = failed_sources or {}
    held = held_deletions(listing, known, failed_sources, {s.name: s.max_delete_share for s in cfg.sources}, scope)
    notices = [f"source '{name}': nothing deleted, because {why}; run with --allow-deletions to delete anyway"
               for name, why in held.items() if not allow_deletions]
    notices += [f"source '{name}': listing failed: {why}" for name, why in failed_sources.items() if name not in held]
    documents = classify_documents(
        listing, known, settings_fp,
        sources={s.name for s in cfg.sources} - (set() if allow_deletions else set(held)),
        retry_quarantined=retry_quarantined, max_bytes=cfg.extraction.max_file_mb * 1024 * 1024,
        interrupted=interrupted, scope=scope,
    )
    counts = dict.fromkeys(Change, 0)
    for change in documents["change"].to_pylist():
        counts[change] += 1
    logger = get_run_logger()
    logger.info("documents: %s", ", ".join(f"{v} {k}" for k, v in counts.items()))
    for notice in notices:
        logger.warning(notice)
    return write_artifact(documents, run_dir, "documents", DOCUMENTS_SCHEMA), notices
