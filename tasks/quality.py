"""Data-quality gates: great-expectations suites over each stage artifact, with a severity per expectation.

A suite is a list of named checks. Each check is one GX Core expectation run by an ephemeral
context over a pandas view of the Arrow artifact; list columns (vectors) are first reduced to scalar
columns (finite, norm, dimension) that GX can judge. A failing check's severity decides what
happens: `quarantine` (the documents of the failing rows are quarantined with the check's name),
`fail` (the run stops before anything is committed) or `warn` (reported only).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from providers import gx
from runtime.artifacts import read_artifact, write_artifact
from runtime.isolate import failing_items, fails_the_run, quarantined_by, without_documents
from schemas.arrow import (
    DOCUMENTS_SCHEMA,
    ELEMENTS_SCHEMA,
    EXTRACTED_SCHEMA,
    WORK,
    embedded_chunks_schema,
)
from schemas.config import ACCESS_LEVELS, QualityConfig
from schemas.errors import INVALID, DataQualityError, DocumentFailure

Severity = Literal["quarantine", "fail", "warn"]


@dataclass(frozen=True)
class Check:
    """One named expectation over an artifact, with what a failure does."""

    name: str
    expectation: str  # a GX Core expectation class, e.g. "ExpectColumnValuesToBeUnique"
    kwargs: dict[str, Any]
    severity: Severity


@dataclass(frozen=True)
class Outcome:
    """How one check went over one artifact."""

    artifact: str
    check: str
    severity: Severity
    success: bool
    failed_rows: tuple[int, ...] = ()
    failed_docs: tuple[str, ...] = field(default=())


def suites(max_tokens: int, dim: int) -> dict[str, list[Check]]:
    """The default suite of each stage artifact (documents, elements, chunks, embedded chunks)."""
    return {
        "documents": [
            Check("doc_id_present", "ExpectColumnValuesToNotBeNull", {"column": "doc_id"}, "fail"),
            Check("doc_id_unique", "ExpectColumnValuesToBeUnique", {"column": "doc_id"}, "fail"),
            Check("access_level_allowed", "ExpectColumnValuesToBeInSet",
                  {"column": "access_level", "value_set": list(ACCESS_LEVELS)}, "quarantine"),
        ],
        "elements": [
            Check("doc_id_present", "ExpectColumnValuesToNotBeNull", {"column": "doc_id"}, "fail"),
            Check("text_not_empty", "ExpectColumnValuesToBeBetween", {"column": "text_length", "min_value": 1},
                  "quarantine"),
            Check("page_at_least_1", "ExpectColumnValuesToBeBetween", {"column": "page", "min_value": 1},
                  "quarantine"),
        ],
        "chunks": [
            Check("chunk_id_present", "ExpectColumnValuesToNotBeNull", {"column": "chunk_id"}, "fail"),
            Check("chunk_id_unique", "ExpectColumnValuesToBeUnique", {"column": "chunk_id"}, "fail"),
            Check("text_not_empty", "ExpectColumnValuesToBeBetween", {"column": "text_length", "min_value": 1},
                  "quarantine"),
            Check("tokens_within_limit", "ExpectColumnValuesToBeBetween",
                  {"column": "token_count", "min_value": 1, "max_value": max_tokens}, "quarantine"),
        ],
        "embedded_chunks": [
            Check("vector_dimension", "ExpectColumnValuesToBeInSet",
                  {"column": "vector_dim", "value_set": [dim]}, "fail"),
            Check("vector_finite", "ExpectColumnValuesToBeInSet", {"column": "vector_finite", "value_set": [True]},
                  "quarantine"),
            Check("vector_not_zero", "ExpectColumnValuesToBeBetween",
                  {"column": "vector_norm", "min_value": 0, "strict_min": True}, "quarantine"),
        ],
    }


# What one GX validation judges: a view of the batch, and the artifacts whose checks run over it.
FRAMES = {"documents": ("documents",), "elements": ("elements",), "chunks+embedded_chunks": ("chunks", "embedded_chunks")}
# The columns of each view: what the checks read, and doc_id, which names the documents of failing rows.
VIEW_COLUMNS = {"documents": ("doc_id", "access_level"), "elements": ("doc_id", "text", "page"),
                "chunks+embedded_chunks": ("chunk_id", "doc_id", "text", "token_count", "vector")}


def with_severities(suite: list[Check], artifact: str, overrides: dict[str, Severity]) -> list[Check]:
    """Apply config overrides keyed '<artifact>.<check>' to a suite's severities."""
    return [Check(c.name, c.expectation, c.kwargs, overrides.get(f"{artifact}.{c.name}", c.severity)) for c in suite]


