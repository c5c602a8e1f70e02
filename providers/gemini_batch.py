"""Gemini Batch Mode: half-price asynchronous jobs whose names are kept on disk, so a crashed run resumes them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from schemas.config import BatchModeConfig
from schemas.errors import BatchPendingError, StoreError

if TYPE_CHECKING:  # the ledger and polling serve every run; google-genai (~0.2 s to import) only Gemini's
    from google import genai
    from google.genai import types

DONE_STATES = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"}


@dataclass
class JobRecord:
    """One submitted job: its name and the cache keys of the rows it carries, in request order."""

    name: str
    kind: str  # enrich
    model: str
    keys: list[str]
    submitted_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    state: str = "JOB_STATE_PENDING"


class JobLedger:
    """Open batch jobs as JSON files in a folder beside the store: written right after submission."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder

    def _path(self, name: str) -> Path:
        return self._folder / f"{name.replace('/', '_')}.json"

    def open_jobs(self, kind: str) -> list[JobRecord]:
        """Return the jobs of a kind that no run has collected yet, oldest first."""
        if not self._folder.is_dir():
            return []
        jobs = [self._read(p) for p in sorted(self._folder.glob("*.json"))]
        return sorted((j for j in jobs if j.kind == kind), key=lambda j: j.submitted_at)

    @staticmethod
    def _read(path: Path) -> JobRecord:
        try:
            return JobRecord(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as exc:
            msg = (f"{path}: unreadable Gemini batch job record ({exc}); it names a job that may still run and be "
                   "billed: look it up with `client.batches.get`, then fix or delete the file")
            raise StoreError(msg) from None

    def save(self, job: JobRecord) -> None:
        """Record a job (atomically: a crash leaves the old record or the new one)."""
        self._folder.mkdir(parents=True, exist_ok=True)
        tmp = self._path(job.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(job)), encoding="utf-8")
        tmp.replace(self._path(job.name))

    def close(self, job: JobRecord) -> None:
        """Forget a job whose results were collected."""
        self._path(job.name).unlink(missing_ok=True)


@dataclass(frozen=True)
class Polling:
    """How long to wait for a job, and how often to look."""

    initial_s: float = 5.0
    max_s: float = 60.0
    max_wait_s: float = 86_400.0


@dataclass
class Outcome:
    """One row of a finished job: its answer, or why there is none."""

    response: types.GenerateContentResponse | None
    error: str | None


def batch_polling(cfg: BatchModeConfig, ledger: JobLedger, kind: str, pending: set[str]) -> Polling | None:
    """Return how to poll when this run should use Batch Mode (asked for, enough rows, or a job to resume), else None."""
    if cfg.mode == "never" or not pending:
        return None
    resumable = any(pending & set(job.keys) for job in ledger.open_jobs(kind))
    if not (cfg.mode == "always" or len(pending) >= cfg.min_rows or resumable):
        return None
    return Polling(cfg.poll_initial_s, cfg.poll_max_s, cfg.max_wait_s)


def wait_for(client: genai.Client, job: JobRecord, ledger: JobLedger, polling: Polling,
             on_state: Callable[[JobRecord], None]) -> types.BatchJob:
    """Poll a job with backoff until it ends; raise BatchPendingError (job kept in the ledger) past max_wait_s."""
    start, delay = time.monotonic(), polling.initial_s
    while True:
        batch = client.batches.get(name=job.name)
        state = batch.state.value if batch.state is not None else "JOB_STATE_UNSPECIFIED"
        if state != job.state:
            job.state = state
            ledger.save(job)
            on_state(job)
        if state in DONE_STATES:
            return batch
        if time.monotonic() - start + delay > polling.max_wait_s:
            msg = (f"Gemini batch job {job.name} is still {state} after {polling.max_wait_s:.0f} s; "
                   "run ingest again to resume it (it will not be submitted twice)")
            raise BatchPendingError(msg)
        time.sleep(delay)
        delay = min(delay * 2, polling.max_s)


def outcomes(batch: types.BatchJob, job: JobRecord) -> dict[str, Outcome]:
    """Map each of the job's keys to its outcome; a key the job did not answer is an error."""
    if batch.state is None or batch.state.value != "JOB_STATE_SUCCEEDED":
        state = batch.state.value if batch.state else "unknown"
        return {k: Outcome(None, f"batch job {job.name} ended {state}") for k in job.keys}
    responses = (batch.dest.inlined_responses if batch.dest else None) or []
    out: dict[str, Outcome] = {}
    for i, item in enumerate(responses):
        # Rows carry their key as metadata; fall back to request order when a server drops it.
        key = (item.metadata or {}).get("key") or (job.keys[i] if i < len(job.keys) else None)
        if key is None:
            continue
        error = f"batch row failed: {item.error.code} {item.error.message}" if item.error else None
        out[key] = Outcome(item.response if not item.error else None, error)
    for key in job.keys:
        out.setdefault(key, Outcome(None, f"batch job {job.name} returned no answer for this row"))
    return out


def submit(client: genai.Client, model: str, kind: str, requests: dict[str, types.InlinedRequest],
           ledger: JobLedger, display_name: str) -> JobRecord:
    """Create one job for the requests and record it before anything else can fail."""
    from google.genai import types

    batch = client.batches.create(model=model, src=list(requests.values()),
                                  config=types.CreateBatchJobConfig(display_name=display_name))
    job = JobRecord(name=batch.name or "", kind=kind, model=model, keys=list(requests),
                    state=batch.state.value if batch.state else "JOB_STATE_PENDING")
    ledger.save(job)
    return job
