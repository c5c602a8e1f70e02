"""enriched_chunks -> embedded_chunks: vectors reused by cache key, only new embedding inputs embedded."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from providers.embedders import Embedder, EmbedderSpec, embedder_spec, make_embedder
from providers.gemini_batch import JobLedger, batch_polling
from providers.pricing import model_cost
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
    EMBED,
    EMBED_USAGE,
    ENRICHED_CHUNKS_SCHEMA,
    EXTRACTED_SCHEMA,
    embedded_chunks_schema,
)
from schemas.config import EmbeddingConfig, EnrichmentConfig, PricingConfig
from schemas.errors import DocumentFailure
from store.model_cache import LOCAL_FLUSH_S, CacheWriter, cached_rows
from tasks.cache_rows import embedding_rows, usable_vectors, vectors_of


def embedding_input(text: str, enrichment: str | None, delimiter: str) -> str:
    """Return text + delimiter + enrichment for one chunk (text alone when there is no enrichment)."""
    return text if not enrichment else f"{text}{delimiter}{enrichment}"


def embedding_inputs(enriched: pa.Table, delimiter: str) -> tuple[pa.Table, list[str], list[DocumentFailure]]:
    """Return each chunk's embedding input; a document whose input cannot be built leaves with its chunks."""
    rows = zip(enriched["doc_id"].to_pylist(), enriched["text"].to_pylist(), enriched["enrichment"].to_pylist())
    built, failures = each_document(lambda r: (r[0], embedding_input(r[1], r[2], delimiter)),
                                    ((r[0], r) for r in rows), "embed")
    if not failures:
        return enriched, [text for _, text in built], []
    failed = {f.doc_id for f in failures}
    return without_documents(enriched, failed), [text for d, text in built if d not in failed], failures



def embed_key(text: str, fingerprint: str, title: str | None = None) -> str:
    """Cache key of one vector: the embedding input (with the title, for embedders that read it) and the embedder."""
    blob = f"{fingerprint}\0{text}" if title is None else f"{fingerprint}\0{title}\0{text}"
    return hashlib.sha256(blob.encode()).hexdigest()


def _vector_column(vectors: np.ndarray, dim: int) -> pa.FixedSizeListArray:
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, dim)


BatchCall = Callable[[list[str], list[str | None], list[str]], np.ndarray]
Keep = Callable[[list[str], np.ndarray], None]  # one call's keys and vectors, for the model cache


def embed_chunks(enriched: pa.Table, inputs: list[str], titles: list[str | None], embedder: Embedder,
                 cached: pa.Table, batch_size: int, batch_call: BatchCall | None = None,
                 advance: Callable[[int], None] | None = None,
                 keep: Keep | None = None) -> tuple[pa.Table, list[DocumentFailure]]:
    """Attach vectors: cached (embed_key, truncated, vector) rows reused, the rest embedded once per key.

    keep gets each online call's keys and vectors right after the call (the model cache); batch_call keeps its own.
    With batch_call, every missing key goes to it at once (Gemini Batch Mode) instead of batch_size at a time.
    An input the embedder raises on (alone: a failing call is halved until the input is found) fails its
    documents, which leave the table; an outage (runtime/isolate.py) fails the run.
    """
    keys = [embed_key(t, embedder.fingerprint, title) for t, title in zip(inputs, titles)]
    title_of = dict(zip(keys, titles))
    known = {k: i for i, k in enumerate(cached["embed_key"].to_pylist())}
    text_of = dict(zip(keys, inputs))
    # Shortest first: each call then holds texts of about one length, and a local model pads little.
    todo = sorted(dict.fromkeys(k for k in keys if k not in known), key=lambda k: len(text_of[k]))
    fresh_vecs = np.zeros((len(todo), embedder.dim), dtype=np.float32)
    fresh_trunc: list[bool] = []
    online = batch_call is None
    if batch_call is not None and todo:
        texts = [text_of[k] for k in todo]
        try:
            fresh_vecs[:] = batch_call(texts, [title_of[k] for k in todo], todo)
            fresh_trunc = embedder.truncated(texts)
        except Exception as exc:  # noqa: BLE001 - sorted: an outage fails the run, an input's refusal does not
            if model_fails_run(exc):
                raise
            online = True  # the job's online retry of its failed rows was refused: find the inputs by halving
        else:
            if advance is not None:
                advance(len(todo))
    rejected: dict[str, BaseException] = {}
    if online:
        fresh_trunc = [False] * len(todo)
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]

            def call(rows: list[int], start: int = start, batch: list[str] = batch) -> None:
                texts = [text_of[batch[r]] for r in rows]
                vectors = embedder.embed(texts, [title_of[batch[r]] for r in rows])
                fresh_vecs[np.asarray(rows, dtype=np.int64) + start] = vectors
                if keep is not None:
                    keep([batch[r] for r in rows], vectors)
                for r, cut in zip(rows, embedder.truncated(texts)):
                    fresh_trunc[start + r] = cut

            bad = failing_items(call, range(len(batch)), model_fails_run)
            rejected.update({batch[r]: exc for r, exc in bad.items()})
            if advance is not None:
                advance(len(batch))
    failures = rejected_documents(enriched["doc_id"].to_pylist(), keys, rejected, "embed")
    if failures:  # the failed documents leave with all their chunks: no document is indexed in part
        failed = {f.doc_id for f in failures}
        keep = [d not in failed for d in enriched["doc_id"].to_pylist()]
        enriched = enriched.filter(pa.array(keep, pa.bool_()))
        keys = [k for k, kept in zip(keys, keep) if kept]
    fresh = {k: i for i, k in enumerate(todo)}
    cached_vecs = cached["vector"].combine_chunks().flatten().to_numpy().reshape(-1, embedder.dim) if known else None
    cached_trunc = cached["truncated"].to_pylist()
    vectors = np.zeros((len(keys), embedder.dim), dtype=np.float32)
    truncated, now, seen = [], [], set()
    for row, k in enumerate(keys):
        if k in fresh:
            vectors[row] = fresh_vecs[fresh[k]]
            truncated.append(fresh_trunc[fresh[k]])
        else:
            vectors[row] = cached_vecs[known[k]]
            truncated.append(bool(cached_trunc[known[k]]))
        now.append(k in fresh and k not in seen)  # a repeated new input is embedded once
        seen.add(k)
    n = len(keys)
    return (enriched.append_column("embed_key", pa.array(keys, pa.string()))
            .append_column("embedder", pa.array([embedder.fingerprint] * n, pa.string()))
            .append_column("embedded_now", pa.array(now, pa.bool_()))
            .append_column("truncated", pa.array(truncated, pa.bool_()))
            .append_column("vector", _vector_column(vectors, embedder.dim))), failures



