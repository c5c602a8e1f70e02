"""The extraction workers: processes for non-Markdown documents, each document under a time limit, kept per process.

The work each worker runs (tasks/extract.py's extract_isolated) and its initializer are handed in: this module
knows processes, time limits and deaths, not parsers.
"""

from __future__ import annotations

import atexit
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Any

from runtime.cpu import worker_context
from schemas.config import ExtractionConfig
from schemas.errors import ExtractionError, unexpected


class ExtractionPool:
    """Worker processes for non-Markdown documents, each extraction under extraction.timeout_s.

    A document past its time limit has its worker killed (quarantined as timeout); a worker that
    dies (a parser crash, the OOM killer) costs only its document (corrupt). The run goes on.
    work(doc_id, path, cfg, member, detect, storage_options, in_worker) returns a result or the
    ExtractionError that quarantines the document; initializer runs once in each new worker. preload: modules
    that do the initializer's work in the forkserver, when this pool is made before the forkserver starts, so that a
    worker (and each one that replaces a worker killed at a time limit or by a crash) starts with it done.
    """

    def __init__(self, cfg: ExtractionConfig, work: Callable[..., Any], initializer: Callable[[], Any],
                 preload: tuple[str, ...] = ()) -> None:
        import pebble

        self._cfg, self._work = cfg, work
        self._pool = pebble.ProcessPool(max_workers=cfg.workers, context=worker_context(preload),
                                        initializer=initializer)

    def submit(self, doc_id: str, path: str, detect: bool = False, storage_options: dict | None = None) -> object:
        """Schedule one document; its time limit starts when a worker picks it up."""
        return self._pool.schedule(self._work, args=(doc_id, path, self._cfg, None, detect, storage_options, True),
                                   timeout=self._cfg.timeout_s)

    def result(self, future: Any) -> Any:
        """Wait for one document; raise ExtractionError for a time-out, a dead worker or anything it raised."""
        from pebble import ProcessExpired

        try:
            result = future.result()
        except TimeoutError:
            raise ExtractionError("timeout", f"extraction ran past the {self._cfg.timeout_s:g} s limit") from None
        except ProcessExpired as exc:
            raise ExtractionError("corrupt", f"the parser process died (exit code {exc.exitcode})") from None
        except ExtractionError:
            raise
        except CancelledError:  # the pool was stopped (another extraction config took over): not this document
            raise
        except Exception as exc:  # noqa: BLE001 - whatever came back from the worker is this document's
            raise unexpected(exc) from None
        if isinstance(result, ExtractionError):
            raise result
        return result

    def warm(self, wait: bool = False) -> None:
        """Start the workers now (each runs its initializer) instead of at the first document; wait: until one has."""
        started = self._pool.schedule(_nothing)
        if wait:
            started.result()

    def is_running(self) -> bool:
        """Tell whether the workers still take documents."""
        return bool(self._pool.active)

    def close(self) -> None:
        """Stop the workers."""
        self._pool.stop()
        self._pool.join()


def _nothing() -> None:
    """The task that makes a worker start: it returns once the worker's initializer has run."""


_POOLS: dict[ExtractionConfig, ExtractionPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(cfg: ExtractionConfig, work: Callable[..., Any], initializer: Callable[[], Any],
                preload: tuple[str, ...] = ()) -> ExtractionPool:
    """Return this process's extraction pool for cfg, started on first use and kept for later runs.

    Batches running in threads of one process share it, and so do later runs in the same process
    (tests, notebooks, benchmarks): the workers' start-up, seconds of imports each, is paid once per
    process, not once per run. A pool for another extraction config is stopped when this one starts;
    every pool stops when the process exits. Deployments run each flow run in a process of its own,
    so a served or worker-run flow holds no idle workers between runs.
    """
    with _POOLS_LOCK:
        stale = [_POOLS.pop(kept) for kept in list(_POOLS) if kept != cfg]
        if cfg not in _POOLS:
            _POOLS[cfg] = ExtractionPool(cfg, work, initializer, preload)
        pool = _POOLS[cfg]
    for old in stale:
        old.close()
    return pool


def open_pools() -> dict[ExtractionConfig, ExtractionPool]:
    """This process's running extraction pools, by config."""
    with _POOLS_LOCK:
        return dict(_POOLS)


def close_pools() -> None:
    """Stop every extraction pool of this process (at exit)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


atexit.register(close_pools)  # a no-op in a process that never started a pool


def can_start_workers() -> bool:
    """Tell whether this process may start extraction workers: a daemonic one (a Dask worker by default) may not."""
    return not multiprocessing.current_process().daemon


IN_PROCESS_NOTICE = ("this worker process is daemonic (Dask's default, distributed.worker.daemon): non-Markdown "
                     "documents were extracted in it, without extraction.timeout_s. Start Dask workers with "
                     "--no-nanny or distributed.worker.daemon: false to keep the time limit")
