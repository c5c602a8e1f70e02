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
from schemas.config import InletConfig, load_config
from tasks.artifacts import is_remote, join, use_storage_options
from tasks.chunk import chunk_stage
from tasks.crawl import crawl_stage
from tasks.detect import detect_stage, refuse_unindexed_failures, settings_fingerprint
from tasks.embed import embed_stage
from tasks.enrich import enrich_stage
from tasks.extract import extract_stage
from tasks.load import upsert_stage
from tasks.quality import validate_stage
from tasks.refresh import refresh_stage
from tasks.report import report_stage
from tasks.store import connect, known_documents, writer_lock
from tasks.variants import extraction_todo_stage, for_variant_stage

BATCH_JOBS_DIR = "batch-jobs"  # open Gemini batch jobs, beside the run folders: kept across runs to resume them
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "inlet.yaml"


class _StageClock:
    """Seconds per stage, in the order they ran."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, name: str, fn, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[name] = round(time.perf_counter() - start, 3)


def unpriced_models(cfg: InletConfig) -> list[str]:
    """Name the Gemini models this config calls that the price table does not list (their cost shows as 0)."""
    used = []
    if cfg.enrichment.enabled and cfg.enrichment.provider == "gemini":
        used.append(cfg.enrichment.model)
    if cfg.embedding.kind == "gemini":
        used.append(cfg.embedding.model)
    return [f"no price for {m} in pricing.models: its cost is reported as 0" for m in used
            if m not in cfg.pricing.models]


def new_run_id(now: datetime) -> str:
    """Return a sortable, unique run id such as run-20261122T101500-1a2b3c."""
    return f"run-{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


@flow(name="ingest", log_prints=True)
def ingest(config_path: str = str(DEFAULT_CONFIG), retry_quarantined: bool = False,
           allow_deletions: bool = False) -> dict:
    """Bring the LanceDB store up to date with the configured sources; return the run summary.

    A source whose listing fails, comes back empty or shrinks past its max_delete_share deletes
    nothing and the run says so, unless allow_deletions.

    With index variants, the crawl and the extraction are shared; each variant then detects its own
    changes, chunks, enriches, embeds and commits to its own tables. The summary is the main
    index's, with each variant's under "variants".
    """
    begin = time.perf_counter()
    cfg = load_config(config_path)
    use_secret_block(cfg.api_key_block)
    started = datetime.now(UTC)
    run_id = new_run_id(started)
    use_storage_options(cfg.store.artifacts, cfg.store.artifacts_options)
    run_dir = join(cfg.store.artifacts, run_id)
    store = str(cfg.store.uri)
    clock = _StageClock()
    variants = []
    for name, vcfg in cfg.all_variants():
        embedding, key_notice = resolve_embedding(vcfg.embedding)
        enrichment, enrich_notice = resolve_enrichment(vcfg.enrichment)
        vcfg = vcfg.model_copy(update={"embedding": embedding, "enrichment": enrichment})
        notices = [n for n in (key_notice, enrich_notice, *unpriced_models(vcfg)) if n]
        variants.append((name, vcfg, run_dir if name is None else f"{run_dir}/{name}", notices))

    # One writer at a time: a second run against this store is refused (or waits) before it reads anything.
    with writer_lock(cfg.store.uri, run_id, cfg.store.lock_wait_s):
        # The main index's documents give web pages their validators (ETag) for conditional requests.
        known_main = known_documents(connect(store), cfg.store.documents_table)
        listing, failed_sources, crawl_notices = clock.run("crawl", crawl_stage, cfg, run_dir, known_main)
        detected = []
        for name, vcfg, vdir, notices in variants:
            suffix = "" if name is None else f" {name}"
            settings_fp = clock.run("fingerprint" + suffix, settings_fingerprint, vcfg)
            known = clock.run("read state" + suffix, known_documents, connect(store), vcfg.store.documents_table)
            if name is None:
                refuse_unindexed_failures(config_path, cfg, failed_sources, known)
            documents, detect_notices = clock.run("detect" + suffix, detect_stage, listing, known, settings_fp, vcfg,
                                                  vdir, retry_quarantined, failed_sources, allow_deletions)
            notices.extend([*crawl_notices, *detect_notices])
            detected.append((settings_fp, documents))
        todo = detected[0][1] if len(variants) == 1 else clock.run(
            "plan extraction", extraction_todo_stage, [d for _, d in detected], run_dir)
        storage = {s.name: s.storage_options for s in cfg.sources if s.uri is not None}
        # Web pages are fetched into the artifact folder: workers read them back with its options.
        storage |= {s.name: cfg.store.artifacts_options for s in cfg.sources if s.kind == "web"}
        elements, extracted, extract_notices = clock.run("extract", extract_stage, todo, cfg.extraction, run_dir,
                                                         storage)

        summaries = []
        for (name, vcfg, vdir, notices), (settings_fp, documents) in zip(variants, detected):
            v_elements, v_extracted = (elements, extracted) if len(variants) == 1 else clock.run(
                f"select {name or 'main'}", for_variant_stage, elements, extracted, documents, vdir)
            summaries.append(_index(vcfg, name, documents, v_elements, v_extracted, settings_fp, run_id, vdir, started,
                                    clock, [*notices, *extract_notices]))
        summary = summaries[0]
        if len(summaries) > 1:
            summary["variants"] = {name: s for (name, *_), s in zip(variants[1:], summaries[1:])}
        # The flow body alone; Prefect's own run set-up and teardown come on top of this.
        return {**summary, "pipeline_seconds": round(time.perf_counter() - begin, 3)}


def _index(cfg: InletConfig, name: str | None, documents: str, elements: str, extracted: str, settings_fp: str,
           run_id: str, run_dir: str, started: datetime, clock: _StageClock, notices: list[str]) -> dict:
    """Chunk, enrich, embed, commit and report one index (the main one or a variant)."""
    store, table, dim = str(cfg.store.uri), cfg.store.chunks_table, embedder_spec(cfg.embedding).dim
    # Open Gemini batch jobs are a small local ledger: beside the store when artifacts live on object storage.
    jobs = str(cfg.store.uri.parent / BATCH_JOBS_DIR) if is_remote(cfg.store.artifacts) else join(
        cfg.store.artifacts, BATCH_JOBS_DIR)
    suffix = "" if name is None else f" {name}"
    chunks = clock.run("chunk" + suffix, chunk_stage, elements, cfg.chunking, run_dir)
    # Stored chunks of documents whose enrichment alone is stale join in here, skipping extract and chunk.
    chunks, extracted = clock.run("refresh" + suffix, refresh_stage, documents, chunks, extracted, store, table,
                                  run_dir)
    enriched = clock.run("enrich" + suffix, enrich_stage, chunks, extracted, cfg.enrichment, cfg.pricing, store,
                         table, run_dir, jobs)
    embedded = clock.run("embed" + suffix, embed_stage, enriched["path"], extracted, cfg.embedding, cfg.enrichment,
                         cfg.pricing, store, table, run_dir, jobs)
    # Data-quality gates: quarantine what fails a `quarantine` check, stop before committing on a `fail` check.
    gated = clock.run("validate" + suffix, validate_stage, documents, elements, extracted, embedded["path"],
                      cfg.quality, cfg.chunking.max_tokens, dim, run_dir)
    extracted = gated["extracted"]
    loaded = clock.run("upsert" + suffix, upsert_stage, documents, extracted, gated["embedded"], store_uri=store,
                       chunks_table=table, dim=dim, settings_fp=settings_fp, run_id=run_id, now=started,
                       fulltext_index=cfg.query.fulltext_index, ann_min_rows=cfg.query.ann_min_rows,
                       documents_table=cfg.store.documents_table)
    return report_stage(documents, extracted, gated["embedded"], loaded, usage=enriched["usage"] | embedded["usage"],
                        dim=dim, store_uri=store, run_id=run_id, started=started, finished=datetime.now(UTC),
                        config_fp=cfg.fingerprint(), stage_seconds=dict(clock.seconds), notices=notices,
                        run_dir=run_dir, runs_table=cfg.store.runs_table, validation=gated["validation"],
                        artifact_key="ingest-run-summary" + ("" if name is None else f"-{name}"))
