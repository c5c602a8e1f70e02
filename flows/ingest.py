"""Ingest flow: crawl -> detect changes -> extract -> chunk -> enrich -> embed -> upsert -> report."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from prefect import flow

from providers.embedders import embedder_spec, resolve_embedding
from providers.enrichers import resolve_enrichment
from providers.keys import use_secret_block
from schemas.config import load_config
from tasks.chunk import chunk_stage
from tasks.crawl import crawl_stage
from tasks.detect import detect_stage, settings_fingerprint
from tasks.embed import embed_stage
from tasks.enrich import enrich_stage
from tasks.extract import extract_stage
from tasks.load import upsert_stage
from tasks.refresh import refresh_stage
from tasks.report import report_stage
from tasks.store import connect, known_documents

BATCH_JOBS_DIR = "batch-jobs"  # open Gemini batch jobs, beside the run folders: kept across runs to resume them
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "inlet.yaml"


class _StageClock:
    """Seconds per stage, in the order they ran."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, name: str, fn, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - passes through
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[name] = round(time.perf_counter() - start, 3)


def new_run_id(now: datetime) -> str:
    """Return a sortable, unique run id such as run-20261122T101500-1a2b3c."""
    return f"run-{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


@flow(name="ingest", log_prints=True)
def ingest(config_path: str = str(DEFAULT_CONFIG), retry_quarantined: bool = False) -> dict:
    """Bring the LanceDB store up to date with the configured sources; return the run summary."""
    begin = time.perf_counter()
    cfg = load_config(config_path)
    cfg.check_sources(config_path)
    use_secret_block(cfg.api_key_block)
    embedding, key_notice = resolve_embedding(cfg.embedding)
    enrichment, enrich_notice = resolve_enrichment(cfg.enrichment)
    cfg = cfg.model_copy(update={"embedding": embedding, "enrichment": enrichment})
    started = datetime.now(UTC)
    run_id = new_run_id(started)
    run_dir = str(cfg.store.artifacts / run_id)
    store, table, dim = str(cfg.store.uri), cfg.store.chunks_table, embedder_spec(cfg.embedding).dim
    clock = _StageClock()
    settings_fp = clock.run("fingerprint", settings_fingerprint, cfg)

    listing = clock.run("crawl", crawl_stage, cfg, run_dir)
    known = clock.run("read state", known_documents, connect(store))
    documents = clock.run("detect", detect_stage, listing, known, settings_fp, cfg, run_dir, retry_quarantined)
    elements, extracted, notices = clock.run("extract", extract_stage, documents, cfg.extraction, run_dir)
    chunks = clock.run("chunk", chunk_stage, elements, cfg.chunking, run_dir)
    # Stored chunks of documents whose enrichment alone is stale join in here, skipping extract and chunk.
    chunks, extracted = clock.run("refresh", refresh_stage, documents, chunks, extracted, store, table, run_dir)
    enriched = clock.run("enrich", enrich_stage, chunks, extracted, cfg.enrichment, cfg.pricing, store, table,
                         run_dir, str(cfg.store.artifacts / BATCH_JOBS_DIR))
    embedded = clock.run("embed", embed_stage, enriched["path"], extracted, cfg.embedding, cfg.enrichment,
                         cfg.pricing, store, table, run_dir, str(cfg.store.artifacts / BATCH_JOBS_DIR))
    loaded = clock.run("upsert", upsert_stage, documents, extracted, embedded["path"], store_uri=store,
                       chunks_table=table, dim=dim, settings_fp=settings_fp, run_id=run_id, now=started,
                       fulltext_index=cfg.query.fulltext_index, ann_min_rows=cfg.query.ann_min_rows)
    summary = report_stage(documents, extracted, embedded["path"], loaded, usage=enriched["usage"] | embedded["usage"],
                           dim=dim, store_uri=store, run_id=run_id,
                           started=started, finished=datetime.now(UTC), config_fp=cfg.fingerprint(),
                           stage_seconds=clock.seconds, notices=[n for n in (key_notice, enrich_notice, *notices) if n],
                           run_dir=run_dir)
    # The flow body alone; Prefect's own run set-up and teardown come on top of this.
    return {**summary, "pipeline_seconds": round(time.perf_counter() - begin, 3)}
