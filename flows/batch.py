"""The per-batch chain: each batch extracted once, then chunked, refreshed, enriched, embedded and validated for each
index, on the task runner, with its own Arrow artifacts under <run>/batches/<n>/ (planned by tasks/plan.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from providers.embedders import embedder_spec
from runtime.artifacts import batch_dir, join, read_artifact, use_storage_options
from runtime.clock import Stopwatch
from runtime.cpu import cpu_rank
from runtime.extraction import close_pools
from runtime.failpoints import failpoint
from runtime.isolate import unexpected_errors
from runtime.progress import quiet_stages
from schemas.arrow import EXTRACTED_SCHEMA, embedded_chunks_schema
from schemas.config import ExtractionConfig, InletConfig
from schemas.errors import DocumentFailure
from store.model_cache import models_lock
from store.tables import use_store_options
from tasks.chunk import chunk_stage
from tasks.embed import embed_stage
from tasks.enrich import enrich_stage
from tasks.estimate import estimate_stage
from tasks.extract import extract_stage
from tasks.quality import validate_stage
from tasks.refresh import refresh_stage
from tasks.report import text_counts
from tasks.variants import extraction_todo_stage, for_variant_stage

# One batch at a time talks to the models in a process (and, through the store's model lock, on the machine): a
# batch's usage is then exactly its own, the provider's quota and in-flight bound are shared, not multiplied by
# the batches beside it, and a batch finds in the model cache every answer an earlier batch paid for.
_MODELS = threading.Lock()


@dataclass(frozen=True)
class IndexPlan:
    """What a batch needs to know about one index: the main one (name None) or a variant."""

    name: str | None
    cfg: InletConfig
    run_dir: str  # the index's folder in the run: the run folder, or <run>/<variant>
    jobs_dir: str  # the Gemini batch-job ledger
    notices: list[str] = field(default_factory=list)  # what resolving its providers had to say (a missing key)


@dataclass(frozen=True)
class IndexWork:
    """One batch's work for one index, as the writer and the run summary take it."""

    extracted: str  # the extracted artifact: every document of the batch, ok or quarantined
    embedded: str  # the embedded chunks artifact: what the writer commits (a plan's: its estimate artifact)
    rows: int  # its chunk rows
    texts: dict[str, int]  # texts enriched, embedded, truncated, enrichment failed
    usage: dict[str, float]  # model calls, tokens and dollars
    validation: list[dict]  # the data-quality checks' outcomes
    errors: list[DocumentFailure]  # documents quarantined for an unexpected error (the systemic breaker counts)
    notices: list[str] = field(default_factory=list)  # a plan's: what its estimate had to assume
    pending: list[str] = field(default_factory=list)  # a plan's: the model-cache keys this index would pay for
    kept: str = ""  # the main index's: the batch's extractions to keep in the store (tasks/kept.py)


@dataclass(frozen=True)
class BatchResult:
    """What a batch task returns: its work per index, its notices, its seconds per stage and its wall-clock span."""

    indexes: list[IndexWork]
    notices: list[str]
    seconds: dict[str, float]
    span: tuple[float, float]


