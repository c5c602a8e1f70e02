"""Every error Inlet raises on purpose, in one place."""

from __future__ import annotations


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
# Outside the file's content: "unreadable" (the file vanished or cannot be opened) and "invalid"
# (a data-quality check of severity quarantine failed, see tasks/quality.py).


class ExtractionError(InletError):
    """A document could not be read or partitioned; it is quarantined, the run goes on."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message

    def __reduce__(self) -> tuple:
        """Pickle with both fields, so the error crosses from an extraction worker process intact."""
        return (type(self), (self.reason, self.message))


class StoreError(InletError):
    """The LanceDB store is in a state this run cannot work with."""


class StoreBusyError(StoreError):
    """Another run holds the store's writer lock: this run wrote nothing."""


class EmbedderMismatchError(StoreError):
    """A table was built with another embedder than the one asked for."""


class BatchPendingError(InletError):
    """A Gemini batch job outlived the run's wait; the next run resumes it rather than paying for it again."""


class QueryError(InletError, ValueError):
    """A search was asked for something the store cannot answer (bad mode, version, clearance, index)."""
