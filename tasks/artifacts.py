"""Read and write the Parquet artifacts that stages hand to each other."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.arrow import conform

if TYPE_CHECKING:
    from providers.gemini_batch import JobRecord


def write_artifact(table: pa.Table, run_dir: str | Path, name: str, schema: pa.Schema) -> str:
    """Write table as <run_dir>/<name>.parquet after casting it to schema; return the path."""
    path = Path(run_dir) / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(conform(table, schema), path)
    return str(path)


def read_artifact(path: str | Path, schema: pa.Schema) -> pa.Table:
    """Read an artifact and cast it to schema."""
    return conform(pq.read_table(path), schema)


def report_batch_job(key: str) -> Callable[[JobRecord], None]:
    """Return a callback that shows a batch job's state in the run's log and as a Prefect artifact under key."""
    from prefect import get_run_logger
    from prefect.artifacts import create_markdown_artifact

    def report(job: JobRecord) -> None:
        get_run_logger().info("Gemini batch job %s (%s, %d rows): %s", job.name, job.kind, len(job.keys), job.state)
        create_markdown_artifact(key=key, description=f"Gemini Batch Mode {job.kind} job of this run",
                                 markdown="| job | rows | state | submitted |\n|---|---|---|---|\n"
                                          f"| `{job.name}` | {len(job.keys)} | {job.state} | {job.submitted_at} |")

    return report
