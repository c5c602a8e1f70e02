"""Ingest flow: crawl -> detect changes -> extract -> chunk -> enrich -> embed -> upsert -> report."""

from __future__ import annotations

import contextlib
import hashlib
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from prefect import flow, get_run_logger
from prefect.states import Failed

from flows.batch import IndexPlan, batch_stage
from flows.publishing import announce, gate_questions, gate_stage, held_message
from flows.runners import make_task_runner
from flows.writer import Writer
from providers import gx
from providers.embedders import embedder_spec, resolve_embedding
from providers.enrichers import make_enricher, resolve_enrichment
from providers.keys import use_secret_block
from runtime.artifacts import is_remote, join, read_artifact, use_storage_options
from runtime.clock import Stopwatch
from runtime.cpu import cpu_pool_for
from runtime.failpoints import failpoint
from runtime.isolate import Breaker
from runtime.memory import release_memory
from runtime.progress import stage_progress
from schemas.arrow import DOCUMENTS_SCHEMA, WORK, Change
from schemas.config import InletConfig, load_config
from schemas.errors import ConfigError, CostCeilingError, PublishHeldError
from store import inflight
from store.commit import CommitTarget, check_vector_size
from store.model_cache import needs_tidy, prepare_cache
from store.tables import (
    connect,
    is_remote_store,
    kept_keys,
    known_documents,
    use_store_options,
    writer_lock,
)
from tasks.crawl import crawl_stage, scope_of_paths
from tasks.detect import detect_stage, refuse_unindexed_failures, settings_fingerprint
from tasks.extract import start_workers, worker_documents
from tasks.kept import extraction_fingerprint
from tasks.load import tidy_cache_stage
from tasks.plan import batch_bytes, plan_batches, write_batch_documents
from tasks.plan_report import PlanInfo, plan_report_stage
from tasks.report import IndexTotals, RunInfo, merge_usage, merge_validation, report_stage

BATCH_JOBS_DIR = "batch-jobs"  # open Gemini batch jobs, beside the run folders: kept across runs to resume them
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "inlet.yaml"


def unpriced_models(cfg: InletConfig) -> list[str]:
    """Name the Gemini models this config calls that the price table does not list (their cost shows as 0)."""
    used = []
    if cfg.enrichment.enabled and cfg.enrichment.provider == "gemini":
        used.append(cfg.enrichment.model)
    if cfg.embedding.kind == "gemini":
        used.append(cfg.embedding.model)
    return [f"no price for {m} in pricing.models: its cost is reported as 0" for m in used
            if m not in cfg.pricing.models]


def only_sources(cfg: InletConfig, names: list[str] | None, origin: str) -> InletConfig:
    """The config with only the named sources (all when names is None); an unknown name is a ConfigError."""
    if names is None:
        return cfg
    unknown = sorted(set(names) - {s.name for s in cfg.sources})
    if unknown or not names:
        msg = f"{origin}: sources: no source named {', '.join(unknown)}" if unknown else "no source to crawl"
        raise ConfigError(msg)
    return cfg.model_copy(update={"sources": tuple(s for s in cfg.sources if s.name in names)})


def new_run_id(now: datetime, kind: str = "run") -> str:
    """Return a sortable, unique run id such as run-20261122T101500-1a2b3c (plan-... for a plan)."""
    return f"{kind}-{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def prepare_process(cfg: InletConfig) -> None:
    """Load now what a run's first steps would load on first use: while a temporary Prefect server boots, off its path.

    The local keyword enricher (its fingerprint is part of change detection; yake with networkx ~0.4 s), and two
    modules Prefect imports at a process's first flow call (its engine, and FastAPI's encoder for the parameters,
    ~0.35 s). Nothing here touches the store or the API; the run itself does all of it again, from caches.
    """
    import fastapi.encoders  # noqa: F401 - Prefect's parameter serialization imports it at the first flow call
    import prefect.flow_engine  # noqa: F401

    if cfg.enrichment.enabled and cfg.enrichment.provider == "local":
        # Cached per process: detect's settings_fingerprint reuses it. Should building it fail, detect builds it
        # again inside the flow run, which fails there and says why, in its run record, as without this step.
        with contextlib.suppress(Exception):
            make_enricher(cfg.enrichment)


