"""The `inlet` command: ingest the configured sources, query the store."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

import providers  # noqa: F401 - offline switches before Prefect loads
from runtime.prefect_api import START_HINT, local_defaults
from schemas.errors import InletError, PublishHeldError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rich.console import Console

    from runtime.prefect_api import PrefectApi, TemporaryServer
    from query.search import SearchResult
    from query.service import KnowledgeBase
    from schemas.config import ApiKeys, InletConfig

app = typer.Typer(help="Keep a LanceDB knowledge base fresh and search it.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "inlet.yaml"
ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML config file.")]
VariantOpt = Annotated[str | None, typer.Option(help="A named index variant of the config (default: the main index).")]


local_defaults()  # Inlet's local Prefect server port (4311) and Prefect home (.prefect) unless set otherwise


@contextlib.contextmanager
def _prefect_api(*, quiet: bool = False, flows: str | None = None, cfg: InletConfig | None = None,
                 early: TemporaryServer | None = None) -> Iterator[PrefectApi]:
    """Flow runs in the body use the configured Prefect API, else the local server; say once if neither runs.

    flows: the flow module the body runs, imported while a temporary server (if one is needed) starts; with cfg,
    its prepare_process(cfg) runs then too. early: a temporary server the command started before (else started here).
    """
    import importlib

    from runtime.prefect_api import early_server, use_prefect_api

    def meanwhile() -> None:
        module = importlib.import_module(flows)
        if cfg is not None:
            module.prepare_process(cfg)

    with use_prefect_api(meanwhile if flows else None, early or early_server()) as api:
        if api.source == "temporary" and not quiet:
            typer.secho(f"note: {START_HINT.format(ui=api.ui)}", fg=typer.colors.YELLOW, err=True)
        yield api


def _fail(exc: Exception) -> None:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _hand_over(command: str, kwargs: dict, *, quiet: bool = False, bars: bool = False) -> dict | None:
    """Run the command in `inlet server`'s warm process if one takes it (its answer), else None: run it here.

    Its log lines and progress bars show here as they happen; Ctrl-C stops its run there (exit code 130).
    """
    from runtime.warm import Declined, hand_over
    from schemas.errors import WorkerDiedError

    progress = drawer = None
    if bars:
        from runtime.progress import BarsFromEvents, new_bars

        progress = new_bars()
        drawer = BarsFromEvents(progress)

    def on_event(event: tuple) -> None:
        if event[0] == "log":
            if progress is not None:
                progress.console.print(event[2], markup=False, highlight=False, soft_wrap=True)
            else:
                print(event[2], file=sys.stderr, flush=True)
        elif event[0] == "bar" and drawer is not None:
            if not progress.live.is_started:
                progress.start()
            drawer.show(event)

    interrupted = False
    try:
        answer = hand_over(command, kwargs, on_event)
    except KeyboardInterrupt:
        interrupted = True
    except WorkerDiedError as exc:  # a run killed anywhere converges when run again: so run it here
        answer = Declined(str(exc))
    finally:
        if progress is not None:
            progress.stop()
    if interrupted:
        typer.secho("interrupted: the run in the warm process was stopped; the next run takes up from where it was",
                    fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(130)
    if isinstance(answer, Declined):
        if answer.why and not quiet:
            typer.secho(f"note: the warm process of `inlet server` did not take this command ({answer.why}); "
                        "running it here", fg=typer.colors.YELLOW, err=True)
        return None
    return answer


def _print_summary(summary: dict) -> None:
    from rich.table import Table

    from schemas.arrow import RUN_COUNTS

    table = Table("", "", title=f"run {summary['run_id']}", show_header=False, title_justify="left")
    for key in RUN_COUNTS:
        table.add_row(key.replace("_", " "), str(summary[key]))
    if summary["llm_calls"] or summary["embed_calls"]:
        table.add_row("model calls", f"{summary['llm_calls']} enrich ({summary['llm_retries']} retries, "
                      f"{summary['llm_failures']} failed), {summary['embed_calls']} embed")
        table.add_row("tokens", f"{summary['llm_prompt_tokens']} prompt ({summary['llm_cached_tokens']} cached), "
                      f"{summary['llm_output_tokens']} output, {summary['embed_tokens']} embedded (est.)")
        table.add_row("cost (est.)", f"${summary['cost_usd']:.4f}; cache spared ${summary['cost_saved_usd']:.4f}")
    table.add_row("seconds per stage", ", ".join(f"{k} {v:.2f}" for k, v in summary["stage_seconds"].items()))
    table.add_row("table versions", ", ".join(f"{k} {v}" for k, v in summary["versions"].items()))
    _console().print(table)
    _print_problems(summary)


def _print_problems(summary: dict) -> None:
    """The quarantined documents and the notices of a run or a plan, in yellow."""
    for row in summary["quarantined"]:
        typer.secho(f"  quarantined {row['doc_id']} ({row.get('stage', 'extract')}): {row['reason']}: "
                    f"{row['message']}", fg=typer.colors.YELLOW)
    for notice in summary["notices"]:
        typer.secho(f"  notice: {notice}", fg=typer.colors.YELLOW)


def _warm_ingest_answer(answer: dict) -> tuple[dict, PublishHeldError | None, str | None]:
    """The summary, hold and UI page of a run the warm process made (exit 2 if it failed)."""
    if "error" in answer:
        _fail(InletError(answer["error"]))
    held = PublishHeldError(answer["held"], answer["summary"]) if "held" in answer else None
    page = f"{answer['ui']}/runs/flow-run/{answer['flow_run_id']}" if answer.get("ui") else None
    return answer["summary"], held, page


def _ingest_here(config: Path, flow_args: dict, *, quiet: bool, as_json: bool, early: TemporaryServer | None
                 ) -> tuple[dict, PublishHeldError | None, str | None]:
    """Run the ingest flow in this process: its summary, hold and UI page (None without a lasting server).

    early: the temporary server the command started before, if it did (ingest's first step).
    """
    if quiet:  # read when Prefect is first imported, below
        os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
    from schemas.config import load_config

    held, page = None, None
    try:
        # Fail on a bad config before Prefect or the flow's libraries load (an early server stops at exit, unused).
        cfg = load_config(config)
        with _prefect_api(quiet=quiet, flows="flows.ingest", cfg=cfg, early=early) as api:
            from flows.ingest import ingest as ingest_flow
            from runtime.progress import terminal_bars

            bars = contextlib.nullcontext() if quiet or as_json else terminal_bars()
            with bars:
                state = ingest_flow(**{**flow_args, "config_path": str(config)}, return_state=True)
            page = api.flow_run_page(state.state_details.flow_run_id)
            summary = state.result()
    except PublishHeldError as exc:  # committed and reported, not published
        summary, held = exc.summary, exc
    except InletError as exc:
        _fail(exc)
    return summary, held, page


@app.command()
def ingest(
    config: ConfigOpt = DEFAULT_CONFIG,
    retry_quarantined: Annotated[bool, typer.Option(help="Try quarantined documents again even if unchanged.")] = False,
    allow_deletions: Annotated[bool, typer.Option(help="Delete documents gone from a source even when the "
                                                  "mass-deletion guard would hold them.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run summary as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars, info logs or summary; errors "
                                        "and warnings only (for cron).")] = False,
    max_cost_usd: Annotated[float | None, typer.Option(help="Plan first; stop before any model call if the plan "
                                                       "costs more (default: run.max_cost_usd).")] = None,
    allow_cost: Annotated[bool, typer.Option(help="Go ahead whatever the plan costs.")] = False,
) -> None:
    """Run the ingest flow once on the configured sources, with a progress bar per long stage.

    With `inlet server` running, its warm process runs it (the same flow run; runtime/warm.py says when it declines).
    """
    from runtime.prefect_api import early_server

    # First thing: where no server answers (so no warm process either), a temporary one boots from here on, on the
    # other core, while this command loads; where one answers, this is a refused or accepted connection, no more.
    early = early_server()
    flow_args = {"config_path": str(config.resolve()), "retry_quarantined": retry_quarantined,
                 "allow_deletions": allow_deletions, "max_cost_usd": max_cost_usd, "allow_cost": allow_cost}
    answer = None if early else _hand_over("ingest", {**flow_args, "quiet": quiet, "bars": not (quiet or as_json)},
                                           quiet=quiet, bars=not (quiet or as_json))
    if answer is not None:
        summary, held, page = _warm_ingest_answer(answer)
    else:
        summary, held, page = _ingest_here(config, flow_args, quiet=quiet, as_json=as_json, early=early)
    if as_json:
        typer.echo(json.dumps(summary, indent=2, default=str))
    elif not quiet:
        _print_summary(summary)
        typer.echo(f"this run in the Prefect UI: {page}" if page else
                   "to see runs in the Prefect UI, keep a server running: `make server` (or `inlet server`)")
    if held is not None:
        for row in summary["gate"]["lost"] if summary.get("gate") else []:
            typer.secho(f"  lost: {row['question']} (gold: {row['gold']})", fg=typer.colors.YELLOW)
        typer.secho(f"held: {held}", fg=typer.colors.RED, err=True)
        raise typer.Exit(3)


def _print_plan(plan: dict) -> None:
    """Print a plan: what would change, the model work, the estimated cost by cause and the time."""
    from rich.table import Table

    table = Table("", "", title=f"plan {plan['plan_id']}: nothing written, no model called", show_header=False,
                  title_justify="left")
    from schemas.arrow import PLAN_COUNTS

    for key in PLAN_COUNTS:
        table.add_row(key.replace("_", " "), str(plan[key]))
    table.add_row("models", f"{plan['model_mode']}: {plan['llm_calls']} enrich calls, {plan['llm_batch_requests']} "
                  f"rows in {plan['llm_batch_jobs']} batch jobs; {plan['embed_calls']} embed calls, "
                  f"{plan['embed_batch_jobs']} batch jobs")
    table.add_row("tokens (est.)", f"{plan['llm_prompt_tokens']} prompt, {plan['llm_output_tokens']} output, "
                  f"{plan['embed_tokens']} embedded")
    table.add_row("cost (est.)", f"${plan['cost_usd']:.4f} (enrich ${plan['llm_cost_usd']:.4f}, embed "
                  f"${plan['embed_cost_usd']:.4f}); cache spares ${plan['cost_saved_usd']:.4f}")
    seconds = plan["estimated_seconds"]
    table.add_row("time (est.)", f"{seconds:.0f} s (pace of the last {plan['pace_runs']} runs)" if seconds is not None
                  else "unknown: no earlier run with work")
    _console().print(table)
    for cause in plan["causes"]:
        typer.echo(f"  {cause['cause']}: {cause['documents']} documents, {cause['texts_enriched']} to enrich, "
                   f"{cause['texts_embedded']} to embed, ${cause['cost_usd']:.4f}")
    _print_problems(plan)


@app.command()
def plan(
    config: ConfigOpt = DEFAULT_CONFIG,
    retry_quarantined: Annotated[bool, typer.Option(help="Plan to try quarantined documents again.")] = False,
    allow_deletions: Annotated[bool, typer.Option(help="Plan deletions the mass-deletion guard would hold.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Show what `inlet ingest` would do and cost: crawl, detect, extract and chunk, no store write, no model call."""
    from schemas.config import load_config

    try:
        cfg = load_config(config)
        with _prefect_api(quiet=as_json, flows="flows.ingest", cfg=cfg):
            from flows.ingest import ingest as ingest_flow

            summary = ingest_flow(config_path=str(config), retry_quarantined=retry_quarantined,
                                  allow_deletions=allow_deletions, dry_run=True)
    except InletError as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps(summary, indent=2, default=str))
    else:
        _print_plan(summary)


