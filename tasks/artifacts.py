"""Read and write the Parquet artifacts that stages hand to each other."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.arrow import conform

if TYPE_CHECKING:
    from providers.gemini_batch import JobRecord


def is_remote(path: str | Path) -> bool:
    """Tell a URI (s3://bucket/runs, gs://..., file:///...) from a local path."""
    return "://" in str(path)


def join(base: str | Path, *parts: str) -> str:
    """Join path parts onto a local folder or a URI."""
    if is_remote(base):
        return "/".join([str(base).rstrip("/"), *parts])
    return str(Path(base, *parts))


BATCHES = "batches"  # an index's run folder holds one folder per batch under this name


def batch_dir(index_dir: str, number: int) -> str:
    """Return the folder of one batch's artifacts for one index."""
    return join(index_dir, BATCHES, f"{number:05d}")


def split_batch_dir(folder: str) -> tuple[str, int] | None:
    """Return (index folder, batch number) of a folder made by batch_dir; None for any other folder."""
    index, parent, number = (str(folder).rstrip("/").rsplit("/", 2) + ["", ""])[:3]
    return (index, int(number)) if parent == BATCHES and number.isdigit() else None


def use_storage_options(uri: str | Path, options: dict) -> None:
    """Make options the defaults of the URI's fsspec protocol in this process (credentials, endpoint)."""
    if not is_remote(uri) or not options:
        return
    import fsspec.config

    protocol = str(uri).split("://", 1)[0]
    fsspec.config.conf[protocol] = {**fsspec.config.conf.get(protocol, {}), **options}


def write_bytes(folder: str | Path, name: str, data: bytes) -> str:
    """Write bytes as <folder>/<name> (a local folder or a URI); return the path."""
    path = join(folder, name)
    if is_remote(path):
        import fsspec

        with fsspec.open(path, "wb") as fh:
            fh.write(data)
        return path
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(data)
    return path


def list_names(folder: str | Path) -> list[str]:
    """Names of the files in a folder (a local path or a URI); none when it does not exist."""
    if is_remote(folder):
        import fsspec

        fs, path = fsspec.core.url_to_fs(str(folder))
        fs.invalidate_cache(path)  # another worker may have written since this process last listed it
        try:
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


def write_artifact(table: pa.Table, run_dir: str | Path, name: str, schema: pa.Schema) -> str:
    """Write table as <run_dir>/<name>.parquet after casting it to schema; return the path (or URI)."""
    path = join(run_dir, f"{name}.parquet")
    table = conform(table, schema)
    if is_remote(path):
        import fsspec

        with fsspec.open(path, "wb") as fh:
            pq.write_table(table, fh)
        return path
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def read_artifact(path: str | Path, schema: pa.Schema) -> pa.Table:
    """Read an artifact (a local path or a URI) and cast it to schema."""
    if is_remote(path):
        import fsspec

        with fsspec.open(str(path), "rb") as fh:
            return conform(pq.read_table(fh), schema)
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