def embedding_usage(embedder: Embedder, saved_usd: float, cfg: EmbeddingConfig, pricing: PricingConfig) -> dict:
    """Return the run's embedding calls, retries and tokens, with estimated dollars spent and spared by the cache.

    saved_usd: what the calls that made the vectors the cache served cost (the cache keeps each call's cost).
    """
    calls = getattr(embedder, "calls", None)
    if calls is None:  # a local embedder: no calls to count, nothing to pay
        return {k: 0 for k in EMBED_USAGE}
    return {"embed_calls": calls, "embed_retries": embedder.retrier.retries, "embed_tokens": embedder.tokens,
            "embed_batch_jobs": embedder.batch_jobs,
            "embed_cost_usd": embed_cost(pricing, cfg.model, embedder.tokens, embedder.batch_tokens),
            "embed_saved_usd": round(saved_usd, 9)}


def embed_cost(pricing: PricingConfig, model: str, tokens: int, batch_tokens: int) -> float:
    """Estimated dollars of embedding tokens, the Batch Mode part at the batch discount."""
    return (model_cost(pricing, model, prompt=tokens - batch_tokens)
            + model_cost(pricing, model, prompt=batch_tokens, batch=True))


def cache_keeper(embedder: Embedder, put: Callable[[pa.Table], None], text_of: dict[str, str], cfg: EmbeddingConfig,
                 pricing: PricingConfig) -> Keep:
    """Write each call's vectors to the model cache with the tokens and cost of the calls since the last one."""
    last = [getattr(embedder, "tokens", 0), getattr(embedder, "batch_tokens", 0)]

    def keep(keys: list[str], vectors: np.ndarray) -> None:
        tokens, batch = getattr(embedder, "tokens", 0), getattr(embedder, "batch_tokens", 0)
        spent, spent_batch = tokens - last[0], batch - last[1]
        last[:] = [tokens, batch]
        good = usable_vectors(vectors)  # a malformed vector is not kept: validation quarantines its chunk, and the
        keys = [k for k, ok in zip(keys, good) if ok]  # next run asks the model again
        if keys:
            cut = embedder.truncated([text_of[k] for k in keys])
            put(embedding_rows(keys, embedder.fingerprint, vectors[good], cut, spent,
                               embed_cost(pricing, cfg.model, spent, spent_batch), datetime.now(UTC)))

    return keep


class _ModelClock:
    """An embedder whose embed() calls are timed: the run reports model time apart from its own.

    Only embed(): a Gemini Batch Mode job (embed_batch, reached through __getattr__) is waited for over
    minutes to hours, and that wait is not the pipeline's overhead or the model's speed.
    """

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.seconds = 0.0

    def embed(self, texts: list[str], titles: list[str | None] | None = None) -> np.ndarray:
        """Embed through the inner embedder, adding the call's seconds."""
        start = time.perf_counter()
        try:
            return self.inner.embed(texts, titles)
        finally:
            self.seconds += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass(frozen=True)
class Embedded:
    """What the embed stage hands on: its artifact, the model usage and seconds, the extracted artifact after it."""

    path: str  # the embedded chunks artifact
    usage: dict[str, float]  # calls, tokens and dollars (EMBED_USAGE)
    extracted: str
    model_seconds: float = 0.0  # inside the embedder's calls: the model's time, not the pipeline's
    cached: int = 0  # distinct texts the model cache served


