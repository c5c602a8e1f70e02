"""chunks -> enriched_chunks: enrichment in its own column, reused whenever its cache key is known."""

from __future__ import annotations

import hashlib

import pyarrow as pa
from prefect import get_run_logger

from providers.enrichers import EnrichInput, Enricher, make_enricher
from schemas.arrow import CHUNKS_SCHEMA, ENRICHED_CHUNKS_SCHEMA, EXTRACTED_SCHEMA
from schemas.config import EnrichmentConfig
from tasks.artifacts import read_artifact, write_artifact
from tasks.stage import stage
from tasks.store import connect, open_table, select_where_in

BATCH = 64  # chunks per enricher call


def enrich_key(item: EnrichInput, fingerprint: str) -> str:
    """Cache key of one enrichment: everything the enricher sees, and the enricher itself."""
    blob = "\0".join([fingerprint, item.title or "", "\x1f".join(item.heading_path), item.text])
    return hashlib.sha256(blob.encode()).hexdigest()


def enrich_inputs(chunks: pa.Table, titles: dict[str, str | None]) -> list[EnrichInput]:
    """Return what the enricher sees of each chunk."""
    return [EnrichInput(r["text"], titles.get(r["doc_id"]), tuple(r["heading_path"] or ()))
            for r in chunks.select(["doc_id", "text", "heading_path"]).to_pylist()]


def enrich_chunks(chunks: pa.Table, items: list[EnrichInput], enricher: Enricher | None,
                  cached: dict[str, str]) -> pa.Table:
    """Add enrichment columns; call the enricher only for keys not in cached (each key once)."""
    n = chunks.num_rows
    if enricher is None:
        nulls = pa.nulls(n, pa.string())
        return chunks.append_column("enrichment", nulls.cast(pa.large_string())).append_column(
            "enricher", nulls).append_column("enrich_key", nulls).append_column("enriched_now", pa.array([False] * n))
    keys = [enrich_key(i, enricher.fingerprint) for i in items]
    todo = {k: i for k, i in zip(keys, items) if k not in cached}
    fresh: dict[str, str] = {}
    pending = list(todo.items())
    for start in range(0, len(pending), BATCH):
        batch = pending[start : start + BATCH]
        fresh.update(zip([k for k, _ in batch], enricher.enrich([i for _, i in batch])))
    seen_now: set[str] = set()
    now = []
    for k in keys:  # only the first row with a fresh key counts as enriched in this run
        now.append(k in fresh and k not in seen_now)
        seen_now.add(k)
    values = [fresh.get(k, cached.get(k)) for k in keys]
    return (chunks.append_column("enrichment", pa.array(values, pa.large_string()))
            .append_column("enricher", pa.array([enricher.fingerprint] * n, pa.string()))
            .append_column("enrich_key", pa.array(keys, pa.string()))
            .append_column("enriched_now", pa.array(now, pa.bool_())))


@stage("enrich")
def enrich_stage(chunks_path: str, extracted_path: str, cfg: EnrichmentConfig, store_uri: str,
                 chunks_table: str, run_dir: str) -> str:
    """Enrich chunks whose enrichment is not already stored; write enriched_chunks."""
    chunks = read_artifact(chunks_path, CHUNKS_SCHEMA)
    enricher = make_enricher(cfg) if cfg.enabled else None
    extracted = read_artifact(extracted_path, EXTRACTED_SCHEMA)
    items = enrich_inputs(chunks, dict(zip(extracted["doc_id"].to_pylist(), extracted["title"].to_pylist())))
    cached: dict[str, str] = {}
    if enricher is not None and items:
        keys = [enrich_key(i, enricher.fingerprint) for i in items]
        table = open_table(connect(store_uri), chunks_table)
        found = select_where_in(table, "enrich_key", keys, ["enrich_key", "enrichment"], ENRICHED_CHUNKS_SCHEMA)
        cached = dict(zip(found["enrich_key"].to_pylist(), found["enrichment"].to_pylist()))
    enriched = enrich_chunks(chunks, items, enricher, cached)
    made = sum(enriched["enriched_now"].to_pylist())
    get_run_logger().info("enriched %d of %d chunks (%d reused)", made, chunks.num_rows, chunks.num_rows - made)
    return write_artifact(enriched, run_dir, "enriched_chunks", ENRICHED_CHUNKS_SCHEMA)