def scalar_view(table: pa.Table) -> pa.Table:
    """Replace text by its length and a vector by vector_dim, vector_finite and vector_norm: scalars GX judges fast.

    GX hashes and copies every column it is handed; lengths and norms are all the checks need.
    """
    if "text" in table.column_names:
        lengths = pc.utf8_length(table["text"])
        table = table.set_column(table.column_names.index("text"), "text_length", lengths)
    if "vector" not in table.column_names:
        return table
    vectors = table["vector"].combine_chunks()
    if table.num_rows == 0:
        dims, finite, norms = [], [], []
    else:
        dim = vectors.type.list_size
        matrix = vectors.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
        finite_rows = np.isfinite(matrix).all(axis=1)
        dims = [dim] * table.num_rows
        finite = finite_rows.tolist()
        # A non-finite vector has no length: null, so it fails vector_finite alone, not vector_not_zero too.
        norms = [float(n) if ok else None
                 for n, ok in zip(np.linalg.norm(np.where(np.isfinite(matrix), matrix, 0.0), axis=1), finite_rows)]
    out = table.drop_columns(["vector"])
    return (out.append_column("vector_dim", pa.array(dims, pa.int32()))
            .append_column("vector_finite", pa.array(finite, pa.bool_()))
            .append_column("vector_norm", pa.array(norms, pa.float64())))


def validate(artifact: str, table: pa.Table, suite: list[Check]) -> list[Outcome]:
    """Run a suite over an Arrow artifact with GX; return each check's outcome and failing rows."""
    return validate_together(table, {artifact: suite})


def validate_together(table: pa.Table, suite_of: dict[str, list[Check]]) -> list[Outcome]:
    """Run the suites of artifacts that share their rows over one table in one GX validation; return the outcomes.

    Chunks and embedded chunks are the same rows: one validation of both costs one GX set-up, not two
    (~12 ms of a 1% run; bench/README.md). Each outcome names its own artifact.
    """
    tagged = [(artifact, check) for artifact, suite in suite_of.items() for check in suite]
    if table.num_rows == 0 or not tagged:
        return [Outcome(a, c.name, c.severity, True) for a, c in tagged]
    view = scalar_view(table)
    # Only the columns the checks judge: GX hashes every column of the frame, and failing rows are named by
    # their index, which picks their doc_id from the Arrow table below.
    judged = [c.kwargs.get("column") for _, c in tagged]
    if None not in judged:
        view = view.select([name for name in view.column_names if name in judged])
    name = "+".join(suite_of)
    passed, rows_of = gx.check_frame(name, view.to_pandas(),
                                     [(f"{a}.{c.name}", c.expectation, c.kwargs) for a, c in tagged])
    docs = table["doc_id"].to_pylist() if rows_of and "doc_id" in table.column_names else None
    outcomes = []
    for artifact, check in tagged:
        key = f"{artifact}.{check.name}"
        rows = rows_of.get(key, ())
        failed_docs = tuple(sorted({docs[i] for i in rows if docs[i] is not None})) if docs else ()
        outcomes.append(Outcome(artifact, check.name, check.severity, passed[key], rows, failed_docs))
    return outcomes


def gate(outcomes: list[Outcome]) -> dict[str, str]:
    """Apply severities: raise on a failed `fail` check; return {doc_id: reason} for `quarantine` failures."""
    fatal = [o for o in outcomes if not o.success and o.severity == "fail"]
    if fatal:
        detail = "; ".join(f"{o.artifact}.{o.check} ({len(o.failed_rows)} rows)" for o in fatal)
        msg = f"data-quality gate failed, nothing was committed: {detail}"
        raise DataQualityError(msg)
    reasons: dict[str, str] = {}
    for o in outcomes:
        if not o.success and o.severity == "quarantine":
            for doc in o.failed_docs:
                reasons.setdefault(doc, f"validation: {o.artifact}.{o.check}")
    return reasons


def quarantine_invalid(extracted: pa.Table, embedded: pa.Table, reasons: dict[str, str]) -> tuple[pa.Table, pa.Table]:
    """Mark the documents that failed a quarantine check as quarantined and hold back their new chunks."""
    if not reasons:
        return extracted, embedded
    rows = extracted.to_pylist()
    for row in rows:
        if row["doc_id"] in reasons and row["status"] == "ok":
            row.update(status="quarantined", reason=INVALID, message=reasons[row["doc_id"]], stage="validate")
    keep = pc.invert(pc.is_in(embedded["doc_id"], value_set=pa.array(sorted(reasons), pa.string())))
    return pa.Table.from_pylist(rows, schema=extracted.schema), embedded.filter(keep)


