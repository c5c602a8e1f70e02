"""One document never fails a run: per-document boundaries for the stages, and the run's systemic-failure breaker.

Parsers and models are untrusted code. Whatever one document makes them raise quarantines that document
(reason "error", the exception's type and first line), and the run goes on. The boundary is the document, not a
list of exception types: only a failure of the run itself (a provider outage after its retries, a store in a
state the run cannot use) passes through, and so does the breaker's verdict when most documents fail alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from runtime.artifacts import read_artifact, write_artifact
from schemas.arrow import EXTRACTED_SCHEMA
from schemas.errors import UNEXPECTED, DocumentFailure, ExtractionError, InletError, SystemicFailureError

T = TypeVar("T")
R = TypeVar("R")


def fails_the_run(exc: BaseException) -> bool:
    """Tell whether exc is a failure of the run, not of one document: Inlet's own errors other than a document's."""
    return isinstance(exc, InletError) and not isinstance(exc, ExtractionError)


def model_fails_run(exc: BaseException) -> bool:
    """Tell whether a model call's exception fails the run (an outage, providers/gemini_retry.py) or one input."""
    if fails_the_run(exc):
        return True
    from providers.gemini_retry import is_outage  # here: google-genai loads only for a run that meets an error

    return is_outage(exc)


def each_document(fn: Callable[[T], R], items: Iterable[tuple[str, T]], stage: str,
                  fatal: Callable[[BaseException], bool] = fails_the_run) -> tuple[list[R], list[DocumentFailure]]:
    """Apply fn to each (doc_id, item); an item that raises is its document's failure, not the caller's."""
    results: list[R] = []
    failures: list[DocumentFailure] = []
    for doc_id, item in items:
        try:
            results.append(fn(item))
        except Exception as exc:  # noqa: BLE001 - the boundary is the document: any exception is its own
            if fatal(exc):
                raise
            failures.append(DocumentFailure.of(doc_id, stage, exc))
    return results, failures


def failing_items(call: Callable[[Sequence[int]], None], indexes: Sequence[int],
                  fatal: Callable[[BaseException], bool]) -> dict[int, BaseException]:
    """Run call over indexes at once; if it raises, halve and retry until the items that raise alone are found.

    call stores its own results. A fatal exception (an outage, not one input's fault) is raised at once.
    Costs one call when nothing fails, and about 2 log2(n) more per failing item.
    """
    try:
        call(indexes)
    except Exception as exc:  # noqa: BLE001 - sorted below into the run's failure or an input's
        if fatal(exc):
            raise
        if len(indexes) == 1:
            return {indexes[0]: exc}
        middle = len(indexes) // 2
        return {**failing_items(call, indexes[:middle], fatal), **failing_items(call, indexes[middle:], fatal)}
    return {}


def rejected_documents(doc_ids: Sequence[str], keys: Sequence[str | None], rejected: dict[str, BaseException],
                       stage: str) -> list[DocumentFailure]:
    """The failures of the documents whose rows carry a key a model raised on (one key may serve several). Pure."""
    failures: dict[str, DocumentFailure] = {}
    for doc_id, key in zip(doc_ids, keys):
        if key in rejected and doc_id not in failures:
            failures[doc_id] = DocumentFailure.of(doc_id, stage, rejected[key])
    return list(failures.values())


def without_documents(table: pa.Table, doc_ids: Iterable[str]) -> pa.Table:
    """Drop the rows of the given documents. Pure."""
    ids = sorted(set(doc_ids))
    if not ids or table.num_rows == 0:
        return table
    return table.filter(pc.invert(pc.is_in(table["doc_id"], value_set=pa.array(ids, pa.string()))))


