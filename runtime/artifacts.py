"""Read and write the Parquet artifacts that stages hand to each other."""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.arrow import conform
from schemas.errors import StoreError

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
    # Written aside, then renamed into place: a process killed mid-write leaves no half file under the name
    # (an object store's put is whole already).
    partial = Path(f"{path}.partial-{os.getpid()}")
    partial.write_bytes(data)
    partial.replace(path)
    return path


def read_bytes(path: str | Path) -> bytes:
    """Read a file (a local path or a URI) whole."""
    if is_remote(path):
        import fsspec

        with fsspec.open(str(path), "rb") as fh:
            return fh.read()
    return Path(path).read_bytes()


def remove(path: str | Path) -> None:
    """Delete a file (a local path or a URI); one already gone is fine."""
    if is_remote(path):
        import fsspec

        fs, inner = fsspec.core.url_to_fs(str(path))
        try:
            fs.rm(inner)
        except FileNotFoundError:
            pass
        return
    Path(path).unlink(missing_ok=True)


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


_RUN_FOLDER = re.compile(r"^(run|plan)-(\d{8}T\d{6})-[0-9a-f]{6}$")  # flows/ingest.py new_run_id


def prune_run_folders(root: str | Path, keep: int) -> list[str]:
    """Delete all but the newest keep run (and plan) folders under root; return the names deleted.

    Only folders named as runs are touched: batch-job ledgers and in-flight markers live beside them.
    """
    runs = sorted((m.group(2), name) for name in list_names(root) if (m := _RUN_FOLDER.match(name)))
    doomed = [name for _, name in runs[:max(0, len(runs) - keep)]]
    for name in doomed:
        path = join(root, name)
        if is_remote(path):
            import fsspec

            fs, inner = fsspec.core.url_to_fs(path)
            fs.rm(inner, recursive=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
    return doomed


# Artifacts are read whole, never filtered by row group, so column statistics serve nobody; and Parquet's
# dictionary encoding, tried on every column, made the files no smaller here (ids, texts and vectors rarely
# repeat; the codec takes care of the columns that do). Without both, a 1% run's nine writes took 7.6 ms instead
# of 9.5 and came to 553 KB instead of 594 (bench/README.md); vectors alone were ~3x slower with a dictionary.
# LZ4, not the default snappy: as fast to write and half the time to read, for files ~4% smaller (a cold bench
# batch's embedded chunks, 3,965 rows: read 9.9 ms against 18.2; its chunks 2.7 against 5.3).
PARQUET_OPTIONS = {"use_dictionary": False, "write_statistics": False, "compression": "lz4"}


def write_artifact(table: pa.Table, run_dir: str | Path, name: str, schema: pa.Schema) -> str:
    """Write table as <run_dir>/<name>.parquet after casting it to schema; return the path (or URI).

    A local file is written aside, then renamed into place: another process never finds it half-written. A
    write that fails (a full disk) raises StoreError naming the file, in the stage that wrote it.
    """
    path = join(run_dir, f"{name}.parquet")
    table = conform(table, schema)
    if is_remote(path):
        import fsspec

        with fsspec.open(path, "wb") as fh:
            pq.write_table(table, fh, **PARQUET_OPTIONS)
        return path
    partial = f"{path}.partial-{os.getpid()}-{threading.get_ident()}"
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, partial, **PARQUET_OPTIONS)
        os.replace(partial, path)
    except OSError as exc:
        Path(partial).unlink(missing_ok=True)
        msg = f"{path}: the artifact could not be written ({type(exc).__name__}: {exc})"
        raise StoreError(msg) from exc
    return path


def read_artifact(path: str | Path, schema: pa.Schema) -> pa.Table:
    """Read an artifact (a local path or a URI) and cast it to schema.

    One file read whole: ParquetFile, not read_table's dataset machinery (~0.5 ms against ~0.85 a file).
    """
    if is_remote(path):
        import fsspec

        with fsspec.open(str(path), "rb") as fh:
            return conform(pq.ParquetFile(fh).read(), schema)
    return conform(pq.ParquetFile(path).read(), schema)


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