def _index_batch(plan: IndexPlan, number: int, elements: str, extracted: str, shared: bool,
                 clock: Stopwatch, dry_run: bool = False, chunk_tables: tuple[str, ...] = (),
                 earlier: list[str] | None = None) -> IndexWork:
    """Chunk, refresh, enrich, embed and validate one batch for one index; return its artifacts, counts and usage.

    earlier (a plan): the model-cache keys the batch's earlier indexes pay for, which this one will find cached.
    """
    cfg, here = plan.cfg, batch_dir(plan.run_dir, number)
    store, table = cfg.store.uri, cfg.store.chunks_table
    dim = embedder_spec(cfg.embedding).dim
    documents = join(here, "documents.parquet")
    suffix = "" if plan.name is None else f" {plan.name}"

    def timed(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        return clock.run(name + suffix, fn, *args)

    # Every stage is a task run of its own, also one with nothing to do in this batch: the Prefect UI shows the
    # same DAG for every run, and a stage that did nothing says so in its log.
    if shared:  # several indexes: this one takes the documents it reprocesses from the shared extraction
        elements, extracted = timed("select", for_variant_stage, elements, extracted, documents, here)
    # Each per-document stage quarantines the documents it raised on in a new extracted artifact, and goes on.
    chunks, extracted = timed("chunk", chunk_stage, elements, cfg.chunking, here, extracted)
    failpoint("batch-chunked")
    # Stored chunks of documents whose enrichment alone is stale join in here, skipping extract and chunk.
    chunks, extracted = timed("refresh", refresh_stage, documents, chunks, extracted, store, table, here)
    if dry_run:  # a plan: what enriching and embedding would ask of the models, none of them called
        est = timed("estimate", estimate_stage, chunks, extracted, cfg.enrichment, cfg.embedding, cfg.pricing, store,
                    cfg.store.cache_table, here, plan.jobs_dir, list(chunk_tables), earlier)
        return IndexWork(extracted, est.path, est.rows, est.texts, est.usage,
                         [], unexpected_errors(read_artifact(extracted, EXTRACTED_SCHEMA)), est.notices, est.pending)
    with _MODELS, models_lock(store):
        enriched = timed("enrich", enrich_stage, chunks, extracted, cfg.enrichment, cfg.pricing, store,
                          cfg.store.cache_table, here, plan.jobs_dir)
        failpoint("batch-enriched")
        embedded = timed("embed", embed_stage, enriched.path, enriched.extracted,
                         cfg.embedding, cfg.enrichment, cfg.pricing, store, cfg.store.cache_table, here, plan.jobs_dir)
        clock.add("embed model" + suffix, embedded.model_seconds)  # inside the embedder's calls
        failpoint("batch-embedded")
    # Data-quality gates: quarantine what fails a `quarantine` check, stop before committing on a `fail` check.
    gated = timed("validate", validate_stage, documents, elements, embedded.extracted, embedded.path,
                   cfg.quality, cfg.chunking.max_tokens, dim, here)
    clock.add("import gx", gated.setup_seconds)  # start-up inside validate
    final = read_artifact(gated.embedded, embedded_chunks_schema(dim))
    cached = {"texts_enrich_cached": enriched.cached, "texts_embed_cached": embedded.cached}
    return IndexWork(gated.extracted, gated.embedded, final.num_rows, text_counts(final) | cached,
                     enriched.usage | embedded.usage, gated.validation,
                     unexpected_errors(read_artifact(gated.extracted, EXTRACTED_SCHEMA)))


@task(name="batch", task_run_name="batch-{number}", cache_policy=NO_CACHE)
def batch_stage(number: int, run_dir: str, extraction: ExtractionConfig, plans: list[IndexPlan],
                storage: dict[str, dict], dry_run: bool = False, own_process: bool = False) -> BatchResult:
    """Extract one batch once, then chunk, refresh, enrich, embed and validate it for every index, each a task run.

    dry_run (a plan): chunk and refresh, then estimate the model work instead of enriching, embedding and validating.
    own_process: the batch runs in a worker process of the process runner: its extraction workers stop with it.

    Every table it made is an artifact under the batch's folder, so the batch may run on another machine.
    """
    store = plans[0].cfg.store
    use_storage_options(store.artifacts, store.artifacts_options)  # a worker process starts without them
    use_store_options(store.uri, store.options)
    clock = Stopwatch()
    began = time.time()  # wall clock, comparable across worker processes: the run's batch span
    # On disk before the batch reports done: its writer (maybe in another process) reads them next.
    # The CPU pool serves the earliest batch's parts first (runtime/cpu.py): it reaches the model soonest.
    with quiet_stages(), cpu_rank(number):
        here = batch_dir(run_dir, number)
        documents = [join(batch_dir(p.run_dir, number), "documents.parquet") for p in plans]
        todo = documents[0] if len(plans) == 1 else extraction_todo_stage(documents, here)
        # Kept extractions are looked up in (and kept by) the main index's store: the variants share its extraction.
        done = clock.run("extract", extract_stage, todo, extraction, here, storage, store.uri)
        elements, extracted, notices = done.elements, done.extracted, done.notices
        if own_process:
            # A worker process of the process runner ends without running atexit handlers, and waits for its
            # children first: extraction workers left running would hold it (and the run) for ever.
            close_pools()
        failpoint("batch-extracted")
        tables = tuple(p.cfg.store.chunks_table for p in plans)  # what a store without a model cache is seeded from
        results: list[IndexWork] = []
        for plan in plans:  # in order: a later index finds in the cache what an earlier one paid for
            earlier = [k for done in results for k in done.pending]
            results.append(_index_batch(plan, number, elements, extracted, len(plans) > 1, clock, dry_run, tables,
                                        earlier))
        counts = {"docs_extracted": done.read, "docs_from_kept": done.from_kept}
        results = [replace(work, texts=work.texts | counts, kept=done.kept if i == 0 and not dry_run else "")
                   for i, work in enumerate(results)]
    failpoint("batch-validated")
    return BatchResult(results, notices, clock.seconds, (began, time.time()))
