"""chunks -> enriched_chunks: enrichment in its own column, reused whenever its cache key is known."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from providers.enrichers import make_enricher
from providers.gemini_batch import JobLedger, batch_polling
from providers.pricing import model_cost
from providers.types import Enricher, EnrichInput, Usage
from runtime.artifacts import read_artifact, report_batch_job, write_artifact
from runtime.isolate import (
    each_document,
    failing_items,
    model_fails_run,
    quarantined_by,
    rejected_documents,
    without_documents,
)
from runtime.progress import stage_progress
from schemas.arrow import (
    CHUNKS_SCHEMA,
    ENRICH,
    ENRICH_USAGE,
    ENRICHED_CHUNKS_SCHEMA,
    EXTRACTED_SCHEMA,
    failed_mask,
)
from schemas.config import EnrichmentConfig, PricingConfig
from schemas.errors import DocumentFailure
from store.model_cache import LOCAL_FLUSH_S, CacheWriter, cached_rows
from tasks.cache_rows import enrichment_rows


def enrich_key(item: EnrichInput, fingerprint: str, document: str | None = None) -> str:
    """Cache key of one enrichment: everything the enricher sees (the document too, for context), and the enricher."""
    parts = [fingerprint, item.title or "", "\x1f".join(item.heading_path), item.text]
    if document is not None:
        parts.append(hashlib.sha256(document.encode()).hexdigest())
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def document_texts(chunks: pa.Table) -> dict[str, str]:
    """Return each document's whole text as its chunks in order.

    Built from chunks, not elements, so that a document re-enriched from the store without being
    re-extracted gets the same text, and so the same cache keys, as when it was chunked.
    """
    parts: dict[str, list[str]] = {}
    ordered = chunks.sort_by([("doc_id", "ascending"), ("chunk_index", "ascending")])
    for doc_id, text in zip(ordered["doc_id"].to_pylist(), ordered["text"].to_pylist()):
        parts.setdefault(doc_id, []).append(text)
    return {d: "\n\n".join(t) for d, t in parts.items()}


def enrich_input(row: dict, title: str | None) -> EnrichInput:
    """Return what the enricher sees of one chunk row."""
    return EnrichInput(row["text"], title, tuple(row["heading_path"] or ()))


def enrich_inputs(chunks: pa.Table, titles: dict[str, str | None]) -> tuple[pa.Table, list[EnrichInput],
                                                                          list[DocumentFailure]]:
    """Return what the enricher sees of each chunk; a document whose input cannot be built leaves with its chunks."""
    rows = chunks.select(["doc_id", "text", "heading_path"]).to_pylist()
    built, failures = each_document(lambda r: (r["doc_id"], enrich_input(r, titles.get(r["doc_id"]))),
                                    ((r["doc_id"], r) for r in rows), "enrich")
    if not failures:
        return chunks, [item for _, item in built], []
    failed = {f.doc_id for f in failures}
    return without_documents(chunks, failed), [item for d, item in built if d not in failed], failures



BatchCall = Callable[[list[EnrichInput], list[str | None], list[str]], list[str | None]]
Keep = Callable[[list[str], list[str | None]], None]  # one call's keys and answers, for the model cache


def enrich_chunks(chunks: pa.Table, items: list[EnrichInput], enricher: Enricher | None,
                  cached: dict[str, str], documents: list[str | None] | None = None, batch_size: int = 50,
                  batch_call: BatchCall | None = None, keys: list[str] | None = None,
                  advance: Callable[[int], None] | None = None,
                  keep: Keep | None = None) -> tuple[pa.Table, list[DocumentFailure]]:
    """Add enrichment columns; call the enricher only for keys not in cached (each key once).

    keep gets each online call's keys and answers right after the call (the model cache); batch_call keeps its own.
    With batch_call, every missing key goes to it at once (Gemini Batch Mode) instead of batch_size at a time.
    keys: the rows' cache keys when the caller has them already. An input the enricher raises on (alone: a
    failing call is halved until the input is found) fails its documents, which leave the table; an outage
    fails the run.
    """
    n = chunks.num_rows
    if enricher is None:
        nulls = pa.nulls(n, pa.string())
        return chunks.append_column("enrichment", nulls.cast(pa.large_string())).append_column(
            "enricher", nulls).append_column("enrich_key", nulls).append_column("enriched_now",
                                                                                 pa.array([False] * n)), []
    docs = documents or [None] * n
    keys = keys or [enrich_key(i, enricher.fingerprint, d) for i, d in zip(items, docs)]
    todo = {k: (i, d) for k, i, d in zip(keys, items, docs) if k not in cached}
    fresh: dict[str, str | None] = {}
    pending = list(todo.items())
    if batch_call is not None and pending:
        answers = batch_call([i for _, (i, _) in pending], [d for _, (_, d) in pending], [k for k, _ in pending])
        fresh.update(zip([k for k, _ in pending], answers))
        if advance is not None:
            advance(len(pending))
        pending = []
    rejected: dict[str, BaseException] = {}
    for start in range(0, len(pending), batch_size):
        batch = pending[start : start + batch_size]

        def call(rows: list[int], batch: list = batch) -> None:
            answers = enricher.enrich([batch[r][1][0] for r in rows], [batch[r][1][1] for r in rows])
            fresh.update(zip([batch[r][0] for r in rows], answers))
            if keep is not None:
                keep([batch[r][0] for r in rows], answers)

        bad = failing_items(call, range(len(batch)), model_fails_run)
        rejected.update({batch[r][0]: exc for r, exc in bad.items()})
        if advance is not None:
            advance(len(batch))
    failures = rejected_documents(chunks["doc_id"].to_pylist(), keys, rejected, "enrich")
    if failures:
        failed = {f.doc_id for f in failures}
        keep = [d not in failed for d in chunks["doc_id"].to_pylist()]
        chunks = chunks.filter(pa.array(keep, pa.bool_()))
        keys = [k for k, kept in zip(keys, keep) if kept]
        n = chunks.num_rows
    values = [fresh[k] if k in fresh else cached.get(k) for k in keys]
    # A failed enrichment keeps the enricher but no key: the chunk is indexed on its text and
    # marked, and the cache cannot serve it, so the next run asks again.
    keys = [k if v is not None else None for k, v in zip(keys, values)]
    seen_now: set[str] = set()
    now = []
    for k in keys:  # only the first row with a fresh key counts as enriched in this run
        now.append(k is not None and fresh.get(k) is not None and k not in seen_now)
        seen_now.add(k)
    return (chunks.append_column("enrichment", pa.array(values, pa.large_string()))
            .append_column("enricher", pa.array([enricher.fingerprint] * n, pa.string()))
            .append_column("enrich_key", pa.array(keys, pa.string()))
            .append_column("enriched_now", pa.array(now, pa.bool_()))), failures


def failed_enrichments(enriched: pa.Table) -> int:
    """Count chunks whose enrichment failed: an enricher is set but there is no cache key."""
    return int(pc.sum(failed_mask(enriched)).as_py() or 0)


def usage_cost(pricing: PricingConfig, model: str, delta: Usage) -> float:
    """Estimated dollars of an enricher's usage: Batch Mode tokens at the batch discount, the rest at list price."""
    return (model_cost(pricing, model, prompt=delta.prompt_tokens - delta.batch_prompt_tokens,
                       output=delta.output_tokens - delta.batch_output_tokens,
                       cached=delta.cached_tokens - delta.batch_cached_tokens)
            + model_cost(pricing, model, prompt=delta.batch_prompt_tokens, output=delta.batch_output_tokens,
                         cached=delta.batch_cached_tokens, batch=True))