def quarantine_failed(extracted: pa.Table, failures: Sequence[DocumentFailure]) -> pa.Table:
    """Mark the failed documents quarantined in the extracted table (the first failure of each wins). Pure."""
    if not failures:
        return extracted
    first: dict[str, DocumentFailure] = {}
    for f in failures:
        first.setdefault(f.doc_id, f)
    rows = extracted.to_pylist()
    for row in rows:
        f = first.get(row["doc_id"])
        if f is not None and row["status"] == "ok":
            row.update(status="quarantined", reason=f.reason, message=f.message, stage=f.stage,
                       error_type=f.error_type)
    return pa.Table.from_pylist(rows, schema=extracted.schema)


def quarantined_by(failures: Sequence[DocumentFailure], extracted_path: str, run_dir: str, name: str) -> str:
    """Write the extracted table with the failed documents quarantined (as extracted-<name>); return its path.

    The stage's thin shell: no failure, no new artifact. Logs each one to the stage's run.
    """
    if not failures:
        return extracted_path
    from prefect import get_run_logger  # here: the CPU pool's workers import this module without Prefect

    logger = get_run_logger()
    for f in failures:
        logger.warning("quarantined %s: %s in %s: %s", f.doc_id, f.reason, f.stage, f.message)
    extracted = quarantine_failed(read_artifact(extracted_path, EXTRACTED_SCHEMA), failures)
    return write_artifact(extracted, run_dir, f"extracted-{name}", EXTRACTED_SCHEMA)


def unexpected_errors(extracted: pa.Table) -> list[tuple[str, str, str]]:
    """Return (doc_id, exception type, message) of each document quarantined for an unexpected error. Pure."""
    failed = extracted.filter(pc.fill_null(pc.equal(extracted["reason"], UNEXPECTED), False))
    return [(r["doc_id"], r["error_type"] or "Exception", r["message"] or "")
            for r in failed.select(["doc_id", "error_type", "message"]).to_pylist()]


@dataclass
class Breaker:
    """Stops a run in which most attempted documents failed with the same unexpected exception type.

    A share of documents failing alike is a broken install or a model that cannot load, not bad data:
    quarantining them all would silently empty the index over the next runs. Known reasons (encrypted,
    no_text, ...) are never counted. The verdict is the whole run's; undecided() tells the writer to hold
    its commits while later batches could still trip it.
    """

    attempted: int  # documents the run has work for
    share: float = 0.5
    min_docs: int = 20
    seen: int = 0  # documents of the batches observed so far
    by_type: dict[str, set[str]] = field(default_factory=dict)
    example: dict[str, tuple[str, str]] = field(default_factory=dict)  # type -> (doc_id, message)

    def observe(self, documents: int, errors: Iterable[tuple[str, str, str]]) -> None:
        """Count a finished batch: its number of documents and its (doc_id, type, message) unexpected errors."""
        self.seen += documents
        for doc_id, kind, message in errors:
            self.by_type.setdefault(kind, set()).add(doc_id)
            self.example.setdefault(kind, (doc_id, message))

    def _trips(self, count: int) -> bool:
        return count > self.share * self.attempted and count >= self.min_docs

    def undecided(self) -> bool:
        """Tell whether the batches still to come could trip the breaker (commits wait until they cannot)."""
        left = max(self.attempted - self.seen, 0)
        worst = max((len(d) for d in self.by_type.values()), default=0)
        return left > 0 and self._trips(worst + left)

    def check(self) -> None:
        """Raise SystemicFailureError when one exception type has hit more than the share of the run's documents."""
        if not self.by_type:
            return
        kind = max(self.by_type, key=lambda k: len(self.by_type[k]))
        count = len(self.by_type[kind])
        if self._trips(count):
            doc_id, message = self.example[kind]
            msg = (f"{count} of {self.attempted} documents failed with {kind} (over {self.share:.0%}): a systemic "
                   f"failure (a missing library, a broken install, a model that cannot load), not bad documents. "
                   f"Nothing was committed, quarantined or deleted. Example: {doc_id}: {message}")
            raise SystemicFailureError(msg)
