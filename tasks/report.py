"""run artifacts + load result -> runs row and the run summary."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from runtime.artifacts import read_artifact, write_artifact
from runtime.failpoints import failpoint
from schemas.arrow import (
    DOCUMENTS_SCHEMA,
    EXTRACTED_SCHEMA,
    RUN_COUNTS,
    RUN_USAGE,
    RUNS_SCHEMA,
    Change,
)
from store.commit import LoadResult
from store.tables import RUNS, connect, open_runs_table
from tasks.access import raised_and_lowered
from tasks.enrich import failed_enrichments
from tasks.refresh import refresh_ids


def _true(column: pa.ChunkedArray) -> int:
    return int(pc.sum(column).as_py() or 0)


def total_usage(usage: dict) -> dict:
    """Return every usage field of a run, with the run's total cost and the cost the caches spared."""
    out = {k: usage.get(k, 0) for k in RUN_USAGE}
    out["cost_usd"] = round(out["llm_cost_usd"] + out["embed_cost_usd"], 6)
    out["cost_saved_usd"] = round(out["llm_saved_usd"] + out["embed_saved_usd"], 6)
    return out


def text_counts(embedded: pa.Table) -> dict[str, int]:
    """Count a batch's model work: texts enriched and embedded now, truncated by the model, enrichment failed."""
    return {"texts_enriched": _true(embedded["enriched_now"]), "texts_embedded": _true(embedded["embedded_now"]),
            "texts_truncated": _true(embedded["truncated"]), "texts_enrich_failed": failed_enrichments(embedded)}


MAX_NAMED = 20  # notices that name documents name this many, then count the rest


def declared_levels(documents: pa.Table, extracted: pa.Table) -> tuple[list[str], list[str]]:
    """The indexed documents whose own declaration raised their level, and notices for the lowerings ignored."""
    ok = extracted.filter(pc.and_(pc.equal(extracted["status"], "ok"), pc.is_valid(extracted["declared_level"])))
    if not ok.num_rows:
        return [], []
    floor = dict(zip(documents["doc_id"].to_pylist(), documents["access_level"].to_pylist()))
    rows = ok.select(["doc_id", "declared_level"]).to_pylist()
    raised, lowered = raised_and_lowered([floor.get(r["doc_id"]) for r in rows], [r["declared_level"] for r in rows])
    notices = [f"{rows[i]['doc_id']} declares access level {rows[i]['declared_level']}, below its source's "
               f"{floor[rows[i]['doc_id']]}: ignored, it is indexed as {floor[rows[i]['doc_id']]}"
               for i in lowered[:MAX_NAMED]]
    if len(lowered) > MAX_NAMED:
        notices.append(f"... and {len(lowered) - MAX_NAMED} more documents declare a level below their source's "
                       "(ignored)")
    return [rows[i]["doc_id"] for i in raised], notices


def merge_usage(total: dict, more: dict) -> dict:
    """Add one batch's model usage (calls, tokens, dollars) to the run's."""
    return {k: total.get(k, 0) + more.get(k, 0) for k in total.keys() | more.keys()}


def merge_validation(total: list[dict], more: list[dict]) -> list[dict]:
    """Add one batch's check outcomes to the run's: rows and failures summed, failing documents listed."""
    by_check = {(r["artifact"], r["check"]): r for r in total}
    for row in more:
        key = (row["artifact"], row["check"])
        if key in by_check:
            seen = by_check[key]
            by_check[key] = {**seen, "rows": seen["rows"] + row["rows"], "failed": seen["failed"] + row["failed"],
                             "documents": [*seen["documents"], *row["documents"]]}
        else:
            by_check[key] = dict(row)
    return list(by_check.values())