def validate_documents(views: dict[str, pa.Table], suite_of: dict[str, dict[str, list[Check]]]
                       ) -> tuple[list[Outcome], list[DocumentFailure]]:
    """Validate every view; if GX raises, find the documents it raises on (halving) and validate the others.

    A validation is one call over the batch, not one per document: only a failure pays for the search.
    """
    def run(keep: Sequence[str] | None) -> list[Outcome]:
        chosen = views if keep is None else {f: t.filter(pc.is_in(t["doc_id"], value_set=pa.array(keep, pa.string())))
                                             for f, t in views.items()}
        return [o for frame, table in chosen.items() for o in validate_together(table, suite_of[frame])]

    try:
        return run(None), []
    except Exception as exc:  # noqa: BLE001 - sorted below into the run's failure or some documents'
        if fails_the_run(exc):
            raise
    ids = sorted({d for t in views.values() for d in t["doc_id"].to_pylist()})
    bad = failing_items(lambda rows: run([ids[r] for r in rows]), range(len(ids)), fails_the_run)
    failures = [DocumentFailure.of(ids[r], "validate", exc) for r, exc in sorted(bad.items())]
    return run([d for r, d in enumerate(ids) if r not in bad]), failures


@dataclass(frozen=True)
class Validated:
    """What the validate stage hands on: the artifacts to commit, the checks' outcomes, GX's start-up seconds."""

    extracted: str  # the extracted artifact, with documents that failed a quarantine check marked
    embedded: str  # the embedded chunks artifact, without their rows
    validation: list[dict]  # one row per artifact and check (outcome_rows)
    setup_seconds: float  # GX's import and context, paid by a process's first validation


def outcome_rows(outcomes: list[Outcome], sizes: dict[str, int]) -> list[dict]:
    """Summarise outcomes for the run report: one row per artifact and check."""
    return [{"artifact": o.artifact, "check": o.check, "severity": o.severity, "rows": sizes.get(o.artifact, 0),
             "failed": len(o.failed_rows), "documents": list(o.failed_docs)} for o in outcomes]


@task(name="validate", cache_policy=NO_CACHE)
def validate_stage(documents_path: str, elements_path: str, extracted_path: str, embedded_path: str,
                   cfg: QualityConfig, max_tokens: int, dim: int, run_dir: str) -> Validated:
    """Validate this run's artifacts before the upsert; quarantine or stop as the checks' severities say."""
    if not cfg.enabled:
        get_run_logger().info("validation is off (quality.enabled: false): nothing checked")
        return Validated(extracted_path, embedded_path, [], 0.0)
    # GX's import and context: paid by a process's first validation, reported apart as start-up, not work.
    start = time.perf_counter()
    gx.context()
    setup_seconds = time.perf_counter() - start
    documents = read_artifact(documents_path, DOCUMENTS_SCHEMA)
    documents = documents.filter(pc.is_in(documents["change"], pa.array(WORK)))
    elements = read_artifact(elements_path, ELEMENTS_SCHEMA)
    extracted = read_artifact(extracted_path, EXTRACTED_SCHEMA)
    schema = embedded_chunks_schema(dim)
    embedded = read_artifact(embedded_path, schema)
    # The chunker keeps to max_tokens; decoding and re-encoding a cut can add a token or two.
    default = suites(max_tokens + 16, dim)
    tables = {"documents": documents, "elements": elements, "chunks+embedded_chunks": embedded}
    views = {frame: table.select(list(VIEW_COLUMNS[frame])) for frame, table in tables.items()}
    suite_of = {frame: {a: with_severities(default[a], a, cfg.severity) for a in FRAMES[frame]} for frame in views}
    outcomes, failures = validate_documents(views, suite_of)
    if failures:  # documents GX raised on: quarantined, their rows out of what is committed
        extracted_path = quarantined_by(failures, extracted_path, run_dir, "validating")
        extracted = read_artifact(extracted_path, EXTRACTED_SCHEMA)
        embedded = without_documents(embedded, [f.doc_id for f in failures])
        views = {frame: without_documents(table, [f.doc_id for f in failures]) for frame, table in views.items()}
    sizes = {a: table.num_rows for frame, table in views.items() for a in FRAMES[frame]}
    summary = outcome_rows(outcomes, sizes)
    reasons = gate(outcomes)  # a failed `fail` check raises here, before anything is committed
    logger = get_run_logger()
    for row in summary:
        if row["failed"]:
            logger.warning("check %s.%s (%s): %d of %d rows failed", row["artifact"], row["check"],
                           row["severity"], row["failed"], row["rows"])
    if not reasons and not failures:  # nothing held back: the artifacts stand as they are
        return Validated(extracted_path, embedded_path, summary, setup_seconds)
    extracted, embedded = quarantine_invalid(extracted, embedded, reasons)
    return Validated(write_artifact(extracted, run_dir, "extracted-validated", EXTRACTED_SCHEMA),
                     write_artifact(embedded, run_dir, "embedded_chunks-validated", schema), summary, setup_seconds)