@flow(name="ingest", log_prints=True)
def ingest(config_path: str = str(DEFAULT_CONFIG), retry_quarantined: bool = False,
           allow_deletions: bool = False, dry_run: bool = False, max_cost_usd: float | None = None,
           allow_cost: bool = False, sources: list[str] | None = None, paths: list[str] | None = None) -> dict:
    """Bring the LanceDB store up to date with the configured sources; return the run summary.

    config -> crawl -> detect -> plan batches -> per batch on the task runner (extract -> chunk -> refresh ->
    enrich -> embed -> validate) -> commit in groups -> publish -> (tidy the model cache, when due) -> report.
    One writer per index commits the finished batches in order and publishes the run's last version to readers
    at the end. With index variants,
    the crawl and each batch's extraction are shared; each variant chunks, enriches, embeds and commits to its
    own tables, and the summary carries each variant's under "variants".

    A source whose listing fails, comes back empty or shrinks past its max_delete_share deletes nothing and
    the run says so, unless allow_deletions.

    dry_run (`inlet plan`): crawl, detect, extract and chunk as a run would, then estimate the model work from the
    model cache instead of doing it; nothing is written to the store and no model is called. Returns the plan.
    max_cost_usd (else run.max_cost_usd): plan first, and stop before any model call if the plan costs more;
    allow_cost lifts the ceiling for this run.
    sources: crawl only these sources (by name); the others' documents are left as they are. `inlet watch` runs a
    micro-batch over the sources an event or a poll named, and every source at reconciliation.
    paths: absolute paths (files or folders) that events named: a local folder source holding any of them is
    listed at those paths only, and only its documents there can be found changed or deleted; the rest of it is
    left as it is (live mode: a micro-batch's work follows the change, not the folder's size).
    """
    begin = time.perf_counter()
    cfg = only_sources(load_config(config_path), sources, config_path)
    if cfg.publish.gate is not None and not dry_run:
        gate_questions(cfg.publish.gate.questions, config_path)  # a missing or empty questions file fails now, not after the run
    run = start_run(cfg, "plan" if dry_run else "run")
    plans = index_plans(cfg, run.run_dir)
    clock = Stopwatch()
    # One writer at a time: a second run against this store is refused (or waits) before it reads anything.
    # A plan writes nothing to the store: it takes no lock, so it can be made while a run goes on.
    lock = contextlib.nullcontext() if dry_run else writer_lock(cfg.store.uri, run.run_id, cfg.store.lock_wait_s)
    with lock:
        known_main = known_documents(connect(cfg.store.uri), cfg.store.documents_table)
        web = any(src.kind == "web" for src in cfg.sources)  # the known pages' validators make requests conditional
        scope = scope_of_paths(cfg, paths)
        listing, failed_sources, crawl_notices = clock.run("crawl", crawl_stage, cfg, run.run_dir,
                                                           known_main if web else None, scope)
        failpoint("crawled")
        detected = [detect_index(plan, listing, known_main, failed_sources, config_path, cfg, clock,
                                 retry_quarantined, allow_deletions, scope) for plan in plans]
        failpoint("detected")
        batches, sizes = plan_run_batches(cfg, plans, detected, clock)
        ceiling = None if allow_cost else (max_cost_usd if max_cost_usd is not None else cfg.run.max_cost_usd)
        if dry_run or (ceiling is not None and batches):
            summaries = plan_run(cfg, run, plans, detected, batches, sizes, clock, crawl_notices)
            if not dry_run:
                check_cost(summaries, ceiling, plans)
        if not dry_run:
            summaries = index_run(cfg, run, plans, detected, batches, sizes, clock, crawl_notices)
    summary = summaries[0]
    if len(summaries) > 1:
        summary["variants"] = {plan.name: s for plan, s in zip(plans[1:], summaries[1:])}
    # The flow body alone; Prefect's own run set-up and teardown come on top of this.
    summary = {**summary, "pipeline_seconds": round(time.perf_counter() - begin, 3)}
    held = {plan.name or "main": s["gate"] for plan, s in zip(plans, summaries)
            if (s.get("gate") or {}).get("status") == "held"}
    if held:  # committed and reported, not published: the UI shows the run as Held (a failed state: look at it)
        message = held_message(run.run_id, held)
        return Failed(name="Held", message=message, data=PublishHeldError(message, summary))
    return summary