@app.command()
def publish(
    run: Annotated[str, typer.Argument(help="The run id the publish gate held (see `inlet versions`).")],
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """Publish a run the publish gate held: readers move to its version."""
    from flows.publishing import publish_run
    from schemas.config import load_config

    try:
        moved = publish_run(load_config(config), run)
    except InletError as exc:
        _fail(exc)
    typer.echo(", ".join(f"{table}: version {v}" for table, v in moved.items()) + f" published ({run})")


@app.command()
def rollback(
    target: Annotated[str, typer.Argument(help="A run id, or a chunks-table version a run tagged.")],
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """Make the chunks and documents tables what they were after a run, as new versions readers see."""
    from flows.publishing import rollback as rollback_store
    from schemas.config import load_config

    try:
        done = rollback_store(load_config(config), target)
    except InletError as exc:
        _fail(exc)
    for table, d in done.items():
        typer.echo(f"{table}: version {d['version']} holds what version {d['restored']} held (after {d['run']}); "
                   "readers see it. The next `inlet ingest` brings the sources back in.")


@app.command()
def query(
    text: Annotated[str, typer.Argument(help="What to search for.")],
    k: Annotated[int, typer.Option("-k", help="Number of results.")] = 5,
    where: Annotated[list[str] | None, typer.Option(help="Filter FIELD=VALUE (repeatable), e.g. doc_type=guide.")] = None,
    mode: Annotated[str | None, typer.Option(help="vector, fulltext or hybrid (default: query.mode).")] = None,
    clearance: Annotated[str, typer.Option(help="public, internal, restricted or confidential.")] = "public",
    as_of: Annotated[str | None, typer.Option("--as-of", help="A table version, run id or ISO time.")] = None,
    neighbors: Annotated[int, typer.Option(help="Show this many chunks before and after each hit.")] = 0,
    fallback: Annotated[bool, typer.Option(help="Retry without --where when nothing matches.")] = False,
    explain: Annotated[bool, typer.Option(help="Show each hit's document, chunk, effective access level and "
                                          "expiry, and language.")] = False,
    variant: VariantOpt = None,
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """Search the store and print the best chunks with citations (in `inlet server`'s warm process if one runs)."""
    filters: dict[str, object] = {}
    for item in where or []:
        key, sep, value = item.partition("=")
        if not sep:
            _fail(ValueError(f"--where expects FIELD=VALUE, got '{item}'"))
        filters.setdefault(key, []).append(value)
    version = int(as_of) if as_of is not None and as_of.isdigit() else as_of
    asked = {"text": text, "k": k, "where": filters or None, "mode": mode, "clearance": clearance, "as_of": version,
             "neighbors": neighbors, "fallback": fallback, "variant": variant}
    answer = _hand_over("query", {**asked, "config": str(config.resolve())})
    if answer is not None:
        if "error" in answer:
            _fail(InletError(answer["error"]))
        results = answer["results"]
    else:
        from query import search

        try:
            results = search(**asked, config=config)
        except InletError as exc:
            _fail(exc)
    if not results:
        typer.echo("no results")
    for notice in results.notices:
        typer.secho(f"notice: {notice}", fg=typer.colors.YELLOW)
    for i, r in enumerate(results, 1):
        typer.secho(f"[{i}] {r.score:.3f}  {r.citation}", bold=True)
        if explain:
            typer.secho(f"    {explanation(r)}", dim=True)
        for near in r.before:
            typer.secho("    ... " + near.text.strip().replace("\n", " ")[:200], dim=True)
        typer.echo("    " + r.text.strip().replace("\n", "\n    ")[:600])
        for near in r.after:
            typer.secho("    ... " + near.text.strip().replace("\n", " ")[:200], dim=True)


def explanation(hit: SearchResult) -> str:
    """One line on a hit: its document and chunk, the access level and expiry it is served under, its language."""
    meta = hit.metadata
    return (f"doc {hit.doc_id} · chunk {meta['chunk_index'] + 1}/{meta['total_chunks']} · "
            f"access {meta['access_level']} · expires {meta.get('expires_at') or 'never'} · "
            f"language {meta.get('language') or 'unknown'}")


def _console() -> Console:
    """A console that keeps tables whole when the output is piped (cron mails, logs, tests)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


@app.command()
def versions(variant: VariantOpt = None, config: ConfigOpt = DEFAULT_CONFIG) -> None:
    """List the runs with their tags, chunks-table versions and counts."""
    from rich.table import Table

    from query import versions as list_versions

    try:
        runs = list_versions(config=config, variant=variant)
    except InletError as exc:
        _fail(exc)
    table = Table("run (tag)", "started", "status", "chunks v.", "new", "changed", "deleted", "quarantined",
                  "chunks +", "chunks -", "embedded")
    for r in runs:
        table.add_row(r["run_id"] + ("" if r["tag"] else " (untagged)"), f"{r['started_at']:%Y-%m-%d %H:%M:%S}",
                      r["status"] + (" *" if r["published"] else ""), str(r["chunks_version"]), *(str(r[k]) for k in (
                          "docs_new", "docs_changed", "docs_deleted", "docs_quarantined", "chunks_added",
                          "chunks_removed", "texts_embedded")))
    _console().print(table if runs else "no runs yet")
    if runs:
        typer.echo("* the version readers see (published)")


@app.command()
def quarantine(config: ConfigOpt = DEFAULT_CONFIG, variant: VariantOpt = None,
               as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False) -> None:
    """List the quarantined documents: reason, message, since when and how many runs tried them."""
    from rich.table import Table

    from query import quarantined

    try:
        rows = quarantined(config=config, variant=variant)
    except InletError as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    table = Table("document", "stage", "reason", "message", "since", "attempts", title=f"{len(rows)} quarantined",
                  title_justify="left")
    for r in rows:
        table.add_row(r["doc_id"], r["stage"], r["reason"], r["message"], f"{r['since']:%Y-%m-%d %H:%M}",
                      str(r["attempts"]))
    _console().print(table if rows else "nothing is quarantined")
    if rows:
        typer.echo("A quarantined document is tried again when its bytes change, or with `inlet ingest "
                   "--retry-quarantined`.")


@app.command()
def diff(
    old: Annotated[str, typer.Argument(help="A run id, table version or ISO time.")],
    new: Annotated[str, typer.Argument(help="A run id, table version or ISO time.")],
    variant: VariantOpt = None,
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """Say which documents and chunks were added, removed or changed between two versions."""
    from rich.table import Table

    from query import diff as diff_versions

    try:
        change = diff_versions(*(int(v) if v.isdigit() else v for v in (old, new)), config=config, variant=variant)
    except InletError as exc:
        _fail(exc)
    table = Table("document", "change", title=f"chunks table v{change.old_version} -> v{change.new_version}")
    for kind, docs in (("added", change.documents_added), ("removed", change.documents_removed),
                       ("changed", change.documents_changed)):
        for doc in docs:
            table.add_row(doc, kind)
    console = _console()
    console.print(table)
    console.print(f"chunks: {len(change.chunks_added)} added, {len(change.chunks_removed)} removed, "
                  f"{len(change.chunks_changed)} re-enriched or re-embedded")


def _weights(text: str) -> tuple[float, float]:
    """Parse VECTOR:FULLTEXT hybrid weights."""
    parts = text.split(":")
    try:
        vector, fulltext = (float(p) for p in parts)
    except ValueError:
        msg = f"--sweep expects VECTOR:FULLTEXT weights such as 1:0.5, got '{text}'"
        raise ValueError(msg) from None
    if vector < 0 or fulltext < 0:
        msg = f"--sweep weights cannot be negative, got '{text}'"
        raise ValueError(msg)
    return vector, fulltext


@app.command(name="eval")
def eval_(
    dataset: Annotated[Path | None, typer.Argument(help="A BEIR folder (corpus.jsonl, queries.jsonl, "
                                                        "qrels/test.tsv), a folder of them (each is evaluated), "
                                                        "or a CSV with columns question and gold.")] = None,
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: Annotated[Path | None, typer.Option(help="Where the eval stores live (default: beside the runs).")] = None,
    sweep: Annotated[list[str] | None, typer.Option(help="Hybrid weights to try, VECTOR:FULLTEXT (repeatable).")] = None,
    max_queries: Annotated[int | None, typer.Option(help="Ask at most this many queries per set (a seeded sample).",
                                                    min=1)] = None,
    keep_runs: Annotated[bool, typer.Option(help="Also write each set's answers (runs-<variant>.json) for "
                                                 "bench/fusion.py.")] = False,
    calibrate: Annotated[Path | None, typer.Option(help="Fit the hybrid fusion to this questions CSV (question, "
                                                        "gold) over the config's sources; prints the YAML.")] = None,
) -> None:
    """Measure nDCG@10, recall@10 and MRR@10 of vector, full-text and the default mode, with 95% intervals."""
    from rich.table import Table

    from flows.eval import evaluate

    if calibrate is not None:
        _calibrate(calibrate, config, workdir)
        return
    if dataset is None:
        _fail(ValueError("give a data set to evaluate, or --calibrate QUESTIONS.csv"))
    try:
        weights = [_weights(w) for w in sweep or []]
        with _prefect_api():
            report = evaluate(dataset=str(dataset), config_path=str(config),
                              workdir=str(workdir) if workdir else None, sweep=weights or None,
                              max_queries=max_queries, keep_runs=keep_runs)
    except (InletError, ValueError) as exc:
        _fail(exc)
    table = Table("set", "variant", "mode", "nDCG@10 (95% interval)", "recall@10", "MRR@10", "queries",
                  title=f"{report['dataset']}: {report['queries']} queries")
    for r in report["results"]:
        mode = r["mode"] + (f" {r['weights']}" if r.get("weights") else "")
        table.add_row(r["set"], r["variant"], mode, f"{r['ndcg@10']:.3f} ({r['ndcg@10_lo']:.3f}-{r['ndcg@10_hi']:.3f})",
                      f"{r['recall@10']:.3f}", f"{r['mrr@10']:.3f}", str(r["queries"]))
    _console().print(table)
    for c in report["checks"]:
        typer.echo(check_line(c))
    typer.echo(f"written to {report['path']}")


def check_line(c: dict) -> str:
    """One set's check: how far apart its sides are, and whether the default reached the better one."""
    sides = f"vector - full-text {c['vector_minus_fulltext']:+.3f}" + (" (the sides disagree)" if c["disagree"] else "")
    if c["ok"]:
        verdict = "ok"
    elif c["not_worse"]:
        verdict = "BELOW the better side where the sides disagree"
    else:
        verdict = "WORSE"
    return (f"{c['set']} ({c['variant']}): {sides}; default - {c['better_side']} = {c['default_minus_better']:+.3f} "
            f"({c['diff_lo']:+.3f} to {c['diff_hi']:+.3f}) {verdict}")


def _calibrate(questions: Path, config: Path, workdir: Path | None) -> None:
    """Run the calibration flow and print its before/after figures and the YAML to paste."""
    from flows.eval import calibrate

    try:
        with _prefect_api():
            report = calibrate(questions=str(questions), config_path=str(config),
                               workdir=str(workdir) if workdir else None)
    except (InletError, ValueError) as exc:
        _fail(exc)
    for name in ("before", "after", "gain"):
        mean, lo, hi = report[name]
        typer.echo(f"{name:6s} nDCG@10 {mean:+.3f} ({lo:+.3f} to {hi:+.3f})" if name == "gain" else
                   f"{name:6s} nDCG@10 {mean:.3f} ({lo:.3f}-{hi:.3f})")
    typer.echo(f"{report['questions']} questions, {report['folds']}-fold: 'after' is out of sample. "
               f"Paste into {config}:\n")
    typer.echo(report["yaml"])


@app.command()
def maintain(
    config: ConfigOpt = DEFAULT_CONFIG,
    retention_days: Annotated[float | None, typer.Option(help="Keep versions (and run tags) younger than this; "
                                                               "default: maintenance.retention_days.")] = None,
    repair: Annotated[bool | None, typer.Option("--repair/--no-repair", help="Repair what the integrity check "
                                                "finds; default: maintenance.repair.")] = None,
) -> None:
    """Compact and prune the store, refresh its indexes, check integrity (and repair on request)."""
    from rich.table import Table

    from flows.maintenance import maintenance

    try:
        with _prefect_api():
            report = maintenance(config_path=str(config), retention_days=retention_days, repair=repair)
    except InletError as exc:
        _fail(exc)
    table = Table("table", "versions", "fragments", "rows", "run tags removed", title="maintenance")
    for name, t in report["tables"].items():
        b, a = t["before"], t["after"]
        table.add_row(name, f"{b['versions']} -> {a['versions']}", f"{b['fragments']} -> {a['fragments']}",
                      str(a["rows"]), str(len(t["tags_removed"])))
    _console().print(table)
    for f in report["findings"]:
        typer.secho(f"  {f['check']} {f['table']} {f['doc_id'] or ''} {f['chunk_id'] or ''}: {f['detail']}",
                    fg=typer.colors.YELLOW)
    typer.echo(f"{len(report['findings'])} integrity findings" +
               (f"; repaired: {report['repaired']}" if report["repaired"] else ""))


@app.command()
def serve(
    deployment: Annotated[list[str] | None, typer.Option("--deployment", "-d", help="Serve only these deployments "
                                                         "of prefect.yaml (repeatable; default: all).")] = None,
) -> None:
    """Run prefect.yaml's deployments (ingest, maintenance, eval) on their schedules in this process, no worker needed.

    Runs register with the Prefect API in PREFECT_API_URL (start one with `make server`) and show in its UI.
    """
    from prefect import serve as prefect_serve

    from flows.serve import runner_deployments

    try:
        deployments = runner_deployments(names=deployment)
    except InletError as exc:
        _fail(exc)
    from runtime.prefect_api import choose_api

    if choose_api().source == "temporary":  # its schedules need a server that stays up, with its scheduler
        _fail(InletError("inlet serve needs a Prefect server that stays up: start `make server` (or `inlet server`) "
                         "in another terminal, or set PREFECT_API_URL"))
    with _prefect_api():
        prefect_serve(*deployments)


@app.command()
def server(
    status: Annotated[bool, typer.Option("--status", help="Only say whether the local server answers, and where "
                                         "(exit code 1 if it does not).")] = False,
    warm: Annotated[bool, typer.Option(help="Keep a warm Inlet process that runs `inlet ingest` and `inlet query` "
                                       "for you (models and libraries loaded once).")] = True,
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """Run the local Prefect server and UI (127.0.0.1:4311) that every inlet command then uses; Ctrl-C stops it.

    Beside it, a warm Inlet process (runtime/warm.py) runs `inlet ingest` and `inlet query` in seconds instead of
    paying the imports and model loads each time; a command it cannot take runs in its own process as before.
    Where: Prefect's PREFECT_SERVER_API_HOST and PREFECT_SERVER_API_PORT. A PREFECT_API_URL of your own (environment
    or Prefect profile) always wins over it. Flow runs older than a week are vacuumed, as events already are: live
    mode makes a flow run per micro-batch.
    """
    from runtime.prefect_api import answers, local_server_url
    from runtime.warm import ask_status, environment, supervise

    url = local_server_url()
    ui = url.removesuffix("/api")
    prefect_up = answers(url)
    warm_now = ask_status()
    if status or (prefect_up and (warm_now or not warm)):
        if prefect_up:
            typer.echo(f"a Prefect server answers at {url}: the UI is at {ui}; inlet commands use it")
        else:
            typer.echo(f"no Prefect server answers at {url}: start one in another terminal with `make server` (or "
                       "`inlet server`) for the Prefect UI, and `inlet ingest` and `inlet query` in a second or two")
        if warm_now:
            typer.echo(f"a warm Inlet process (pid {warm_now['worker_pid']}, up {warm_now['up_s']} s, "
                       f"{warm_now['served']} commands run) takes `inlet ingest` and `inlet query`")
        if not prefect_up:
            raise typer.Exit(1)
        return
    from schemas.config import load_config

    try:
        load_config(config)  # a bad config fails here, not in the warm process's start
    except InletError as exc:
        _fail(exc)
    env = {"PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED": '["events","flow_runs"]',
           "PREFECT_SERVER_SERVICES_DB_VACUUM_RETENTION_PERIOD": "P7D", **os.environ}
    sys.exit(supervise(url, server_env=None if prefect_up else env, warm_config=str(config.resolve()) if warm else None,
                       caller_env=environment(), worker_module="flows.cli_worker"))


@app.command()
def watch(
    config: ConfigOpt = DEFAULT_CONFIG,
    events: Annotated[bool | None, typer.Option("--events/--no-events", help="Watch local folders with file-system "
                                                "events (default: watch.events); off, reconciliation and polling "
                                                "alone find changes.")] = None,
    emit_only: Annotated[bool, typer.Option(help="Emit a Prefect event (inlet.sources.changed) per settled set of "
                                            "changes for the ingest deployment's trigger, instead of ingesting "
                                            "here.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON line per micro-batch.")] = False,
) -> None:
    """Keep the store current: each settled set of changes is an ingest run, searchable when it ends (Ctrl-C stops)."""
    import signal
    import threading

    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # a line per micro-batch, not per task run
    from flows.watch import Batch, watch_loop

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # the micro-batch in progress finishes, then the watcher ends
        signal.signal(sig, lambda *_: stop.set())

    def on_ready(info: dict) -> None:
        if as_json:
            typer.echo(json.dumps({"kind": "ready", **info}), err=False)
            return
        how = "file-system events" if info["events"] else "no file-system events"
        typer.echo(f"inlet watch: {how} under {', '.join(info['roots']) or 'no local folder'}; reconciliation every "
                   f"{info['reconcile_s']:g} s" + (f"; polling {info['polled']}" if info["polled"] else "") +
                   (f"; marked crashed: {', '.join(info['crashed'])}" if info["crashed"] else ""), err=True)

    def on_batch(batch: Batch) -> None:
        line = batch.line()
        if as_json:
            typer.echo(json.dumps(line, default=str))
        elif batch.error:
            typer.secho(f"{line['at'][:19]} {batch.kind} {', '.join(batch.sources)}: {batch.error}",
                        fg=typer.colors.RED, err=True)
        elif batch.kind == "ingest":
            typer.echo(f"{line['at'][:19]} {line.get('run_id')} ({', '.join(line['why'])}): "
                       f"{line.get('docs_new', 0)} new, {line.get('docs_changed', 0)} changed, "
                       f"{line.get('docs_deleted', 0)} deleted, {line.get('texts_embedded', 0)} embedded; "
                       f"version {line['version']} searchable {line['since_notice']:.2f} s after the change")
        elif batch.kind == "worker":
            typer.echo(f"{line['at'][:19]} worker replaced by a warm spare after {line['detail']['calls']} runs "
                       f"({line['detail']['rss_mb']:.0f} MB, settled at {line['detail']['settled_mb']:.0f} MB)")
        else:
            typer.echo(f"{line['at'][:19]} {batch.kind} done in {line['seconds']:.2f} s")

    try:
        with _prefect_api(quiet=as_json):
            watch_loop(config, events=events, emit_only=emit_only, stop=stop, on_batch=on_batch, on_ready=on_ready)
    except InletError as exc:
        _fail(exc)


ClearanceOpt = Annotated[str | None, typer.Option(help="Clearance of every caller: public, internal, restricted or "
                                                  "confidential (default: serving.clearance).")]
CallerOpt = Annotated[str | None, typer.Option(help="Caller name in the access log (default: serving.caller).")]
LogOpt = Annotated[Path | None, typer.Option("--access-log", help="Access log file (default: serving.access_log).")]


def _knowledge_base(config: Path, access_log: Path | None) -> tuple[InletConfig, KnowledgeBase]:
    """The config and a logged KnowledgeBase over its store."""
    from query.service import open_knowledge_base
    from schemas.config import load_config

    cfg = load_config(config)
    return cfg, open_knowledge_base(cfg, access_log)


KeysOpt = Annotated[Path | None, typer.Option(help="API keys file (default: serving.api_keys); each request then "
                                              "needs Authorization: Bearer KEY and is answered at its key's "
                                              "clearance.")]
InsecureOpt = Annotated[bool, typer.Option("--insecure-no-auth", help="Serve an address other than 127.0.0.1 "
                                           "without a keys file: anyone who can reach it is answered at the "
                                           "server's clearance.")]


def _exposure(host: str, api_keys: ApiKeys | None, insecure: bool, server: str) -> None:
    """Refuse an exposed server without keys; say so loudly when --insecure-no-auth allows it."""
    from query.service import check_exposure

    warning = check_exposure(host, api_keys, insecure, server)
    if warning:
        typer.secho(f"WARNING: {warning}", fg=typer.colors.RED, bold=True, err=True)


@app.command()
def mcp(
    http: Annotated[str | None, typer.Option(help="Serve streamable HTTP on HOST:PORT (path /mcp) instead of "
                                             "stdio.")] = None,
    keys: KeysOpt = None,
    insecure_no_auth: InsecureOpt = False,
    clearance: ClearanceOpt = None,
    caller: CallerOpt = None,
    access_log: LogOpt = None,
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """Serve the knowledge base to agents as MCP tools: search, get_context, list_sources, versions.

    Over stdio by default (an MCP client starts it, as the local user): the clearance is fixed here. Over --http,
    with a keys file (--keys or serving.api_keys) each request is answered at its key's clearance; without one, at
    the server's, and only on 127.0.0.1 unless --insecure-no-auth. Never by a tool argument.
    """
    from query.mcp_server import build_server, parse_address, serve_http
    from query.service import Caller
    from schemas.config import load_api_keys

    try:
        cfg, kb = _knowledge_base(config, access_log)
        address = parse_address(http) if http else None
        if address is None and keys:
            _fail(ValueError("--keys is for --http: over stdio the server is the local user's own process"))
        keys_file = (keys or cfg.serving.api_keys) if address else None
        api_keys = load_api_keys(keys_file) if keys_file else None
        if api_keys and (clearance or caller):
            _fail(ValueError("--clearance and --caller are for a server without a keys file: each key has its own"))
        who = Caller(caller or cfg.serving.caller, clearance or cfg.serving.clearance)
        if address:
            _exposure(address[0], api_keys, insecure_no_auth, "inlet mcp")
    except (InletError, ValueError) as exc:
        _fail(exc)
    url = "http://%s:%d/mcp" % address if address else None
    server = build_server(kb, who, api_keys, url)
    served = f"{len(api_keys.keys)} API keys" if api_keys else f"caller {who.name}, clearance {who.clearance}"
    typer.echo(f"inlet mcp: {url or 'stdio'}, {served}, access log {kb.log.path}", err=True)  # stdout: the protocol's
    if address is None:  # one client, the local user's agent: its first call loads what it needs
        server.run("stdio")
    else:
        typer.echo(f"inlet mcp: {kb.warm()}", err=True)  # before the port opens: no caller waits for the loading
        serve_http(server, kb, *address, who, api_keys)


@app.command()
def api(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    keys: KeysOpt = None,
    insecure_no_auth: InsecureOpt = False,
    clearance: ClearanceOpt = None,
    caller: CallerOpt = None,
    access_log: LogOpt = None,
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """Serve the knowledge base as an HTTP JSON API: POST /search, GET /context/ID, /sources, /versions; docs at /docs."""
    import uvicorn

    from query.guard import guarded
    from query.http_api import build_app
    from query.service import Caller, callers_of
    from schemas.config import load_api_keys

    try:
        cfg, kb = _knowledge_base(config, access_log)
        keys_file = keys or cfg.serving.api_keys
        api_keys = load_api_keys(keys_file) if keys_file else None
        if api_keys and (clearance or caller):
            _fail(ValueError("--clearance and --caller are for a server without a keys file: each key has its own"))
        who = Caller(caller or cfg.serving.caller, clearance or cfg.serving.clearance)
        _exposure(host, api_keys, insecure_no_auth, "inlet api")
    except InletError as exc:
        _fail(exc)
    typer.echo(f"inlet api: http://{host}:{port} (docs at /docs), "
               f"{f'{len(api_keys.keys)} API keys' if api_keys else f'caller {who.name}, clearance {who.clearance}'}"
               f", access log {kb.log.path}", err=True)
    typer.echo(f"inlet api: {kb.warm()}", err=True)  # before the port opens: no caller waits for the loading
    uvicorn.run(guarded(build_app(kb, who, api_keys), kb, who, callers_of(api_keys)), host=host, port=port,
                log_level="warning")


if __name__ == "__main__":
    app()