def usage_since(usage: Usage, before: Usage) -> Usage:
    """The usage added since before was copied (errors left out)."""
    return Usage(**{f.name: getattr(usage, f.name) - getattr(before, f.name) for f in fields(Usage)
                    if f.name != "errors"})


def enrichment_usage(enricher: Enricher | None, before: Usage, saved_usd: float, cfg: EnrichmentConfig,
                     pricing: PricingConfig) -> dict:
    """Return the run's model usage for enrichment: calls, retries, failures, tokens, dollars spent and spared.

    saved_usd: what the calls that made the enrichments the cache served cost (the cache keeps each call's cost).
    """
    usage = getattr(enricher, "usage", None)
    if usage is None:
        return {k: 0 for k in ENRICH_USAGE}
    delta = usage_since(usage, before)
    return {
        "llm_calls": delta.calls, "llm_retries": delta.retries, "llm_malformed": delta.malformed,
        "llm_failures": delta.failures, "llm_prompt_tokens": delta.prompt_tokens,
        "llm_output_tokens": delta.output_tokens, "llm_cached_tokens": delta.cached_tokens,
        "llm_batch_jobs": delta.batch_jobs, "llm_batch_requests": delta.batch_requests,
        "llm_cost_usd": usage_cost(pricing, cfg.model, delta), "llm_saved_usd": round(saved_usd, 9),
    }


def cache_keeper(enricher: Enricher, put: Callable[[pa.Table], None], cfg: EnrichmentConfig,
                 pricing: PricingConfig) -> Keep:
    """Write each call's answers to the model cache with the usage and cost of the calls since the last one."""
    usage = getattr(enricher, "usage", None)
    last = [replace(usage) if usage is not None else Usage()]

    def keep(keys: list[str], answers: list[str | None]) -> None:
        delta = usage_since(usage, last[0]) if usage is not None else Usage()
        last[0] = replace(usage) if usage is not None else last[0]
        good = [(k, a) for k, a in zip(keys, answers) if a is not None]  # a failed or malformed answer is not kept
        if good:
            put(enrichment_rows([k for k, _ in good], enricher.fingerprint, [a for _, a in good], delta.prompt_tokens,
                                delta.output_tokens, usage_cost(pricing, cfg.model, delta), datetime.now(UTC)))

    return keep