def summarize_run(documents: pa.Table, extracted: pa.Table, texts: dict[str, int], load: LoadResult,
                  usage: dict | None = None) -> dict:
    """Count what the run did, stage by stage, and what its model calls cost."""
    changes = dict.fromkeys(Change, 0)
    for change in documents["change"].to_pylist():
        changes[change] += 1
    failed = extracted.filter(pc.equal(extracted["status"], "quarantined")).to_pylist()
    raised, _ = declared_levels(documents, extracted)
    return {
        **{f"docs_{k}": v for k, v in changes.items()},
        "docs_quarantined": len(failed),
        "docs_refreshed": len(refresh_ids(documents)),
        "docs_access_raised": len(raised),
        **{k: getattr(load, k) for k in ("chunks_added", "chunks_removed", "chunks_reused", "chunks_written")},
        **{k: texts.get(k, 0) for k in RUN_COUNTS if k.startswith("texts_")},
        "docs_extracted": texts.get("docs_extracted", 0), "docs_from_kept": texts.get("docs_from_kept", 0),
        **total_usage(usage or {}),
        "quarantined": [{"doc_id": f["doc_id"], "stage": f["stage"] or "extract", "reason": f["reason"],
                         "message": f["message"]} for f in failed],
    }


def runs_row(summary: dict, *, run_id: str, started: datetime, finished: datetime, status: str, config_fp: str,
             stage_seconds: dict[str, float], versions: dict[str, int], notices: list[str],
             gate: dict | None = None) -> pa.Table:
    """Build the one-row runs table for this run."""
    row = {"run_id": run_id, "started_at": started, "finished_at": finished, "status": status,
           "config_fp": config_fp, **{k: summary[k] for k in (*RUN_COUNTS, *RUN_USAGE)},
           "stage_seconds": json.dumps(stage_seconds), "versions": json.dumps(versions), "notices": notices,
           "gate": gate["status"] if gate else None, "gate_recall": gate["recall"] if gate else None,
           "gate_baseline": gate["baseline"] if gate else None}
    return pa.Table.from_pylist([row], schema=RUNS_SCHEMA)


def summary_table(summary: dict, stage_seconds: dict[str, float], versions: dict[str, int], run_id: str,
                  validation: list[dict] = ()) -> list[dict]:
    """The run summary as metric/value rows: counts, checks, tokens and cost, seconds per stage, versions and tag."""
    rows = [{"metric": k, "value": summary[k]} for k in (*RUN_COUNTS, *RUN_USAGE)]
    rows += [{"metric": "checks_run", "value": len(validation)},
             {"metric": "checks_failed", "value": sum(1 for v in validation if v["failed"])}]
    rows += [{"metric": f"seconds {k}", "value": v} for k, v in stage_seconds.items()]
    rows += [{"metric": f"version {table}", "value": v} for table, v in versions.items()]
    return [*rows, {"metric": "tag", "value": run_id}]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def has_quarantine_report(quarantined: list[dict], notices: list[str], validation: list[dict]) -> bool:
    """Tell whether a run has a quarantine report to post: a quarantined document, a failed check, or a notice.

    A run with none of them (a no-op, or every check passed) would post "None" and a table of passes, an API
    call that was ~10% of a no-op run and ~5% of a 1% run (bench/README.md); its summary's docs_quarantined
    and checks_failed say the same. The key's latest is then the last run that had something to report.
    """
    return bool(quarantined or notices or any(v["failed"] for v in validation))


def quarantine_markdown(quarantined: list[dict], notices: list[str], validation: list[dict] = ()) -> str:
    """The run's quarantine list, data-quality results and notices as markdown (an empty list says so)."""
    lines = [f"## Quarantined documents ({len(quarantined)})", ""]
    if quarantined:
        lines += ["| document | stage | reason | message |", "|---|---|---|---|"]
        lines += [f"| {_cell(q['doc_id'])} | {q.get('stage', 'extract')} | {q['reason']} | {_cell(q['message'])} |"
                  for q in quarantined]
    else:
        lines.append("None: every document that changed was indexed.")
    if validation:
        lines += ["", "## Data-quality checks", "", "| artifact | check | severity | rows | failed |",
                  "|---|---|---|---:|---:|"]
        lines += [f"| {v['artifact']} | {v['check']} | {v['severity']} | {v['rows']} | {v['failed']} |"
                  for v in validation]
    if notices:
        lines += ["", "## Notices", "", *(f"- {_cell(n)}" for n in notices)]
    return "\n".join(lines)


