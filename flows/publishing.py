"""What readers get: the publish gate a run must pass, publishing a held run by hand, and rolling back to a run."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import lancedb
import pyarrow as pa
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.datasets import load_questions_csv
from query.gate import GateResult, judge, question_recalls
from schemas.arrow import PUBLISHED_TAG, RUN_COUNTS, RUN_USAGE, RUNS_SCHEMA
from schemas.config import InletConfig
from schemas.errors import ConfigError, StoreError
from store.commit import publish
from store.tables import connect, ensure_columns, open_table, tagged_version, writer_lock


def gate_questions(path: Path, origin: str = "config") -> list[tuple[str, dict[str, int]]]:
    """The gate's questions with their gold documents; a question without gold is left out (it measures nothing)."""
    if not path.is_file():
        msg = f"{origin}: publish.gate.questions: {path} is not a file"
        raise ConfigError(msg)
    data = load_questions_csv(path)
    questions = [(data.queries[q], data.qrels[q]) for q in data.queries if data.qrels.get(q)]
    if not questions:
        msg = f"{path}: no question has a gold document (publish.gate.questions)"
        raise ConfigError(msg)
    return questions


def gate_markdown(result: GateResult, run_id: str) -> str:
    """The gate's verdict for the Prefect artifact: the figures, why, and the questions the run lost."""
    lines = [f"## Publish gate: {result.status} ({run_id}, version {result.version})", "", result.reason]
    if result.status == "held":
        lines += ["", f"Readers keep version {result.baseline_version}. `inlet publish {run_id}` publishes this run "
                  "anyway; `inlet rollback` drops it."]
    if result.lost:
        lines += ["", f"### Questions whose gold left the top results ({len(result.lost)})", "",
                  "| question | gold |", "|---|---|"]
        lines += [f"| {q['question'].replace('|', '/')} | {q['gold'].replace('|', '/')} |" for q in result.lost]
    return "\n".join(lines)


@task(name="gate", cache_policy=NO_CACHE)
def gate_stage(cfg: InletConfig, run_id: str, artifact_key: str = "ingest-publish-gate") -> GateResult:
    """Measure the run's new version against the published one on the gate's questions; publish it if it passes."""
    gate = cfg.publish.gate
    if gate is None:
        msg = "gate_stage needs publish.gate"
        raise ConfigError(msg)
    questions = gate_questions(gate.questions)
    table = open_table(connect(cfg.store.uri), cfg.store.chunks_table)
    version, baseline = tagged_version(table, run_id), tagged_version(table, PUBLISHED_TAG)
    new = question_recalls(cfg, questions, version, gate.k, gate.mode)
    old = question_recalls(cfg, questions, baseline, gate.k, gate.mode) if baseline is not None else None
    result = judge(questions, new, old, gate, version, baseline)
    if result.status == "passed":
        publish(table, run_id)  # under the run's writer lock: the run's version is the table's latest
    create_markdown_artifact(key=artifact_key, markdown=gate_markdown(result, run_id),
                             description=f"Inlet run {run_id}: publish gate")
    logger = get_run_logger()
    (logger.info if result.status == "passed" else logger.warning)("publish gate %s: %s", result.status,
                                                                   result.reason)
    return result


def held_message(run_id: str, gates: dict[str, dict]) -> str:
    """Why a run's readers did not move: each held index's reason and lost questions."""
    parts = []
    for index, gate in gates.items():
        lost = "; ".join(q["question"] for q in gate["lost"][:5])
        parts.append(f"{index}: {gate['reason']}" + (f"; lost: {lost}" if lost else ""))
    kept = next(iter(gates.values()))["baseline_version"]
    readers = (f"readers keep version {kept}" if kept is not None
               else "no version was published before it: readers see the table's latest")
    return (f"run {run_id} was not published ({readers}): " + " | ".join(parts) +
            f". `inlet publish {run_id}` publishes it anyway")


PUBLISHED_EVENT = "inlet.store.published"  # automations and other deployments trigger on it
MAX_IDS = 100  # document ids an event names, per kind; the counts are always whole


def store_resource(cfg: InletConfig) -> dict[str, str]:
    """The Prefect event resource naming a store: the same id for its runs' publishes and its watcher's notices."""
    digest = hashlib.sha256(str(cfg.store.uri).encode()).hexdigest()[:12]
    return {"prefect.resource.id": f"inlet.store.{digest}", "prefect.resource.name": str(cfg.store.uri)}


def announce(cfg: InletConfig, how: str, run_id: str, version: int | None, changed: list[str] | None = None,
             deleted: list[str] | None = None) -> None:
    """Tell dependent systems that readers now see a new version: emit PUBLISHED_EVENT (run, version, documents).

    how: run (an ingest run published), publish (a held run published by hand) or rollback. Emitted after the
    published tag moved, so a consumer that reads on the event sees the version it names.
    """
    from prefect.events import emit_event

    changed, deleted = changed or [], deleted or []
    emit_event(event=PUBLISHED_EVENT, resource={**store_resource(cfg), "inlet.table": cfg.store.chunks_table},
               payload={"how": how, "run_id": run_id, "version": version, "documents_changed": len(changed),
                        "documents_deleted": len(deleted), "changed": changed[:MAX_IDS], "deleted": deleted[:MAX_IDS],
                        "truncated": len(changed) > MAX_IDS or len(deleted) > MAX_IDS})


