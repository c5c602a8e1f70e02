"""Worker processes for a batch's pure CPU work (Markdown extraction, chunking) beside the thread runner.

Batches in threads share one interpreter lock, so Python-heavy work (cleaning Markdown, detecting
languages, packing chunks) would not run in parallel. The flow starts this pool in the background
when the thread runner has that kind of work; once its workers are up, each batch cuts the work into
parts and hands them to it, and waits. Results come
back in part order: a run's tables are the same with the pool or without it. With the process or
Dask runner, batches already run in processes of their own and do this work themselves.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.context
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, TypeVar

from schemas.config import ExecutionConfig

T = TypeVar("T")
R = TypeVar("R")

PART_BYTES = 256 * 1024  # text per part: enough to outweigh a round trip, small enough to share out evenly
MIN_BYTES = 2 * 1024 * 1024  # less in-process work than this in a run: no pool, its start-up would not pay

_POOL: ProcessPoolExecutor | None = None
_WORKERS = 0
_STARTER: threading.Thread | None = None
_LOCK = threading.Lock()
_PRELOAD = ["tasks.preload"]  # what this process's forkserver loads, when it starts (worker_context)
_PRELOAD_LOCK = threading.Lock()


def worker_context(preload: Sequence[str] = ()) -> multiprocessing.context.BaseContext:
    """The forkserver every worker process of a run is forked from (this pool's and the extraction pool's).

    Forking the run's own process is not safe: Prefect's threads may hold locks at the moment of the
    fork. The server is a fresh interpreter that loads tasks.preload once; the workers fork from it.
    preload: more modules for it to load, asked by the pool whose workers need them. A process has one
    forkserver: it starts with every module asked for until then (the list only grows, so the order in
    which the pools are made does not matter); a pool made after it started gets the server as it is, and
    its workers load what it lacks themselves, as their initializer says.
    """
    with _PRELOAD_LOCK:
        _PRELOAD.extend(name for name in preload if name not in _PRELOAD)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(_PRELOAD))
    return ctx


def worth_a_pool(work_bytes: int) -> bool:
    """Tell whether a run with this many bytes of documents to process should start the pool."""
    return work_bytes >= MIN_BYTES


def default_workers() -> int:
    """Worker processes when execution.cpu_workers is not set: one per core, at most four."""
    return max(1, min(os.cpu_count() or 1, 4))


def start_cpu_pool(workers: int) -> None:
    """Start this process's pool in the background (no-op when one runs or starts already, or workers is 0).

    Starting waits for the forkserver's preload (about half a second): a thread does it, and the pool
    is offered to the batches only once its workers are up; until then they do all the work themselves.
    """
    global _STARTER
    with _LOCK:
        if _POOL is not None or _STARTER is not None or workers <= 0:
            return
        _STARTER = threading.Thread(target=_start, args=(workers,), name="inlet-cpu-pool", daemon=True)
        _STARTER.start()


def _start(workers: int) -> None:
    global _POOL, _WORKERS
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=worker_context())
    try:
        for future in [pool.submit(int) for _ in range(workers)]:  # one task each: every worker starts now
            future.result()
    except Exception as exc:  # noqa: BLE001 - no pool is a slower run, not a failed one: the batches do the work
        logging.getLogger(__name__).warning("the CPU pool did not start (%s: %s); batches do its work themselves",
                                            type(exc).__name__, exc)
        pool.shutdown(wait=False, cancel_futures=True)
        return
    with _LOCK:
        _POOL, _WORKERS = pool, workers


def cpu_pool() -> tuple[ProcessPoolExecutor | None, int]:
    """Return this process's pool and its worker count, (None, 0) when none is up."""
    return _POOL, _WORKERS