@dataclass(frozen=True)
class RunInfo:
    """Which run this is and where it is recorded, for one index: the main one or a variant."""

    run_id: str
    started: datetime
    store_uri: str
    run_dir: str  # the index's folder in the run
    runs_table: str = RUNS
    config_fp: str = ""
    artifact_key: str = "ingest-run-summary"  # the Prefect artifact's key; a variant's carries its name


@dataclass
class IndexTotals:
    """One index's work over all the batches of a run, as the report counts it."""

    extracted: list[str] = field(default_factory=list)  # every batch's extracted artifact
    embedded: list[str] = field(default_factory=list)  # every batch's embedded artifact (a plan's: its estimate)
    rows: int = 0  # chunk rows over all batches
    texts: dict[str, int] = field(default_factory=dict)  # texts enriched, embedded, truncated, enrichment failed
    usage: dict[str, float] = field(default_factory=dict)  # model calls, tokens and dollars
    validation: list[dict] = field(default_factory=list)  # the data-quality checks' outcomes, summed


@task(name="report", cache_policy=NO_CACHE)
def report_stage(run: RunInfo, documents_path: str, totals: IndexTotals, load: LoadResult, *, finished: datetime,
                 stage_seconds: dict[str, float], notices: list[str], gate: dict | None = None) -> dict:
    """Append the run to the runs table, write it as the run artifact and return the run summary.

    gate: the publish gate's result, when one was set and the run had a new version; a held run's status is held.
    """
    validation = totals.validation
    extracted = (pa.concat_tables([read_artifact(p, EXTRACTED_SCHEMA) for p in totals.extracted])
                 if totals.extracted else EXTRACTED_SCHEMA.empty_table())
    documents = read_artifact(documents_path, DOCUMENTS_SCHEMA)
    summary = summarize_run(documents, extracted, totals.texts, load, totals.usage)
    notices = [*notices, *declared_levels(documents, extracted)[1]]
    held = gate is not None and gate["status"] == "held"
    row = runs_row(summary, run_id=run.run_id, started=run.started, finished=finished,
                   status="held" if held else "completed", config_fp=run.config_fp, stage_seconds=stage_seconds,
                   versions=load.versions, notices=notices, gate=gate)
    write_artifact(row, run.run_dir, "run", RUNS_SCHEMA)
    open_runs_table(connect(run.store_uri), run.runs_table).add(row)
    failpoint("reported")
    # Shown on the flow run's Artifacts tab; one stable key per artifact keeps the history together.
    rows = summary_table(summary, stage_seconds, load.versions, run.run_id, validation)
    if gate is not None:
        rows += [{"metric": "gate", "value": gate["status"]}, {"metric": "gate recall", "value": gate["recall"]},
                 {"metric": "gate baseline", "value": gate["baseline"]}]
    create_table_artifact(key=run.artifact_key, description=f"Inlet run {run.run_id}", table=rows)
    if has_quarantine_report(summary["quarantined"], notices, validation):
        create_markdown_artifact(key=run.artifact_key.replace("summary", "quarantine"),
                                 description=f"Inlet run {run.run_id}: quarantined documents, validation, notices",
                                 markdown=quarantine_markdown(summary["quarantined"], notices, validation))
    logger = get_run_logger()
    logger.info("run %s: %s", run.run_id, ", ".join(f"{k}={summary[k]}" for k in RUN_COUNTS))
    for notice in notices:
        logger.warning(notice)
    return {"run_id": run.run_id, **summary, "stage_seconds": stage_seconds, "versions": load.versions,
            "indexes": load.indexes, "notices": notices, "validation": validation, "gate": gate}
