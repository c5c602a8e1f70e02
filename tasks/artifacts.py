"""Read and write the Parquet artifacts that stages hand to each other."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
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


# Artifacts are read whole, never filtered by row group, so column statistics serve nobody; and Parquet's
# dictionary encoding, tried on every column, made the files no smaller here (ids, texts and vectors rarely
# repeat; snappy takes care of the columns that do). Without both, a 1% run's nine writes took 7.6 ms instead
# of 9.5 and came to 553 KB instead of 594 (bench/README.md); vectors alone were ~3x slower with a dictionary.
PARQUET_OPTIONS = {"use_dictionary": False, "write_statistics": False}


def write_artifact(table: pa.Table, run_dir: str | Path, name: str, schema: pa.Schema) -> str:
    """Write table as <run_dir>/<name>.parquet after casting it to schema; return the path (or URI)."""
    path = join(run_dir, f"{name}.parquet")
    table = conform(table, schema)
    if is_remote(path):
        import fsspec

        with fsspec.open(path, "wb") as fh:
            pq.write_table(table, fh, **PARQUET_OPTIONS)
        return path
    _PENDING.write(path, table)  # its folder is made there too: ~0.1 ms a mkdir, ~20 in a 1% run
    return path


def read_artifact(path: str | Path, schema: pa.Schema) -> pa.Table:
    """Read an artifact (a local path or a URI) and cast it to schema."""
    if is_remote(path):
        import fsspec

        with fsspec.open(str(path), "rb") as fh:
            return conform(pq.read_table(fh), schema)
    table = _PENDING.get(str(path))
    if table is None:
        table = _RECENT.get(str(path))
    return conform(pq.read_table(path) if table is None else table, schema)


def flush_artifacts(*, quiet: bool = False) -> None:
    """Wait until every local artifact this process handed to its writer thread is on disk; raise what failed.

    quiet: on a path that is failing already, wait without raising, so that a write error is neither lost
    over the real one nor left for the next run's flush to raise.
    """
    _PENDING.flush(quiet=quiet)


@contextmanager
def artifacts_flushed() -> Iterator[None]:
    """Every local artifact written in the block on disk when it ends; a failing block waits for them quietly."""
    try:
        yield
    except BaseException:
        flush_artifacts(quiet=True)
        raise
    flush_artifacts()


class _BackgroundWrites:
    """Local artifacts written by one thread beside the stages, which go on with the tables in memory.

    Parquet's encoding runs off the interpreter lock, so a 1% run's ~20 ms of writes overlap the next stage's
    Python work instead of adding to it (bench/README.md). A file is read back from memory until written;
    flush() is called wherever another process may read the files or the run relies on them: at a batch's end,
    before batches go to worker processes, and at the run's end.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[str, pa.Table] = {}
        self._futures: list[tuple[str, pa.Table, Future]] = []
        self._pool: ThreadPoolExecutor | None = None

    def write(self, path: str, table: pa.Table) -> None:
        """Write table at path in the writer thread; until then get(path) returns it."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inlet-artifacts")
            self._tables[path] = table
            self._futures.append((path, table, self._pool.submit(self._write, path, table)))

    def _write(self, path: str, table: pa.Table) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # Written aside, then renamed into place: another process never finds a half-written file under the name.
        partial = f"{path}.partial-{os.getpid()}"
        pq.write_table(table, partial, **PARQUET_OPTIONS)
        os.replace(partial, path)
        _RECENT.keep(path, table)
        # A failed write keeps its table readable until the flush reports it: a stage reading it meanwhile
        # would otherwise fail on a missing file and hide the write's own error.
        self._forget(path, table)

    def _forget(self, path: str, table: pa.Table) -> None:
        with self._lock:
            if self._tables.get(path) is table:
                del self._tables[path]

    def get(self, path: str) -> pa.Table | None:
        """The table handed over for path and not yet on disk (written, or its failure flushed), if any."""
        with self._lock:
            return self._tables.get(path)

    def flush(self, *, quiet: bool = False) -> None:
        """Wait for every write handed over so far; raise the first that failed as a StoreError naming its file."""
        with self._lock:
            futures, self._futures = self._futures, []
        failed = [(path, exc) for path, _, future in futures if (exc := future.exception()) is not None]
        for path, table, _ in futures:
            self._forget(path, table)  # reported now (or dropped, quiet): the failed ones' tables go too
        if failed and not quiet:
            path, exc = failed[0]
            msg = f"{path}: the artifact could not be written ({type(exc).__name__}: {exc})"
            raise StoreError(msg) from exc


_PENDING = _BackgroundWrites()


class _RecentWrites:
    """The small local artifacts this process wrote last, so that the next stage need not parse them back.

    A run's stages hand each other tables through files (a batch may run on another machine); in one
    process, reading back what was just written was ~20 reads of 1-4 ms in a 1% run (bench/README.md).
    An entry counts only while the file's inode, size and modification time are those it was written with,
    so a file rewritten or replaced since is read from disk. Bounded in bytes: large runs gain little here, and
    their memory stays flat.
    """

    def __init__(self, max_bytes: int, max_entry_bytes: int) -> None:
        self.max_bytes, self.max_entry_bytes = max_bytes, max_entry_bytes
        self._entries: OrderedDict[str, tuple[tuple[int, int, int], pa.Table]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # batches in threads write and read at once

    def keep(self, path: str, table: pa.Table) -> None:
        """Remember table as the content of the file just written at path (if small enough)."""
        size = table.nbytes
        with self._lock:
            self._drop(path)
            if size > self.max_entry_bytes:
                return
            self._entries[path] = (_stamp(path), table)
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def get(self, path: str) -> pa.Table | None:
        """The table written at path, if the file is still the one written; else None."""
        with self._lock:
            entry = self._entries.get(path)
            if entry is None:
                return None
            try:
                current = _stamp(path)
            except FileNotFoundError:
                current = None
            if current != entry[0]:
                self._drop(path)
                return None
            self._entries.move_to_end(path)
            return entry[1]

    def _drop(self, path: str) -> None:
        entry = self._entries.pop(path, None)
        if entry is not None:
            self._bytes -= entry[1].nbytes


def _stamp(path: str) -> tuple[int, int, int]:
    stat = os.stat(path)  # the inode too: a file replaced by a rename is another file
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


# 8 MB in all, 2 MB an entry: a 1% run's artifacts are each under 1 MB; a 100k run peaks at 1.4-1.5 of its
# 1.5 GiB bound (bench/README.md), so what is kept here stays small.
_RECENT = _RecentWrites(max_bytes=8 * 1024 * 1024, max_entry_bytes=2 * 1024 * 1024)


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