def plan_run(cfg: InletConfig, run: RunStart, plans: list[IndexPlan], detected: list[Detected],
             batches: list[list[str]], sizes: list[int], clock: Stopwatch, crawl_notices: list[str]) -> list[dict]:
    """Extract and chunk the batches, estimate their model work from the cache, report each index's plan."""
    with cpu_pool_for(cfg.execution, sum(sizes)):
        done = clock.run("batches", run_batches, cfg, batches, run.run_dir, plans, [], dry_run=True)
    return [plan_report_stage(PlanInfo(run.run_id, cfg.store.uri, plan.cfg.store.runs_table,
                                       "ingest-plan" + ("" if plan.name is None else f"-{plan.name}")),
                              d.documents, d.known, totals.extracted, totals.embedded, totals.rows, totals.texts,
                              totals.usage, [*plan.notices, *crawl_notices, *d.notices, *done.notices])
            for plan, d, totals in zip(plans, detected, done.indexes)]


def start_extraction_workers(cfg: InletConfig, detected: Detected) -> None:
    """Start the extraction workers at once when a document of this run must be read by one (none kept for it).

    Their start-up (unstructured and spaCy, ~5 s) then runs on another core while this process loads
    great-expectations and the models, not inside the first batch's extract stage; a run of Markdown, or of
    documents re-chunked from kept elements, starts none (tasks/extract.py reads those in this process).
    """
    needing = worker_documents(read_artifact(detected.documents, DOCUMENTS_SCHEMA), cfg.extraction)
    if not needing:
        return
    pairs = [(d["doc_id"], d["content_hash"]) for d in needing]
    kept = kept_keys(cfg.store.uri, [p for p in pairs if p[1]], extraction_fingerprint(cfg.extraction))
    to_read = [p for p in pairs if p not in kept]
    if to_read and start_workers(cfg.extraction):
        get_run_logger().info("starting the extraction workers for %d documents", len(to_read))


def check_cost(summaries: list[dict], ceiling: float, plans: list[IndexPlan]) -> None:
    """Stop the run, before any model call, when its plan costs more than the ceiling; say what and why."""
    cost = sum(s["cost_usd"] for s in summaries)
    if cost <= ceiling:
        get_run_logger().info("the plan costs $%.4f, within the ceiling of $%.4f", cost, ceiling)
        return
    why = []
    for plan, summary in zip(plans, summaries):
        where = "" if plan.name is None else f" (variant {plan.name})"
        why += [f"${c['cost_usd']:.4f} from {c['documents']} documents{where}: {c['cause']}" +
                (f" (enricher now {make_enricher(plan.cfg.enrichment).fingerprint})"
                 if c["cause"].startswith("enrichment settings") else "")
                for c in summary["causes"] if c["cost_usd"] > 0]
    msg = (f"run stopped before any model call, nothing written: its plan is estimated at ${cost:.4f}, above the "
           f"ceiling of ${ceiling:.4f} (run.max_cost_usd or --max-cost-usd); " + "; ".join(why) +
           ". See `inlet plan`; raise the ceiling or run with --allow-cost to go ahead")
    raise CostCeilingError(msg)


