"""chunks -> what enriching and embedding them would ask of the models, without asking: the plan of a dry run.

Counts are exact where they follow from the chunks and the model cache (texts to enrich and embed, calls,
Batch Mode jobs, embedding tokens, which Inlet counts itself with cl100k); tokens only the model reports are
estimated: prompt tokens with cl100k, scaled by what Gemini reported for the batch's chunks the cache has
answers for (prompt_scale), and output tokens as the mean answer this enricher gave before (the model cache
keeps each answer's tokens), else one of the same kind and model (a new prompt version), else
DEFAULT_OUTPUT_TOKENS.
A chunk whose enrichment is still to be made has an embedding input nobody knows yet (text + enrichment): it
counts as one text to embed per distinct enrichment, of its text's tokens plus the estimated answer's.
Within a batch the indexes (main, then each variant) run in order, so a later index finds in the cache what an
earlier one paid for: the keys an earlier index's estimate left pending count as cached for the later ones.
A text repeated in documents of different batches is counted in each batch (the run pays for it once, in
whichever batch comes first): there a plan's count is an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from providers.embedders import EmbedderSpec, embedder_spec
from providers.enrichers import make_enricher
from providers.gemini_batch import JobLedger, batch_polling
from providers.tokenizer import count_tokens
from providers.types import Enricher, Usage
from runtime.artifacts import read_artifact, write_artifact
from schemas.arrow import CHUNKS_SCHEMA, EMBED, EMBED_USAGE, ENRICH, ENRICH_USAGE, EXTRACTED_SCHEMA
from schemas.config import EmbeddingConfig, EnrichmentConfig, PricingConfig
from store.model_cache import earlier_answers, planned_rows
from tasks.cache_rows import vectors_of
from tasks.embed import embed_cost, embed_key, embedding_input
from tasks.enrich import EnrichWork, enrich_work, usage_cost

DEFAULT_OUTPUT_TOKENS = 120  # an enrichment answer's tokens when its enricher has answered nothing yet

# Per document: what its chunks would cost, so that a plan can say which change its cost comes from.
ESTIMATE_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("texts_enriched", pa.int64(), nullable=False),
    pa.field("texts_embedded", pa.int64(), nullable=False),
    pa.field("cost_usd", pa.float64(), nullable=False),
])


@dataclass
class Estimate:
    """One batch's model work as a run would report it (same keys), and each document's share of the cost."""

    texts: dict[str, int] = field(default_factory=dict)
    usage: dict[str, float] = field(default_factory=dict)
    doc_cost: dict[str, float] = field(default_factory=dict)
    doc_enriched: dict[str, int] = field(default_factory=dict)
    doc_embedded: dict[str, int] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # the enrichment and embedding keys this batch pays for


def answer_family(fingerprint: str) -> str:
    """The part of an enricher's fingerprint that names its kind and model (gemini-questions:gemini-2.5-flash:)."""
    return ":".join(fingerprint.split(":")[:2]) + ":"


def answer_tokens(answers: pa.Table) -> tuple[float, float] | None:
    """Mean output tokens and mean cl100k tokens of an enricher's earlier answers; None without any."""
    if not answers.num_rows:
        return None
    output = pc.mean(answers["output_tokens"]).as_py()
    texts = [t for t in answers["enrichment"].to_pylist() if t]
    return (float(output) if output is not None else float(DEFAULT_OUTPUT_TOKENS),
            sum(count_tokens(t) for t in texts) / max(len(texts), 1))


