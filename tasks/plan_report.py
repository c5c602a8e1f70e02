"""A plan's documents, estimates and the store's recent runs -> the plan summary: counts, cost, causes, time."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from runtime.artifacts import read_artifact
from schemas.arrow import DOCUMENTS_SCHEMA, EXTRACTED_SCHEMA, PLAN_COUNTS, REFRESH_ENRICHMENT, RUN_USAGE, Change
from store.tables import connect, open_table
from tasks.estimate import ESTIMATE_SCHEMA
from tasks.refresh import refresh_ids
from tasks.report import total_usage

RECENT_RUNS = 10  # completed runs with work whose pace estimates a plan's time


def cause_of(change: str, reason: str | None) -> str:
    """Why a document's chunks go to the models: the change detection's verdict, in words."""
    if change == Change.NEW:
        return "new documents"
    if change == Change.UNCHANGED and reason == REFRESH_ENRICHMENT:
        return "enrichment settings changed (prompt, model or kind): stored chunks re-enriched"
    return {"content": "changed documents", "settings": "chunking, extraction or embedder settings changed: "
            "documents chunked and embedded again", "metadata": "metadata changed", "retry": "quarantined "
            "documents retried", "interrupted": "a killed run's documents done again",
            "unreadable": "unreadable documents"}.get(reason or "", "changed documents")


def cost_causes(documents: pa.Table, estimates: pa.Table) -> list[dict]:
    """The plan's model work and cost grouped by why its documents are processed, costliest first."""
    why = {r["doc_id"]: cause_of(r["change"], r["reason"]) for r in
           documents.select(["doc_id", "change", "reason"]).to_pylist()}
    groups: dict[str, dict] = {}
    for row in estimates.to_pylist():
        cause = why.get(row["doc_id"], "changed documents")
        group = groups.setdefault(cause, {"cause": cause, "documents": 0, "texts_enriched": 0, "texts_embedded": 0,
                                          "cost_usd": 0.0})
        group["documents"] += 1
        for key in ("texts_enriched", "texts_embedded", "cost_usd"):
            group[key] += row[key]
    return sorted(({**g, "cost_usd": round(g["cost_usd"], 6)} for g in groups.values()),
                  key=lambda g: (-g["cost_usd"], -g["texts_enriched"] - g["texts_embedded"], g["cause"]))


def seconds_per_document(runs: pa.Table | None) -> tuple[float, int] | None:
    """The median seconds a recent completed run spent per document it processed, and how many runs that is."""
    if runs is None or not runs.num_rows:
        return None
    rows = [r for r in runs.to_pylist() if r["status"] == "completed"
            and (r["docs_new"] + r["docs_changed"] + (r.get("docs_refreshed") or 0)) > 0]
    rows = sorted(rows, key=lambda r: r["started_at"])[-RECENT_RUNS:]
    if not rows:
        return None
    pace = [(r["finished_at"] - r["started_at"]).total_seconds()
            / (r["docs_new"] + r["docs_changed"] + (r.get("docs_refreshed") or 0)) for r in rows]
    return statistics.median(pace), len(rows)


def estimated_seconds(docs: int, pace: tuple[float, int] | None) -> float | None:
    """Seconds the run would take at the recent pace (None when the store has no run with work to go by)."""
    if pace is None:
        return None
    return round(pace[0] * docs, 1) if docs else 0.0


def model_mode(usage: dict) -> str:
    """How the models would be reached: none, online, Batch Mode, or both (some batches small, some large)."""
    online = usage.get("llm_calls", 0) + usage.get("embed_calls", 0) > 0
    batch = usage.get("llm_batch_jobs", 0) + usage.get("embed_batch_jobs", 0) > 0
    return {(False, False): "none", (True, False): "online", (False, True): "batch mode"}.get((online, batch),
                                                                                           "online and batch mode")


def summarize_plan(documents: pa.Table, extracted: pa.Table, held: int, rows: int, texts: dict, usage: dict,
                   estimates: pa.Table, pace: tuple[float, int] | None) -> dict:
    """Count what a run would do and cost, say why, and how long it would take."""
    changes = dict.fromkeys(Change, 0)
    for change in documents["change"].to_pylist():
        changes[change] += 1
    quarantined = extracted.filter(pc.equal(extracted["status"], "quarantined"))
    worked = changes[Change.NEW] + changes[Change.CHANGED] + len(refresh_ids(documents))
    summary = {**{f"docs_{k}": v for k, v in changes.items()}, "docs_held": held,
               "docs_refreshed": len(refresh_ids(documents)), "docs_quarantined": quarantined.num_rows,
               "docs_extracted": texts.get("docs_extracted", 0), "docs_from_kept": texts.get("docs_from_kept", 0),
               "chunks": rows, **{k: texts.get(k, 0) for k in PLAN_COUNTS if k.startswith("texts_")},
               **total_usage(usage), "model_mode": model_mode(usage),
               "causes": cost_causes(documents, estimates),
               "estimated_seconds": estimated_seconds(worked, pace),
               "pace_runs": pace[1] if pace else 0}
    summary["quarantined"] = [{"doc_id": r["doc_id"], "stage": r["stage"] or "extract", "reason": r["reason"],
                               "message": r["message"]} for r in quarantined.to_pylist()]
    return summary