def index_run(cfg: InletConfig, run: RunStart, plans: list[IndexPlan], detected: list[Detected],
              batches: list[list[str]], sizes: list[int], clock: Stopwatch, crawl_notices: list[str]) -> list[dict]:
    """Do the batches' model work, commit, publish and report each index; return their run summaries."""
    if batches:
        prepare_model_cache(cfg, plans, clock)
    writers = [Writer(commit_target(plan, d, run), d.documents, commit_rows=cfg.execution.commit_rows,
                      batches=len(batches), fulltext_index=plan.cfg.query.fulltext_index, known=d.known,
                      keeps=plan.name is None)
               for plan, d in zip(plans, detected)]
    if batches and cfg.execution.task_runner == "thread":
        # They load unstructured while GX and the models load. Asked before the CPU pool, so that the forkserver
        # both pools fork from loads the partitioners once (runtime/cpu.py worker_context), not each worker.
        start_extraction_workers(cfg, detected[0])
    with cpu_pool_for(cfg.execution, sum(sizes)):  # its workers start while GX is imported
        if batches and cfg.execution.task_runner == "thread" and any(p.cfg.quality.enabled for p in plans):
            # GX's import (2-3 s, holding the interpreter) before the batches, not inside the first batch's
            # validate, where it slowed every batch beside it; reported apart, as "import gx". Said in the
            # run's log, so that the gap before the first batch in the UI is explained.
            get_run_logger().info("loading great-expectations for the data-quality checks")
            clock.run("import gx", gx.context)
        done = clock.run("batches", run_batches, cfg, batches, run.run_dir, plans, writers)
    clock.seconds = merge_usage(clock.seconds, done.seconds)  # summed: "import gx" may come from both
    # The last commit group, then publish; with a publish gate, tag only, and the gate publishes if it passes.
    results = [writer.finish(ann_min_rows=plan.cfg.query.ann_min_rows, hold=plan.cfg.publish.gate is not None)
               for plan, writer in zip(plans, writers)]
    gates = [gate_stage(plan.cfg, run.run_id, "ingest-publish-gate" + _suffix(plan).replace(" ", "-")).as_dict()
             if loaded.held else None for plan, loaded in zip(plans, results)]
    if batches:  # after publishing, not beside the index builds: the run's memory peak is there
        tidy_model_cache(cfg, clock)
    summaries = []
    for plan, d, writer, totals, loaded, gate in zip(plans, detected, writers, done.indexes, results, gates):
        if d.markers:  # what killed runs left, now committed again
            inflight.settle(d.markers, worked_ids(read_artifact(d.documents, DOCUMENTS_SCHEMA)))
        clock.seconds.update({k + _suffix(plan): v for k, v in writer.clock.seconds.items()})
        summaries.append(report_stage(
            report_info(plan, run), d.documents, totals, loaded, finished=datetime.now(UTC),
            stage_seconds=clock.rounded(), notices=[*plan.notices, *crawl_notices, *d.notices, *done.notices],
            gate=gate))
    main = summaries[0]
    if not results[0].held and any(main[k] for k in ("docs_new", "docs_changed", "docs_deleted", "docs_refreshed")):
        announce(cfg, "run", run.run_id, main["versions"].get(cfg.store.chunks_table),
                 *changed_and_deleted(read_artifact(detected[0].documents, DOCUMENTS_SCHEMA)))
    return summaries


# --- the steps the flow names, in its order ------------------------------------------------------------------


@dataclass(frozen=True)
class RunStart:
    """A run's identity: its id, when it started and its folder of artifacts."""

    run_id: str
    started: datetime
    run_dir: str


def start_run(cfg: InletConfig, kind: str = "run") -> RunStart:
    """Name the run (or plan), and hand the config's credentials and storage options to the libraries that read them."""
    use_secret_block(cfg.api_key_block)
    use_storage_options(cfg.store.artifacts, cfg.store.artifacts_options)
    use_store_options(cfg.store.uri, cfg.store.options)
    started = datetime.now(UTC)
    run_id = new_run_id(started, kind)
    return RunStart(run_id, started, join(cfg.store.artifacts, run_id))


def index_plans(cfg: InletConfig, run_dir: str) -> list[IndexPlan]:
    """The main index and each variant, with their providers resolved (a missing key falls back, said in notices)."""
    plans = []
    for name, vcfg in cfg.all_variants():
        embedding, key_notice = resolve_embedding(vcfg.embedding)
        enrichment, enrich_notice = resolve_enrichment(vcfg.enrichment)
        vcfg = vcfg.model_copy(update={"embedding": embedding, "enrichment": enrichment})
        notices = [n for n in (key_notice, enrich_notice, *unpriced_models(vcfg)) if n]
        plans.append(IndexPlan(name, vcfg, run_dir if name is None else f"{run_dir}/{name}", _jobs_dir(vcfg),
                               notices))
    return plans


@dataclass(frozen=True)
class Detected:
    """One index's change detection: its documents artifact, what it read of the store, killed runs' markers."""

    settings_fp: str
    documents: str  # the documents artifact: every listed or known document with its change
    known: pa.Table  # the documents table as read under the writer lock
    markers: dict[str, list[str]]  # in-flight markers killed runs left (store/inflight.py)
    notices: list[str]