def enrichment_estimate(work: EnrichWork, found: pa.Table, enricher: Enricher, cfg: EnrichmentConfig,
                        pricing: PricingConfig, ledger: JobLedger, output_tokens: float,
                        earlier: frozenset[str] = frozenset()) -> tuple[dict, dict[str, float]]:
    """The enrichment usage of a batch (ENRICH_USAGE keys) and each pending key's cost, no call made.

    earlier: keys an earlier index of the batch pays for: the cache will hold their answers by then.
    """
    cached = set(found["key"].to_pylist()) | earlier
    todo: dict[str, int] = {}  # each pending key once, at its first chunk
    for row, key in enumerate(work.keys):
        if key not in cached and key not in todo:
            todo[key] = row
    usage = dict.fromkeys(ENRICH_USAGE, 0)
    usage["llm_saved_usd"] = round(float(pc.sum(found["cost_usd"]).as_py() or 0.0), 9)
    if getattr(enricher, "usage", None) is None or not todo:  # a local enricher: nothing to call or pay
        return usage, dict.fromkeys(todo, 0.0)
    batch = batch_polling(cfg.batch, ledger, "enrich", set(todo)) is not None
    scale = prompt_scale(work, found, enricher)
    prompts = {k: round(scale * enricher.prompt_tokens(work.items[r], work.documents[r])) for k, r in todo.items()}
    output = round(output_tokens)
    each = {k: usage_cost(pricing, cfg.model, _usage(p, output, batch)) for k, p in prompts.items()}
    prompt_total, output_total = sum(prompts.values()), output * len(todo)
    usage |= {"llm_prompt_tokens": prompt_total, "llm_output_tokens": output_total,
              "llm_cost_usd": usage_cost(pricing, cfg.model, _usage(prompt_total, output_total, batch))}
    usage |= {"llm_batch_jobs": 1, "llm_batch_requests": len(todo)} if batch else {"llm_calls": len(todo)}
    return usage, each


def prompt_scale(work: EnrichWork, found: pa.Table, enricher: Enricher) -> float:
    """Gemini's prompt tokens per cl100k token, measured on this batch's chunks the cache has answers for (else 1).

    The cache keeps the prompt tokens Gemini reported for each answer; their chunks are here, so the two counts
    of the same prompts can be compared, and the estimate of the new prompts scaled alike.
    """
    reported = {k: t for k, t in zip(found["key"].to_pylist(), found["prompt_tokens"].to_pylist()) if t}
    if not reported:
        return 1.0
    first = {}
    for row, key in enumerate(work.keys):
        if key in reported and key not in first:
            first[key] = row
    counted = sum(enricher.prompt_tokens(work.items[r], work.documents[r]) for r in first.values())
    return sum(reported[k] for k in first) / counted if counted else 1.0


def _usage(prompt: int, output: int, batch: bool) -> Usage:
    return Usage(prompt_tokens=prompt, output_tokens=output, batch_prompt_tokens=prompt if batch else 0,
                 batch_output_tokens=output if batch else 0)


@dataclass(frozen=True)
class EmbedInputs:
    """Each chunk's embedding cache key (a stand-in where its enrichment is still to be made) and input tokens."""

    keys: list[str]
    known: list[bool]  # False: the input waits on a new enrichment
    titles: list[str | None]
    tokens: list[int]
    chars: list[int]


def embed_inputs(work: EnrichWork, enrichments: dict[str, str], pending: set[str], spec: EmbedderSpec,
                 delimiter: str, titles: dict[str, str | None], answer_tokens_each: float) -> EmbedInputs:
    """What each chunk would send the embedder: known inputs exactly, inputs awaiting an answer estimated."""
    chunks = work.chunks
    texts, docs = chunks["text"].to_pylist(), chunks["doc_id"].to_pylist()
    keys, known, tokens, chars, names = [], [], [], [], []
    extra = round(answer_tokens_each)
    for row, (text, doc) in enumerate(zip(texts, docs)):
        title = (titles.get(doc) or "") if spec.uses_titles else None
        enrich = work.keys[row] if work.keys else None
        if enrich is not None and enrich in pending:
            keys.append(f"pending:{spec.fingerprint}:{enrich}")  # one enrichment answer, one embedding input
            known.append(False)
            tokens.append(count_tokens(text + delimiter) + extra)
            chars.append(len(text) + len(delimiter) + 4 * extra)
        else:
            value = embedding_input(text, enrichments.get(enrich) if enrich else None, delimiter)
            keys.append(embed_key(value, spec.fingerprint, title))
            known.append(True)
            tokens.append(count_tokens(value))
            chars.append(len(value))
        names.append(title)
    return EmbedInputs(keys, known, names, tokens, chars)


def embed_calls(todo: list[int], inputs: EmbedInputs, batch_size: int) -> int:
    """Requests an online Gemini embedding of these rows makes: batch_size at a time, by title, 100 a request."""
    from providers.gemini import MAX_REQUEST_CHARS, MAX_TEXTS_PER_REQUEST, request_batches

    calls = 0
    for start in range(0, len(todo), batch_size):
        by_title: dict[str | None, list[int]] = {}
        for row in todo[start : start + batch_size]:
            by_title.setdefault(inputs.titles[row], []).append(row)
        for rows in by_title.values():
            sizes = ["x" * inputs.chars[r] for r in rows]
            calls += sum(1 for _ in request_batches(sizes, max_texts=MAX_TEXTS_PER_REQUEST,
                                                    max_chars=MAX_REQUEST_CHARS))
    return calls