def held_documents(documents: pa.Table, known: pa.Table) -> int:
    """Documents the store holds that the plan neither lists nor deletes: kept by the mass-deletion guard."""
    listed = set(documents["doc_id"].to_pylist())
    return sum(1 for d in known["doc_id"].to_pylist() if d not in listed)


def plan_markdown(plan_id: str, summary: dict) -> str:
    """The plan as markdown: what would change, the model work, its cost by cause, the time."""
    s = summary
    seconds = s["estimated_seconds"]
    time_line = (f"about {seconds:.0f} s at the pace of the last {s['pace_runs']} runs with work" if seconds is not None
                 else "unknown: the store has no completed run with work to go by")
    lines = [f"## Plan {plan_id}: nothing written, no model called", "",
             f"- documents: {s['docs_new']} new, {s['docs_changed']} changed, {s['docs_deleted']} deleted, "
             f"{s['docs_held']} held by the deletion guard, {s['docs_refreshed']} re-enriched, "
             f"{s['docs_unchanged']} unchanged, {s['docs_quarantined']} would be quarantined",
             f"- extraction: {s['docs_extracted']} documents read from their files, {s['docs_from_kept']} re-chunked "
             "from kept elements",
             f"- chunks: {s['chunks']}; texts to enrich {s['texts_enriched']} ({s['texts_enrich_cached']} from the "
             f"model cache), to embed {s['texts_embedded']} ({s['texts_embed_cached']} from the cache)",
             f"- models: {s['model_mode']}; {s['llm_calls']} enrichment calls, {s['llm_batch_requests']} rows in "
             f"{s['llm_batch_jobs']} batch jobs, ~{s['llm_prompt_tokens']} prompt and ~{s['llm_output_tokens']} "
             f"output tokens; {s['embed_calls']} embedding calls, {s['embed_batch_jobs']} batch jobs, "
             f"{s['embed_tokens']} tokens",
             f"- estimated cost: ${s['cost_usd']:.4f} (enrichment ${s['llm_cost_usd']:.4f}, embedding "
             f"${s['embed_cost_usd']:.4f}); the cache spares ${s['cost_saved_usd']:.4f}",
             f"- estimated time: {time_line}"]
    if s["causes"]:
        lines += ["", "| why | documents | texts to enrich | texts to embed | cost (USD) |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {c['cause']} | {c['documents']} | {c['texts_enriched']} | {c['texts_embedded']} | "
                  f"{c['cost_usd']:.4f} |" for c in s["causes"]]
    return "\n".join(lines)


@dataclass(frozen=True)
class PlanInfo:
    """Which plan this is, for which index, and where its store keeps the runs it estimates time from."""

    plan_id: str
    store_uri: str
    runs_table: str
    artifact_key: str = "ingest-plan"


@task(name="report plan", cache_policy=NO_CACHE)
def plan_report_stage(info: PlanInfo, documents_path: str, known: pa.Table, extracted: list[str], estimates: list[str],
                      rows: int, texts: dict, usage: dict, notices: list[str]) -> dict:
    """Sum a plan's batches into its summary; post it as the plan artifact and log it."""
    documents = read_artifact(documents_path, DOCUMENTS_SCHEMA)
    done = (pa.concat_tables([read_artifact(p, EXTRACTED_SCHEMA) for p in extracted]) if extracted
            else EXTRACTED_SCHEMA.empty_table())
    per_doc = (pa.concat_tables([read_artifact(p, ESTIMATE_SCHEMA) for p in estimates]) if estimates
               else ESTIMATE_SCHEMA.empty_table())
    runs = open_table(connect(info.store_uri), info.runs_table)
    pace = seconds_per_document(runs.to_arrow() if runs is not None else None)
    summary = summarize_plan(documents, done, held_documents(documents, known), rows, texts, usage, per_doc, pace)
    markdown = plan_markdown(info.plan_id, summary)
    create_markdown_artifact(key=info.artifact_key, markdown=markdown + "".join(f"\n- notice: {n}" for n in notices),
                             description=f"Inlet plan {info.plan_id}: what a run would do and cost")
    create_table_artifact(key=info.artifact_key + "-counts", description=f"Inlet plan {info.plan_id}",
                          table=[{"metric": k, "value": summary[k]} for k in (*PLAN_COUNTS, *RUN_USAGE)])
    logger = get_run_logger()
    logger.info("%s", markdown)
    for notice in notices:
        logger.warning(notice)
    return {"plan_id": info.plan_id, "dry_run": True, **summary, "notices": notices}