@dataclass(frozen=True)
class EmbedWork:
    """One batch's embedding to do: its chunks, each one's embedding input and title, their cache keys."""

    chunks: pa.Table
    inputs: list[str]
    titles: list[str | None]
    keys: list[str]
    failures: list[DocumentFailure]  # documents whose input could not be built


def embed_work(enriched: pa.Table, extracted: pa.Table | None, spec: EmbedderSpec, delimiter: str) -> EmbedWork:
    """What to ask the embedder for a batch's enriched chunks (titles only for embedders that read them)."""
    enriched, inputs, failures = embedding_inputs(enriched, delimiter)
    titles: list[str | None] = [None] * len(inputs)
    if spec.uses_titles and extracted is not None:
        title_of = dict(zip(extracted["doc_id"].to_pylist(), extracted["title"].to_pylist()))
        titles = [title_of.get(d) or "" for d in enriched["doc_id"].to_pylist()]
    keys = [embed_key(t, spec.fingerprint, title) for t, title in zip(inputs, titles)]
    return EmbedWork(enriched, inputs, titles, keys, failures)


def run_embedding(work: EmbedWork, embedder: Embedder, cached: pa.Table, saved_usd: float,
                  cfg: EmbeddingConfig, pricing: PricingConfig, ledger: JobLedger, put: Callable[[pa.Table], None]
                  ) -> tuple[pa.Table, list[DocumentFailure], dict[str, float]]:
    """Embed a batch: cached (embed_key, truncated, vector) rows reused, the rest embedded and put in the cache.

    saved_usd: what the calls that made the cached vectors cost. Returns the embedded chunks, the documents
    that failed (input or answer) and the model usage.
    """
    inner = getattr(embedder, "inner", embedder)  # what _ModelClock times
    keep = cache_keeper(inner, put, dict(zip(work.keys, work.inputs)), cfg, pricing)
    batch_call = None
    run_batch = getattr(embedder, "embed_batch", None)
    pending = set(work.keys) - set(cached["embed_key"].to_pylist())
    polling = batch_polling(cfg.batch, ledger, "embed", pending) if run_batch else None
    if polling is not None:
        report = report_batch_job("gemini-embedding-batch-job")
        batch_call = lambda texts, ts, ks: run_batch(texts, ts, ks, ledger, polling, report, keep)  # noqa: E731
    with stage_progress("embed", len(pending)) as advance:
        embedded, rejected = embed_chunks(work.chunks, work.inputs, work.titles, embedder, cached, cfg.batch_size,
                                          batch_call, advance, keep)
    return embedded, work.failures + rejected, embedding_usage(inner, saved_usd, cfg, pricing)


@task(name="embed", cache_policy=NO_CACHE)
def embed_stage(enriched_path: str, extracted_path: str, cfg: EmbeddingConfig, enrichment: EnrichmentConfig,
                pricing: PricingConfig, store_uri: str, cache_table: str, run_dir: str, jobs_dir: str) -> Embedded:
    """Embed chunks whose vector the model cache lacks, caching each call's; write embedded_chunks."""
    enriched = read_artifact(enriched_path, ENRICHED_CHUNKS_SCHEMA)
    spec = embedder_spec(cfg)
    schema = embedded_chunks_schema(spec.dim)
    if enriched.num_rows == 0:  # nothing to embed: do not load a model for it
        return Embedded(write_artifact(schema.empty_table(), run_dir, "embedded_chunks", schema),
                        {k: 0 for k in EMBED_USAGE}, extracted_path)
    extracted = read_artifact(extracted_path, EXTRACTED_SCHEMA) if spec.uses_titles else None
    work = embed_work(enriched, extracted, spec, enrichment.delimiter)
    found = cached_rows(store_uri, cache_table, work.keys, ["key", "truncated", "vector", "cost_usd"])
    cached = vectors_of(found, spec.dim)
    embedder = _ModelClock(make_embedder(cfg))
    paid = getattr(embedder.inner, "calls", None) is not None
    writer = CacheWriter(store_uri, cache_table, EMBED, flush_s=0.0 if paid else LOCAL_FLUSH_S)
    saved = float(pc.sum(found["cost_usd"]).as_py() or 0.0)  # per distinct text: a call is made once a text
    embedded, failures, usage = run_embedding(work, embedder, cached, saved, cfg, pricing, JobLedger(Path(jobs_dir)),
                                              writer.add)
    writer.flush()
    made = sum(embedded["embedded_now"].to_pylist())
    get_run_logger().info("embedded %d of %d chunks (%d reused, %d truncated by the model)", made,
                          embedded.num_rows, embedded.num_rows - made, sum(embedded["truncated"].to_pylist()))
    path = write_artifact(embedded, run_dir, "embedded_chunks", schema)
    return Embedded(path, usage, quarantined_by(failures, extracted_path, run_dir, "embedded"), embedder.seconds,
                    cached.num_rows)