def embedding_estimate(inputs: EmbedInputs, found: pa.Table, cfg: EmbeddingConfig, spec: EmbedderSpec,
                       pricing: PricingConfig, ledger: JobLedger, earlier: frozenset[str] = frozenset(),
                       ) -> tuple[dict, dict[str, float], int]:
    """The embedding usage of a batch (EMBED_USAGE keys), each pending key's cost and the vectors the cache serves.

    earlier: keys an earlier index of the batch pays for, served from the cache by then.
    """
    served = vectors_of(found, spec.dim)
    have = set(served["embed_key"].to_pylist())
    also = {k for k in inputs.keys if k in earlier and k not in have}
    have |= also
    first: dict[str, int] = {}
    for row, key in enumerate(inputs.keys):
        if key not in have and key not in first:
            first[key] = row
    usage = dict.fromkeys(EMBED_USAGE, 0)
    kept = set(served["embed_key"].to_pylist())
    saved = found.filter(pc.is_in(found["key"], pa.array(sorted(kept), pa.string()))) if kept else found.slice(0, 0)
    usage["embed_saved_usd"] = round(float(pc.sum(saved["cost_usd"]).as_py() or 0.0), 9)
    if cfg.kind != "gemini" or not first:  # a local embedder: no calls to count, nothing to pay
        return usage, dict.fromkeys(first, 0.0), served.num_rows + len(also)
    # Batch Mode is decided on the known inputs' keys (a resumable job holds those); the count includes the rest.
    batch = cfg.batch.mode != "never" and (cfg.batch.mode == "always" or len(first) >= cfg.batch.min_rows or
                                           batch_polling(cfg.batch, ledger, "embed",
                                                         {k for k in first if not k.startswith("pending:")})
                                           is not None)
    tokens = sum(inputs.tokens[r] for r in first.values())
    each = {k: embed_cost(pricing, cfg.model, inputs.tokens[r], inputs.tokens[r] if batch else 0)
            for k, r in first.items()}
    usage |= {"embed_tokens": tokens, "embed_cost_usd": embed_cost(pricing, cfg.model, tokens, tokens if batch else 0)}
    usage |= ({"embed_batch_jobs": 1} if batch
              else {"embed_calls": embed_calls(list(first.values()), inputs, cfg.batch_size)})
    return usage, each, served.num_rows + len(also)


def estimate_batch(work: EnrichWork, enricher: Enricher | None, found: pa.Table, history: tuple[float, float] | None,
                   vectors: pa.Table, inputs: EmbedInputs, enrichment: EnrichmentConfig, embedding: EmbeddingConfig,
                   pricing: PricingConfig, ledger: JobLedger, earlier: frozenset[str] = frozenset()) -> Estimate:
    """What a batch's chunks would ask of the enricher and the embedder, from what the model cache holds.

    found: the cache's enrichments for work.keys; history: this enricher's mean answer tokens (answer_tokens);
    vectors: the cache's vectors for the inputs known now (inputs, from embed_inputs); earlier: the enrichment
    and embedding keys an earlier index of this batch pays for (Estimate.pending of its estimate).
    """
    est = Estimate()
    if enricher is not None and history is None and getattr(enricher, "usage", None) is not None:
        est.notices.append(f"no earlier answer of {enricher.fingerprint}: each answer is estimated at "
                           f"{DEFAULT_OUTPUT_TOKENS} output tokens")
    output_each = history[0] if history else DEFAULT_OUTPUT_TOKENS
    llm, enrich_each = (enrichment_estimate(work, found, enricher, enrichment, pricing, ledger, output_each, earlier)
                        if enricher is not None else (dict.fromkeys(ENRICH_USAGE, 0), {}))
    emb, embed_each, served = embedding_estimate(inputs, vectors, embedding, embedder_spec(embedding), pricing, ledger,
                                                 earlier)
    docs = work.chunks["doc_id"].to_pylist()
    _by_document(est, docs, work.keys, enrich_each, "doc_enriched")
    _by_document(est, docs, inputs.keys, embed_each, "doc_embedded")
    est.texts = {"texts_enriched": len(enrich_each), "texts_embedded": len(embed_each),
                 "texts_enrich_cached": found.num_rows + len(set(work.keys) & earlier - set(found["key"].to_pylist())),
                 "texts_embed_cached": served}
    est.usage = llm | emb
    est.pending = sorted(enrich_each.keys() | embed_each.keys())
    return est