def detect_index(plan: IndexPlan, listing: str, known_main: pa.Table, failed_sources: dict[str, str],
                 config_path: str, cfg: InletConfig, clock: Stopwatch, retry_quarantined: bool,
                 allow_deletions: bool, scope: dict[str, list[str]] | None = None) -> Detected:
    """Detect what changed for one index against its own documents table."""
    suffix = _suffix(plan)
    # Before any model call: a run found out at its first commit, after paying for the batch's vectors.
    check_vector_size(cfg.store.uri, plan.cfg.store.chunks_table, embedder_spec(plan.cfg.embedding).dim)
    settings_fp = clock.run("fingerprint" + suffix, settings_fingerprint, plan.cfg)
    known = known_main if plan.name is None else clock.run(  # the main index's rows were read before the crawl
        "read state" + suffix, known_documents, connect(cfg.store.uri), plan.cfg.store.documents_table)
    if plan.name is None:
        refuse_unindexed_failures(config_path, cfg, failed_sources, known)
    # Documents a killed run was committing: done again even if their files went back to old bytes.
    markers = inflight.left(_inflight_dir(plan.cfg))
    interrupted = frozenset(d for ids in markers.values() for d in ids)
    documents, notices = clock.run("detect" + suffix, detect_stage, listing, known, settings_fp, plan.cfg,
                                   plan.run_dir, retry_quarantined, failed_sources, allow_deletions, interrupted,
                                   scope)
    return Detected(settings_fp, documents, known, markers, notices)


def plan_run_batches(cfg: InletConfig, plans: list[IndexPlan], detected: list[Detected],
                     clock: Stopwatch) -> tuple[list[list[str]], list[int]]:
    """Cut the documents with work into batches, write each batch's share where it will read it; return the sizes."""
    per_index = [read_artifact(d.documents, DOCUMENTS_SCHEMA) for d in detected]
    # Even batches for process and Dask workers; threads share the CPU pool, which evens out the last batch.
    sharing = 1 if cfg.execution.task_runner == "thread" else cfg.execution.workers
    batches = clock.run("plan batches", plan_batches, per_index, cfg.execution.batch_docs, cfg.execution.batch_mb,
                        sharing)
    write_batch_documents(per_index, [plan.run_dir for plan in plans], batches)
    return batches, batch_bytes(per_index[0], batches)


def prepare_model_cache(cfg: InletConfig, plans: list[IndexPlan], clock: Stopwatch) -> None:
    """Give a store from before the model cache one, seeded with the answers its chunks tables hold."""
    seeded = clock.run("prepare cache", prepare_cache, cfg.store.uri, cfg.store.cache_table,
                       [p.cfg.store.chunks_table for p in plans])
    if seeded:
        get_run_logger().info("model cache created from the %d answers the chunks tables held", seeded)


def tidy_model_cache(cfg: InletConfig, clock: Stopwatch | None = None) -> None:
    """Merge the model cache's fragments when lookups would scan too many: a task run only when due, as "index"."""
    clock = clock or Stopwatch()
    if clock.run("tidy cache", needs_tidy, cfg.store.uri, cfg.store.cache_table):
        clock.run("tidy cache", tidy_cache_stage, cfg.store.uri, cfg.store.cache_table)


def commit_target(plan: IndexPlan, detected: Detected, run: RunStart) -> CommitTarget:
    """Where one index's commits go, and as which run."""
    store = plan.cfg.store
    return CommitTarget(store.uri, store.chunks_table, store.documents_table, store.quarantine_table,
                        embedder_spec(plan.cfg.embedding).dim, detected.settings_fp, run.run_id, run.started,
                        _inflight_dir(plan.cfg), plan.cfg.query.fulltext_language)


def report_info(plan: IndexPlan, run: RunStart) -> RunInfo:
    """How one index's report names and records the run."""
    key = "ingest-run-summary" + ("" if plan.name is None else f"-{plan.name}")
    return RunInfo(run.run_id, run.started, plan.cfg.store.uri, plan.run_dir, plan.cfg.store.runs_table,
                   plan.cfg.fingerprint(), key)


def _suffix(plan: IndexPlan) -> str:
    return "" if plan.name is None else f" {plan.name}"


def _inflight_dir(cfg: InletConfig) -> str:
    """Where an index's commit groups leave their in-flight markers (store/inflight.py)."""
    return inflight.folder(cfg.store.artifacts, cfg.store.uri, cfg.store.chunks_table)


def changed_and_deleted(documents: pa.Table) -> tuple[list[str], list[str]]:
    """The ids of the documents a run indexed again (new, changed) and of those it deleted."""
    change = documents["change"]
    again = documents.filter(pc.is_in(change, pa.array(list(WORK)))) if documents.num_rows else documents
    gone = documents.filter(pc.equal(change, Change.DELETED)) if documents.num_rows else documents
    return again["doc_id"].to_pylist(), gone["doc_id"].to_pylist()


def worked_ids(documents: pa.Table) -> set[str]:
    """The documents a run did again: new, changed or deleted ones."""
    return set(documents.filter(pc.is_in(documents["change"], pa.array([*WORK, Change.DELETED])))
               ["doc_id"].to_pylist())


