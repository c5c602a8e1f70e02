"""Types the providers share: what an enricher takes and gives, and its usage; no provider imports another back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class EnrichInput:
    """What an enricher sees of one chunk."""

    text: str
    title: str | None
    heading_path: tuple[str, ...]


@dataclass
class Usage:
    """Model calls and tokens of an enricher, summed over its life (a run takes differences)."""

    calls: int = 0  # requests sent, retries included
    retries: int = 0
    malformed: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    batch_jobs: int = 0  # Batch Mode jobs collected
    batch_requests: int = 0  # rows answered through Batch Mode (billed at the batch discount)
    batch_prompt_tokens: int = 0  # the part of the token counts above that Batch Mode served
    batch_output_tokens: int = 0
    batch_cached_tokens: int = 0
    errors: list[str] = field(default_factory=list)


@runtime_checkable
class Enricher(Protocol):
    """Turns chunks into enrichment texts, one per chunk."""

    fingerprint: str  # kind, model, prompt version, parameters: part of every enrichment cache key

    def enrich(self, items: list[EnrichInput], documents: list[str | None] | None = None) -> list[str | None]:
        """Return one enrichment text per item; None where it failed (the chunk is indexed without one)."""
        ...