@dataclass(frozen=True)
class Enriched:
    """What the enrich stage hands on: its artifact, the model usage, the extracted artifact after its quarantines."""

    path: str  # the enriched chunks artifact
    usage: dict[str, float]  # calls, tokens and dollars (ENRICH_USAGE)
    extracted: str
    cached: int = 0  # distinct texts the model cache served


@dataclass(frozen=True)
class EnrichWork:
    """One batch's enrichment to do: its chunks, what the enricher sees of each, their cache keys."""

    chunks: pa.Table
    items: list[EnrichInput]
    documents: list[str | None]  # each chunk's whole document, for `context` enrichment (else None)
    keys: list[str]
    failures: list[DocumentFailure]  # documents whose input could not be built


def enrich_work(chunks: pa.Table, extracted: pa.Table | None, enricher: Enricher | None, kind: str) -> EnrichWork:
    """What to ask the enricher for a batch's chunks (nothing when enrichment is off)."""
    if enricher is None or extracted is None:
        return EnrichWork(chunks, [], [], [], [])
    chunks, items, failures = enrich_inputs(chunks, dict(zip(extracted["doc_id"].to_pylist(),
                                                             extracted["title"].to_pylist())))
    documents: list[str | None] = [None] * len(items)
    if kind == "context" and items:  # the whole document goes into the prompt
        text_of = document_texts(chunks)
        documents = [text_of.get(d) for d in chunks["doc_id"].to_pylist()]
    keys = [enrich_key(i, enricher.fingerprint, d) for i, d in zip(items, documents)]
    return EnrichWork(chunks, items, documents, keys, failures)


def run_enrichment(work: EnrichWork, enricher: Enricher | None, found: pa.Table, cfg: EnrichmentConfig,
                   pricing: PricingConfig, ledger: JobLedger, put: Callable[[pa.Table], None]
                   ) -> tuple[pa.Table, list[DocumentFailure], dict[str, float]]:
    """Enrich a batch: found (key, enrichment, cost_usd: the model cache's rows) reused, the rest asked and put.

    Returns the enriched chunks, the documents that failed (input or answer) and the model usage.
    """
    cached = dict(zip(found["key"].to_pylist(), found["enrichment"].to_pylist()))
    saved = float(pc.sum(found["cost_usd"]).as_py() or 0.0)  # per distinct text: a call is made once a text
    before = replace(getattr(enricher, "usage", Usage()))
    keep = cache_keeper(enricher, put, cfg, pricing) if enricher is not None else None
    batch_call = None
    run_batch = getattr(enricher, "enrich_batch", None)
    todo = set(work.keys) - cached.keys()
    polling = batch_polling(cfg.batch, ledger, "enrich", todo) if run_batch else None
    if polling is not None:
        report = report_batch_job("gemini-batch-job")
        batch_call = lambda its, docs, ks: run_batch(its, docs, ks, ledger, polling, report, keep)  # noqa: E731
    with stage_progress("enrich", len(todo)) as advance:
        enriched, rejected = enrich_chunks(work.chunks, work.items, enricher, cached, work.documents, cfg.batch_size,
                                           batch_call, work.keys or None, advance, keep)
    return enriched, work.failures + rejected, enrichment_usage(enricher, before, saved, cfg, pricing)


@task(name="enrich", cache_policy=NO_CACHE)
def enrich_stage(chunks_path: str, extracted_path: str, cfg: EnrichmentConfig, pricing: PricingConfig,
                 store_uri: str, cache_table: str, run_dir: str, jobs_dir: str) -> Enriched:
    """Enrich chunks whose enrichment the model cache lacks, caching each call's; write enriched_chunks."""
    enricher = make_enricher(cfg) if cfg.enabled else None
    extracted = read_artifact(extracted_path, EXTRACTED_SCHEMA) if enricher is not None else None
    work = enrich_work(read_artifact(chunks_path, CHUNKS_SCHEMA), extracted, enricher, cfg.kind)
    found = cached_rows(store_uri, cache_table, work.keys, ["key", "enrichment", "cost_usd"])
    paid = getattr(enricher, "usage", None) is not None
    writer = CacheWriter(store_uri, cache_table, ENRICH, flush_s=0.0 if paid else LOCAL_FLUSH_S)
    enriched, failures, usage = run_enrichment(work, enricher, found, cfg, pricing, JobLedger(Path(jobs_dir)),
                                               writer.add)
    writer.flush()
    made, failed = sum(enriched["enriched_now"].to_pylist()), failed_enrichments(enriched)
    if enricher is None:  # not "N reused": nothing was looked up
        get_run_logger().info("enrichment is off: %d chunks go on without one", enriched.num_rows)
    else:
        get_run_logger().info("enriched %d of %d chunks (%d reused, %d failed and marked for the next run)", made,
                              enriched.num_rows, enriched.num_rows - made - failed, failed)
    path = write_artifact(enriched, run_dir, "enriched_chunks", ENRICHED_CHUNKS_SCHEMA)
    return Enriched(path, usage, quarantined_by(failures, extracted_path, run_dir, "enriched"), found.num_rows)