def _jobs_dir(cfg: InletConfig) -> str:
    """Open Gemini batch jobs are a small local ledger: in the artifact folder, else beside the store, else home."""
    if not is_remote(cfg.store.artifacts):
        return join(cfg.store.artifacts, BATCH_JOBS_DIR)
    if not is_remote_store(cfg.store.uri):
        return str(Path(cfg.store.uri).parent / BATCH_JOBS_DIR)
    # Both on object storage: one ledger per store in the user's home (the flow's machine submits the jobs).
    return str(Path.home() / ".inlet" / BATCH_JOBS_DIR / hashlib.sha256(cfg.store.uri.encode()).hexdigest()[:12])


TIDY_EVERY = 32  # batches between merges of the model cache's fragments (store/model_cache.py tidy_cache)


@dataclass
class BatchTotals:
    """What every batch of a run did: per index, the run's notices, and seconds per stage summed over batches."""

    indexes: list[IndexTotals]
    notices: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def run_batches(cfg: InletConfig, batches: list[list[str]], run_dir: str, plans: list[IndexPlan],
                writers: list[Writer], dry_run: bool = False) -> BatchTotals:
    """Run every batch on the task runner; hand each finished batch to the writers in order; return the totals.

    dry_run: the batches estimate instead of calling models, and there are no writers.
    """
    execution = cfg.execution
    totals = BatchTotals([IndexTotals() for _ in plans])
    if not batches:
        return totals
    storage = {s.name: s.storage_options for s in cfg.sources if s.uri is not None}
    # Web pages are fetched into the artifact folder: workers read them back with its options.
    storage |= {s.name: cfg.store.artifacts_options for s in cfg.sources if s.kind == "web"}
    spans: list[tuple[float, float]] = []
    # One document never fails a run; most documents failing alike stop it before any commit (runtime/isolate.py).
    breaker = Breaker(sum(len(b) for b in batches), execution.systemic_share, execution.systemic_min_docs)
    with make_task_runner(execution) as runner, \
            stage_progress("batches", sum(len(b) for b in batches)) as advance:
        try:  # the Dask client connects on the first submission
            # A plan's batches are named apart: a run under a cost ceiling shows both in the UI.
            stage = batch_stage.with_options(task_run_name="plan-batch-{number}") if dry_run else batch_stage
            futures = [runner.submit(stage, {"number": n, "run_dir": run_dir, "extraction": cfg.extraction,
                                                   "plans": plans, "storage": storage, "dry_run": dry_run,
                                                   "own_process": execution.task_runner == "process"})
                       for n in range(len(batches))]
        except OSError as exc:
            if execution.dask_address is None:  # not a cluster we were pointed at
                raise
            msg = f"execution.dask_address: cannot reach the Dask cluster at {execution.dask_address}: {exc}"
            raise ConfigError(msg) from None
        # In batch order, so that commits (and what a crash leaves) do not depend on which worker was first.
        for n, future in enumerate(futures):
            done = future.result()
            breaker.observe(len(batches[n]), [e for work in done.indexes for e in work.errors])
            breaker.check()  # before this batch reaches a writer
            hold = breaker.undecided()
            for writer, work in zip(writers, done.indexes):
                writer.add(work, hold=hold)
            for total, work in zip(totals.indexes, done.indexes):
                total.extracted.append(work.extracted)
                total.embedded.append(work.embedded)
                total.rows += work.rows
                total.texts = merge_usage(total.texts, work.texts)
                total.usage = merge_usage(total.usage, work.usage)
                total.validation = merge_validation(total.validation, work.validation)
            totals.notices.extend(x for x in [*done.notices, *(n for w in done.indexes for n in w.notices)]
                                  if x not in totals.notices)
            totals.seconds = merge_usage(totals.seconds, done.seconds)
            spans.append(done.span)
            advance(len(batches[n]))
            release_memory()
            if (n + 1) % TIDY_EVERY == 0 and n + 1 < len(batches):  # later batches' lookups stay quick
                tidy_model_cache(cfg)
    # Stage seconds are summed over batches: with several workers they add up to more than the wall time.
    totals.seconds = {k: round(v, 3) for k, v in totals.seconds.items()}
    # First batch start to last batch end: the batches' own time, without the runner's start-up.
    totals.seconds["batch span"] = round(max(e for _, e in spans) - min(b for b, _ in spans), 3)
    return totals
