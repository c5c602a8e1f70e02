"""Every error Inlet raises on purpose, in one place."""

from __future__ import annotations

from dataclasses import dataclass


class InletError(Exception):
    """Base for all Inlet errors."""


class ConfigError(InletError, ValueError):
    """The configuration file is missing, malformed or invalid; the message names the file and key."""


class DataContractError(InletError, ValueError):
    """An artifact or table violated its schema."""


class DataQualityError(InletError):
    """A data-quality check of severity `fail` did not hold: the run stops before committing anything."""


# Why a file's content could not be indexed: the fixed vocabulary of quarantine reasons for extraction.
EXTRACTION_REASONS: tuple[str, ...] = (
    "encrypted",  # needs a password (PDFs with an empty user password are opened, not quarantined)
    "no_text",  # a PDF without a text layer (scanned) and OCR off
    "corrupt",  # damaged or truncated: the parser failed or found nothing it could read
    "unsupported",  # a format Inlet has no extractor for (legacy .doc, RTF, images, binaries)
    "empty",  # no text at all, only markup, or not one letter or digit ("...")
    "too_large",  # over extraction.max_file_mb: not read
    "timeout",  # extraction ran past extraction.timeout_s
    "decode_error",  # text whose encoding could not be detected
)
# Anything else one document raised in any per-document stage: a parser's or model's bug, a RecursionError, a
# MemoryError. The document is quarantined with the exception's type and message; the run goes on.
UNEXPECTED = "error"
# Outside the file's content: "unreadable" (the file vanished or cannot be opened) and "invalid": a data-quality
# check of severity quarantine failed (tasks/quality.py, stage validate), or the document declares an access
# level or expiry that is not valid (tasks/access.py, stage extract; its indexed chunks are then withdrawn).
INVALID = "invalid"


class ExtractionError(InletError):
    """A document could not be read or partitioned; it is quarantined, the run goes on."""

    def __init__(self, reason: str, message: str, error_type: str | None = None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.error_type = error_type  # the unexpected exception's type, for reason UNEXPECTED

    def __reduce__(self) -> tuple:
        """Pickle with every field, so the error crosses from an extraction worker process intact."""
        return (type(self), (self.reason, self.message, self.error_type))


def one_line(exc: BaseException, limit: int = 300) -> str:
    """Describe an exception as 'Type: first line of its message', at most limit characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:limit]


def unexpected(exc: BaseException) -> ExtractionError:
    """Turn an exception nobody planned for into the quarantine error of reason UNEXPECTED."""
    return ExtractionError(UNEXPECTED, one_line(exc), type(exc).__name__)


@dataclass(frozen=True)
class DocumentFailure:
    """One document quarantined by a stage after extraction (chunk, enrich, embed, validate)."""

    doc_id: str
    stage: str
    reason: str
    message: str
    error_type: str | None = None

    @classmethod
    def of(cls, doc_id: str, stage: str, exc: BaseException) -> DocumentFailure:
        """The failure of one document that raised exc in stage: reason UNEXPECTED."""
        return cls(doc_id, stage, UNEXPECTED, one_line(exc), type(exc).__name__)


class SystemicFailureError(InletError):
    """Most documents of a run failed the same unexpected way: a broken install, not bad data; nothing was committed."""


class StoreError(InletError):
    """The LanceDB store is in a state this run cannot work with."""


class StoreBusyError(StoreError):
    """Another run holds the store's writer lock: this run wrote nothing."""


class EmbedderMismatchError(StoreError):
    """A table was built with another embedder than the one asked for."""


class BatchPendingError(InletError):
    """A Gemini batch job outlived the run's wait; the next run resumes it rather than paying for it again."""


class CostCeilingError(InletError):
    """A run's plan costs more than run.max_cost_usd: it stopped before any model call and wrote nothing."""


class WorkerDiedError(InletError):
    """The watcher's worker process died (killed, out of memory) before it answered; its run is redone."""


class PrefectServerError(InletError):
    """The temporary Prefect server a command started did not come up: its output says why."""


class PublishHeldError(InletError):
    """A run committed, but the publish gate held its version back: readers keep the published one."""

    def __init__(self, message: str, summary: dict) -> None:
        super().__init__(message)
        self.summary = summary  # the run summary, its "gate" included


class QueryError(InletError, ValueError):
    """A search was asked for something the store cannot answer (bad mode, version, clearance, index)."""


class AnswerTimeoutError(InletError):
    """An answer took longer than serving.timeout_s: the caller is told to retry; the read goes on in its thread."""


class NotAvailableError(QueryError):
    """What was asked for is not there for this caller: missing, expired or above its clearance (never said which)."""