def pending_keys(work: EnrichWork, found: pa.Table) -> set[str]:
    """The enrichment keys the cache has no answer for: each one a call, and an embedding input unknown yet."""
    return set(work.keys) - set(found["key"].to_pylist())


def _by_document(est: Estimate, docs: list[str], keys: list[str], each: dict[str, float], counter: str) -> None:
    """Charge each pending key's cost to the document of its first chunk."""
    seen: set[str] = set()
    counts = getattr(est, counter)
    for doc, key in zip(docs, keys):
        if key in each and key not in seen:
            seen.add(key)
            est.doc_cost[doc] = est.doc_cost.get(doc, 0.0) + each[key]
            counts[doc] = counts.get(doc, 0) + 1


def estimate_table(est: Estimate) -> pa.Table:
    """Each document's share of a batch's estimated work and cost, as an Arrow table."""
    docs = sorted(est.doc_cost.keys() | est.doc_enriched.keys() | est.doc_embedded.keys())
    return pa.table({"doc_id": docs, "texts_enriched": [est.doc_enriched.get(d, 0) for d in docs],
                     "texts_embedded": [est.doc_embedded.get(d, 0) for d in docs],
                     "cost_usd": [est.doc_cost.get(d, 0.0) for d in docs]}, schema=ESTIMATE_SCHEMA)


@dataclass(frozen=True)
class Estimated:
    """What the estimate stage hands on: its per-document artifact, and the batch's counts and usage."""

    path: str
    rows: int  # the batch's chunks
    texts: dict[str, int]
    usage: dict[str, float]
    notices: list[str]
    pending: list[str]  # keys this batch's index pays for: cached for the batch's later indexes


@task(name="estimate", cache_policy=NO_CACHE)
def estimate_stage(chunks_path: str, extracted_path: str, enrichment: EnrichmentConfig, embedding: EmbeddingConfig,
                   pricing: PricingConfig, store_uri: str, cache_table: str, run_dir: str, jobs_dir: str,
                   chunk_tables: list[str], earlier: list[str] | None = None) -> Estimated:
    """Count what enriching and embedding this batch would cost, from the model cache; call no model.

    chunk_tables: every index's, which a store without a cache yet would be seeded from (planned_rows);
    earlier: the keys the batch's earlier indexes pay for (their Estimated.pending).
    """
    chunks = read_artifact(chunks_path, CHUNKS_SCHEMA)
    extracted = read_artifact(extracted_path, EXTRACTED_SCHEMA)
    enricher = make_enricher(enrichment) if enrichment.enabled else None
    work = enrich_work(chunks, extracted, enricher, enrichment.kind)
    found = planned_rows(store_uri, cache_table, chunk_tables, work.keys, ENRICH,
                         ["key", "enrichment", "prompt_tokens", "cost_usd"])
    history = answer_tokens(earlier_answers(store_uri, cache_table, enricher.fingerprint,
                                            answer_family(enricher.fingerprint))) if enricher else None
    spec = embedder_spec(embedding)
    titles = dict(zip(extracted["doc_id"].to_pylist(), extracted["title"].to_pylist()))
    inputs = embed_inputs(work, dict(zip(found["key"].to_pylist(), found["enrichment"].to_pylist())),
                          pending_keys(work, found), spec, enrichment.delimiter, titles,
                          history[1] if history else DEFAULT_OUTPUT_TOKENS)
    vectors = planned_rows(store_uri, cache_table, chunk_tables, [k for k, ok in zip(inputs.keys, inputs.known) if ok],
                           EMBED, ["key", "truncated", "vector", "cost_usd"])
    est = estimate_batch(work, enricher, found, history, vectors, inputs, enrichment, embedding, pricing,
                         JobLedger(Path(jobs_dir)), frozenset(earlier or ()))
    get_run_logger().info("%d chunks: %d texts to enrich (%d cached), %d to embed (%d cached); no model called",
                          chunks.num_rows, est.texts["texts_enriched"], est.texts["texts_enrich_cached"],
                          est.texts["texts_embedded"], est.texts["texts_embed_cached"])
    path = write_artifact(estimate_table(est), run_dir, "estimate", ESTIMATE_SCHEMA)
    return Estimated(path, chunks.num_rows, est.texts, est.usage, est.notices, est.pending)