def now_tag(kind: str) -> str:
    """A tag for a hand-made version, such as rollback-20261126T170000."""
    return f"{kind}-{datetime.now(UTC):%Y%m%dT%H%M%S}"


def _each_index(cfg: InletConfig) -> list[InletConfig]:
    """The main index's config and each variant's, whose tables a run tags alike."""
    return [vcfg for _, vcfg in cfg.all_variants()]


def publish_run(cfg: InletConfig, run_id: str) -> dict[str, int]:
    """Move readers to the version a run tagged (a run the gate held), in every index it tagged; under the lock."""
    moved: dict[str, int] = {}
    with writer_lock(cfg.store.uri, f"publish-{run_id}", cfg.store.lock_wait_s):
        db = connect(cfg.store.uri)
        for vcfg in _each_index(cfg):
            table = open_table(db, vcfg.store.chunks_table)
            version = tagged_version(table, run_id) if table is not None else None
            if version is None:
                continue
            move_published(table, version)
            moved[vcfg.store.chunks_table] = version
            runs = open_table(db, vcfg.store.runs_table)
            if runs is not None:
                ensure_columns(runs, RUNS_SCHEMA)
                runs.update(where=f"run_id = '{run_id}'", values={"gate": "published by hand"})
    if not moved:
        msg = f"no chunks table has a version tagged '{run_id}': `inlet versions` lists the runs"
        raise StoreError(msg)
    announce(cfg, "publish", run_id, moved.get(cfg.store.chunks_table))
    return moved


def move_published(table: lancedb.table.Table, version: int) -> None:
    """Point readers at a version of the table (the published tag)."""
    if tagged_version(table, PUBLISHED_TAG) is None:
        table.tags.create(PUBLISHED_TAG, version)
    else:
        table.tags.update(PUBLISHED_TAG, version)


def run_versions(runs: pa.Table, target: str) -> tuple[str, int, int | None]:
    """The run a rollback target names (a run id, or a chunks version a run tagged), its chunks version, and the
    documents version as it stood after it (a run that wrote no documents left the one before it)."""
    rows = sorted(runs.select(["run_id", "started_at", "status", "versions"]).to_pylist(),
                  key=lambda r: r["started_at"])
    documents: int | None = None
    found = None
    for row in rows:
        versions = json.loads(row["versions"] or "{}")
        documents = versions.get("documents", documents)
        chunks = versions.get("chunks")
        if row["run_id"] == target or (target.isdigit() and chunks == int(target)):
            found = (row["run_id"], chunks, documents)
    if found is None or found[1] is None:
        msg = (f"'{target}' is neither a run id nor a chunks version a run tagged: `inlet versions` lists them")
        raise StoreError(msg)
    return found


def rollback(cfg: InletConfig, target: str) -> dict[str, dict[str, int]]:
    """Make each index's chunks and documents tables what they were after a run, as new versions readers see.

    Under the writer lock (refused while a run writes). Order, for crash safety: the documents table first, then
    the chunks table, then the published tag. Killed between the first two, readers still see the published
    chunks, and the documents table's older hashes make the next ingest redo the documents that changed since:
    the store converges either way. The model cache is left alone: that next ingest pays only for what it lacks.
    """
    done: dict[str, dict[str, int]] = {}
    tag = now_tag("rollback")
    with writer_lock(cfg.store.uri, tag, cfg.store.lock_wait_s):
        db = connect(cfg.store.uri)
        for vcfg in _each_index(cfg):
            store = vcfg.store
            runs, chunks = open_table(db, store.runs_table), open_table(db, store.chunks_table)
            if runs is None or chunks is None:
                continue
            run_id, chunks_version, documents_version = run_versions(runs.to_arrow(), target)
            documents = open_table(db, store.documents_table)
            if documents is not None and documents_version is not None:
                documents.restore(documents_version)
            chunks.restore(chunks_version)
            chunks.tags.create(tag, chunks.version)
            move_published(chunks, chunks.version)
            versions = {store.chunks_table: chunks.version}
            if documents is not None:
                versions[store.documents_table] = documents.version
            record_rollback(runs, tag, run_id, versions, chunks_version, documents_version)
            done[store.chunks_table] = {"run": run_id, "restored": chunks_version, "version": chunks.version}
    if not done:
        msg = f"no index has runs to roll back to in {cfg.store.uri}"
        raise StoreError(msg)
    main = done.get(cfg.store.chunks_table)
    if main is not None:
        announce(cfg, "rollback", tag, main["version"])
    return done


def record_rollback(runs: lancedb.table.Table, tag: str, run_id: str, versions: dict[str, int], chunks_version: int,
                    documents_version: int | None) -> None:
    """Add the rollback to the runs table, as a row of its own: `inlet versions` shows it with its tag."""
    now = datetime.now(UTC)
    ensure_columns(runs, RUNS_SCHEMA)
    row = {"run_id": tag, "started_at": now, "finished_at": now, "status": "rollback", "config_fp": "",
           **dict.fromkeys(RUN_COUNTS, 0), **{k: 0.0 if k.endswith("_usd") else 0 for k in RUN_USAGE},
           "stage_seconds": "{}", "versions": json.dumps(versions),
           "notices": [f"rolled back to {run_id}: chunks version {chunks_version}, documents version "
                       f"{documents_version}"]}
    runs.add(pa.Table.from_pylist([row], schema=RUNS_SCHEMA))
