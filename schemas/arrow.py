"""Arrow contracts for every artifact and table. Field order is part of the contract."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

import pyarrow as pa
import pyarrow.compute as pc

from schemas.errors import DataContractError

_TAGS = pa.list_(pa.string())

# Metadata fields denormalised from the source config onto documents and chunks.
_METADATA_FIELDS = [
    pa.field("doc_type", pa.string()),
    pa.field("tags", _TAGS),
    pa.field("access_level", pa.string(), nullable=False),
    pa.field("language", pa.string()),
    pa.field("extra", pa.string()),  # JSON object of the source's free fields (subject, grade, ...)
    pa.field("expires_at", pa.timestamp("us", tz="UTC")),  # search leaves the document out after this
]

# The listing fields the documents table keeps.
_LISTED = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),  # "<source>:<relative posix path>", stable
    pa.field("source", pa.string(), nullable=False),
    pa.field("path", pa.string(), nullable=False),
    pa.field("uri", pa.string(), nullable=False),
    pa.field("size", pa.int64(), nullable=False),
    pa.field("mtime_ns", pa.int64(), nullable=False),
    pa.field("mime", pa.string()),
    *_METADATA_FIELDS,
    pa.field("meta_hash", pa.string(), nullable=False),  # hash of the metadata above: a change re-stamps chunks
    pa.field("validator", pa.string()),  # web: the page's ETag (or Last-Modified) for the next conditional request
])

# crawl -> listing: every document a source currently holds.
LISTING_SCHEMA = _LISTED.append(
    pa.field("member", pa.string())  # a page inside the file at path (an llms-full.txt bundle's URL or path)
).append(pa.field("listed_hash", pa.string()))  # content hash known at listing time: detection need not read path

# detect -> documents: the listing classified against the documents table, plus deleted ones.
DOCUMENTS_SCHEMA = LISTING_SCHEMA.append(pa.field("content_hash", pa.string())).append(
    pa.field("change", pa.string(), nullable=False)  # new | changed | unchanged | deleted
).append(pa.field("reason", pa.string()))  # why: content, settings, metadata, retry, unreadable: ...

# extract -> elements: the text of each processed document in reading order.
ELEMENTS_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("element_index", pa.int32(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),  # heading | text | list | table | code | markdown
    pa.field("text", pa.large_string(), nullable=False),
    pa.field("heading_level", pa.int32()),
    pa.field("page", pa.int32()),
])

# extract -> extracted: one row per processed document: its title, or why it failed.
EXTRACTED_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("title", pa.string()),
    pa.field("status", pa.string(), nullable=False),  # ok | quarantined
    pa.field("reason", pa.string()),
    pa.field("message", pa.string()),
    pa.field("content_hash", pa.string()),  # of the bytes actually extracted
    # The document's own metadata merged over its source's (front matter, <html lang>, detected
    # language); None: the listing's stands.
    pa.field("language", pa.string()),
    pa.field("tags", _TAGS),
    pa.field("extra", pa.string()),
    # A quarantined document: the stage that quarantined it (extract, chunk, enrich, embed, validate), and for
    # reason "error" the type of the exception it raised (what the systemic-failure breaker counts).
    pa.field("stage", pa.string()),
    pa.field("error_type", pa.string()),
    # What the document itself declares (tasks/access.py): its effective access level and expiry (None: the
    # listing's stand), and the level it declared, also when that was below its source's floor and ignored.
    pa.field("access_level", pa.string()),
    pa.field("expires_at", pa.timestamp("us", tz="UTC")),
    pa.field("declared_level", pa.string()),
])

CHUNKS_SCHEMA = pa.schema([
    pa.field("chunk_id", pa.string(), nullable=False),  # sha256(doc_id, text hash, repeat ordinal): stable when text moves
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("chunk_index", pa.int32(), nullable=False),
    pa.field("total_chunks", pa.int32(), nullable=False),
    pa.field("prev_chunk_id", pa.string()),
    pa.field("next_chunk_id", pa.string()),
    pa.field("heading_path", _TAGS),
    pa.field("text", pa.large_string(), nullable=False),
    pa.field("text_hash", pa.string(), nullable=False),
    pa.field("token_count", pa.int32(), nullable=False),
    pa.field("page_start", pa.int32()),
    pa.field("page_end", pa.int32()),
])

ENRICHED_CHUNKS_SCHEMA = pa.schema([
    *CHUNKS_SCHEMA,
    pa.field("enrichment", pa.large_string()),
    pa.field("enricher", pa.string()),  # fingerprint of the enricher, None when enrichment is off
    pa.field("enrich_key", pa.string()),  # hash(enrichment input, enricher): the cache key
    pa.field("enriched_now", pa.bool_(), nullable=False),  # the model was called for it in this run
])


def failed_mask(enriched: pa.Table) -> pa.ChunkedArray:
    """Mark rows whose enrichment failed: an enricher is set but there is no cache key."""
    return pc.and_(pc.is_valid(enriched["enricher"]), pc.is_null(enriched["enrich_key"]))


def embedded_chunks_schema(dim: int) -> pa.Schema:
    """Return the schema of the embedded_chunks artifact for vectors of size dim."""
    return pa.schema([
        *ENRICHED_CHUNKS_SCHEMA,
        pa.field("embed_key", pa.string(), nullable=False),  # hash(embedding input, embedder)
        pa.field("embedder", pa.string(), nullable=False),
        pa.field("embedded_now", pa.bool_(), nullable=False),
        pa.field("truncated", pa.bool_(), nullable=False),  # the input was longer than the embedder reads
        pa.field("vector", pa.list_(pa.float32(), dim), nullable=False),
    ])


def chunk_rows_schema(dim: int) -> pa.Schema:
    """Return the schema of the LanceDB chunks table (embedded chunks + filter fields)."""
    keep = [f for f in embedded_chunks_schema(dim) if f.name not in ("enriched_now", "embedded_now")]
    return pa.schema([
        *keep,
        pa.field("source", pa.string(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("uri", pa.string(), nullable=False),
        *_METADATA_FIELDS,
        # The run that wrote the row: a later run that finds it unchanged leaves it as it is (store/commit.py).
        pa.field("run_id", pa.string(), nullable=False),
    ])


# The store's kept extractions (tasks/kept.py): one row per document, the elements its bytes gave under one
# extraction fingerprint. A change of chunking, enrichment or embedder settings re-chunks from them, no file read.
KEPT_ELEMENT = pa.struct([
    pa.field("element_index", pa.int32(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),
    pa.field("text", pa.large_string(), nullable=False),
    pa.field("heading_level", pa.int32()),
    pa.field("page", pa.int32()),
])
KEPT_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("content_hash", pa.string(), nullable=False),  # sha256 of the bytes the elements came from
    pa.field("extraction_fp", pa.string(), nullable=False),  # code version, settings and parser library versions
    pa.field("title", pa.string()),
    pa.field("metadata", pa.large_string(), nullable=False),  # the document's own metadata, as JSON
    pa.field("detected", pa.bool_(), nullable=False),  # whether language detection ran on it
    pa.field("elements", pa.list_(KEPT_ELEMENT), nullable=False),
    pa.field("kept_at", pa.timestamp("us", tz="UTC"), nullable=False),
])

# The model cache (store/model_cache.py): one row per answer a model gave, by content key. Vectors are
# variable-size lists: one table serves every embedder, and the integrity check finds a size that is off.
EMBED, ENRICH = "embed", "enrich"  # the kinds of answer the model cache keeps
MODEL_CACHE_SCHEMA = pa.schema([
    pa.field("key", pa.string(), nullable=False),  # the embed_key or enrich_key of the chunks that use it
    pa.field("kind", pa.string(), nullable=False),  # "embed" or "enrich"
    pa.field("fingerprint", pa.string(), nullable=False),  # the embedder's or enricher's
    pa.field("vector", pa.list_(pa.float32())),
    pa.field("truncated", pa.bool_()),
    pa.field("enrichment", pa.large_string()),
    pa.field("prompt_tokens", pa.int64()),  # the call's usage, shared evenly among the answers it gave
    pa.field("output_tokens", pa.int64()),
    pa.field("cost_usd", pa.float64()),  # null: carried over from an older store's chunks, cost unknown
    pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("unused_since", pa.timestamp("us", tz="UTC")),  # set by maintenance while no chunk uses it
])


def model_cache_rows(kind: str, keys: pa.Array | list[str], fingerprints: pa.Array | list[str], now: datetime,
                     **columns: pa.Array | list) -> pa.Table:
    """Model cache rows of one kind: the answer columns given (vector, enrichment, tokens, ...), nulls for the rest."""
    n = len(keys)
    given = {"key": keys, "kind": [kind] * n, "fingerprint": fingerprints, "created_at": [now] * n, **columns}
    return pa.table({f.name: given[f.name] if f.name in given else pa.nulls(n, f.type) for f in MODEL_CACHE_SCHEMA},
                    schema=MODEL_CACHE_SCHEMA)


# LanceDB documents table: one row per source document; content_hash is the commit marker.
DOCUMENT_ROWS_SCHEMA = pa.schema([
    *_LISTED,
    pa.field("title", pa.string()),
    pa.field("content_hash", pa.string()),
    pa.field("settings_fp", pa.string()),  # "<chunking+embedder>/<enricher>[+enrichment-pending]" it was processed with
    pa.field("status", pa.string(), nullable=False),  # ok | quarantined
    pa.field("error", pa.string()),
    pa.field("total_chunks", pa.int32(), nullable=False),
    pa.field("first_run_id", pa.string(), nullable=False),
    pa.field("last_run_id", pa.string(), nullable=False),
    pa.field("updated_at", pa.timestamp("us", tz="UTC"), nullable=False),
])

# store.quarantine_table: what is quarantined now, one row per document, gone once it is indexed.
QUARANTINE_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("uri", pa.string(), nullable=False),
    pa.field("stage", pa.string(), nullable=False),  # crawl | detect | extract | chunk | enrich | embed
    pa.field("reason", pa.string(), nullable=False),  # short code: unreadable, encrypted, corrupt, empty, ...
    pa.field("message", pa.string(), nullable=False),
    pa.field("content_hash", pa.string()),
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("at", pa.timestamp("us", tz="UTC"), nullable=False),  # the run that last tried it
    pa.field("since", pa.timestamp("us", tz="UTC")),  # quarantined without a break since (null: an older Inlet's row)
    pa.field("attempts", pa.int32()),  # runs that tried it and failed since then
])

# Appended to a document's settings fingerprint while some of its chunks lack their enrichment,
# so that the next run takes the document up again and asks only for the missing ones.
# The chunks table's tag readers follow: moved to a run's last version when the run is done, so queries never
# see a run half committed. A table without it (written by hand) is read at its latest version.
PUBLISHED_TAG = "published"
ENRICHMENT_PENDING = "+enrichment-pending"
# The detect reason of an unchanged document whose stored chunks are re-enriched without re-chunking.
REFRESH_ENRICHMENT = "enrichment"


class Change(StrEnum):
    """What change detection says of a listed document (the documents artifact's `change` column)."""

    NEW = "new"
    CHANGED = "changed"
    UNCHANGED = "unchanged"
    DELETED = "deleted"


WORK = (Change.NEW, Change.CHANGED)  # the changes that send a document through extraction again

RUN_COUNTS = (
    "docs_new", "docs_changed", "docs_unchanged", "docs_deleted", "docs_quarantined", "docs_refreshed",
    "docs_access_raised",  # indexed at a higher access level than their source's, by their own declaration
    # Of the new and changed documents: read from their bytes, or re-chunked from kept elements (tasks/kept.py).
    "docs_extracted", "docs_from_kept",
    # Reused: chunk ids kept across an edit; written: rows appended (a row found unchanged is not written again).
    "chunks_added", "chunks_removed", "chunks_reused", "chunks_written",
    "texts_enriched", "texts_enrich_failed", "texts_embedded", "texts_truncated",
    "texts_enrich_cached", "texts_embed_cached",  # distinct texts the model cache served instead of the model
)
# What a plan (`inlet plan`, a dry run) counts, named as the run that follows it reports the same things.
PLAN_COUNTS = ("docs_new", "docs_changed", "docs_unchanged", "docs_deleted", "docs_held", "docs_refreshed",
               "docs_quarantined", "docs_extracted", "docs_from_kept", "chunks", "texts_enriched", "texts_enrich_cached", "texts_embedded",
               "texts_embed_cached")
# Model usage of a run; *_usd are estimates from the config's price table, the rest are counts.
ENRICH_USAGE = ("llm_calls", "llm_retries", "llm_malformed", "llm_failures", "llm_prompt_tokens",
                "llm_output_tokens", "llm_cached_tokens", "llm_batch_jobs", "llm_batch_requests", "llm_cost_usd",
                "llm_saved_usd")
EMBED_USAGE = ("embed_calls", "embed_retries", "embed_tokens", "embed_batch_jobs", "embed_cost_usd",
               "embed_saved_usd")
RUN_USAGE = (*ENRICH_USAGE, *EMBED_USAGE, "cost_usd", "cost_saved_usd")


def _usage_type(name: str) -> pa.DataType:
    return pa.float64() if name.endswith("_usd") else pa.int64()

RUNS_SCHEMA = pa.schema([
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("started_at", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("finished_at", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("config_fp", pa.string(), nullable=False),
    *[pa.field(name, pa.int64(), nullable=False) for name in RUN_COUNTS],
    *[pa.field(name, _usage_type(name), nullable=False) for name in RUN_USAGE],
    pa.field("stage_seconds", pa.string(), nullable=False),  # JSON {stage: seconds}
    pa.field("versions", pa.string(), nullable=False),  # JSON {table: version}
    pa.field("notices", _TAGS),
    # The publish gate (publish.gate): passed or held, with the run's recall@k and the published version's.
    pa.field("gate", pa.string()),
    pa.field("gate_recall", pa.float64()),
    pa.field("gate_baseline", pa.float64()),
])


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Select and cast table to schema, naming what is missing or mistyped."""
    have = set(table.column_names)  # a list built anew on each access
    missing = [n for n in schema.names if n not in have]
    if missing:
        msg = f"table lacks columns {missing}; has {table.column_names}"
        raise DataContractError(msg)
    selected = table.select(schema.names)
    if selected.schema.equals(schema, check_metadata=True):
        return selected  # Table.cast walks every column in Python even when nothing changes (~10 us a column)
    try:
        return selected.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
        msg = f"table does not match schema: {exc}"
        raise DataContractError(msg) from exc