def close_cpu_pool() -> None:
    """Stop the pool (the run's end), waiting for one still starting."""
    global _POOL, _WORKERS, _STARTER
    starter = _STARTER
    if starter is not None:
        starter.join()
    with _LOCK:
        pool, _POOL, _WORKERS, _STARTER = _POOL, None, 0, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def cpu_pool_for(execution: ExecutionConfig, work_bytes: int) -> Iterator[None]:
    """Run the block with this process's pool starting (thread runner, enough work), stopped after it."""
    if execution.task_runner == "thread" and worth_a_pool(work_bytes):  # batches in this process share it
        start_cpu_pool(default_workers() if execution.cpu_workers is None else execution.cpu_workers)
    try:
        yield
    finally:
        close_cpu_pool()


def split_by_size(items: Sequence[T], sizes: Sequence[int], part_bytes: int | None = None) -> list[list[T]]:
    """Cut items into consecutive parts of about part_bytes each (an item larger than that is a part alone)."""
    limit = PART_BYTES if part_bytes is None else part_bytes
    parts: list[list[T]] = []
    current: list[T] = []
    size = 0
    for item, n in zip(items, sizes):
        if current and size + n > limit:
            parts.append(current)
            current, size = [], 0
        current.append(item)
        size += n
    if current:
        parts.append(current)
    return parts


def _retire(pool: ProcessPoolExecutor) -> None:
    """Drop a pool one of whose workers died: the run's later parts run in the batches' threads."""
    global _POOL, _WORKERS
    with _LOCK:
        if _POOL is pool:
            _POOL, _WORKERS = None, 0
    pool.shutdown(wait=False, cancel_futures=True)


def _alone(fn: Callable[[list[T]], R], item: T, died: Callable[[T], R]) -> R:
    """Run fn over one item in a process of its own; died(item) if that process dies too."""
    with ProcessPoolExecutor(max_workers=1, mp_context=worker_context()) as one:
        try:
            return one.submit(fn, [item]).result()
        except BrokenProcessPool:
            return died(item)


def map_parts(fn: Callable[[list[T]], R], parts: Sequence[list[T]], *, died: Callable[[T], R] | None = None,
              join: Callable[[list[R]], R] | None = None) -> list[R]:
    """Apply fn to every part, on the pool when there is one and more than one part; results in part order.

    The pool gets at most one part per worker at a time from this call, and the calling thread waits: the run's
    process is bound by its interpreter lock (the other batches' embedding, validation and commits need it), so
    a part done there slowed them more than it gained. A cold bench run took 11.5 s waiting, 12.4 s taking parts
    from the end (bench/README.md). Without a pool, or once it is retired, the calling thread does every part.
    A worker that dies (the OOM killer, a crash in a C extension) breaks the pool: with died and join, the
    pool is retired, the parts it held are done again item by item, each in a process of its own, and an
    item whose process dies again gets died(item); join puts a part's item results back together.
    """
    pool, workers = cpu_pool()
    if pool is None or len(parts) < 2:
        return [fn(p) for p in parts]
    results: list[Any] = [None] * len(parts)
    pending = deque(range(len(parts)))
    running: dict[Future, int] = {}
    lost: list[int] = []
    while pending or running:
        while pool is not None and pending and len(running) < workers:
            i = pending.popleft()
            try:
                running[pool.submit(fn, parts[i])] = i
            except (BrokenProcessPool, RuntimeError):  # broken, or retired by another batch's thread meanwhile
                if died is None or join is None:
                    raise
                pending.appendleft(i)  # not lost: it never reached a worker, the caller takes it
                _retire(pool)
                pool = None
        if pending and pool is None:
            i = pending.pop()
            results[i] = fn(parts[i])
            finished = [f for f in running if f.done()]
        else:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in finished:
            i = running.pop(future)
            try:
                results[i] = future.result()
            except BrokenProcessPool:
                if died is None or join is None:
                    raise
                lost.append(i)
                if pool is not None:
                    _retire(pool)
                    pool = None
    for i in lost:  # which item killed the worker is unknown: each alone finds it, the others come through
        results[i] = join([_alone(fn, item, died) for item in parts[i]])
    return results
