"""Worker processes for a batch's pure CPU work (Markdown extraction, chunking) beside the thread runner.

Batches in threads share one interpreter lock, so Python-heavy work (cleaning Markdown, detecting
languages, packing chunks) would not run in parallel. The flow starts this pool in the background
when the thread runner has that kind of work; once its workers are up, each batch cuts the work into
parts and hands them to it, and waits. Results come
back in part order: a run's tables are the same with the pool or without it. With the process or
Dask runner, batches already run in processes of their own and do this work themselves.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import multiprocessing
import multiprocessing.context
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
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
    with _TURN:  # callers waiting for a turn take their queued parts back
        _TURN.notify_all()


def _alone(fn: Callable[[list[T]], R], item: T, died: Callable[[T], R]) -> R:
    """Run fn over one item in a process of its own; died(item) if that process dies too."""
    with ProcessPoolExecutor(max_workers=1, mp_context=worker_context()) as one:
        try:
            return one.submit(fn, [item]).result()
        except BrokenProcessPool:
            return died(item)


# The pool's queue, shared by every batch of the run: parts wait here in order of their batch's rank, then of arrival,
# and go to the pool only while a worker is free. The earliest batch's extraction and chunking so finish first, and
# it reaches the model (in the run's process) as early as it can while the workers go on with the next batch's
# parts; in arrival order two batches shared the workers and reached the model late, one after the other (a cold
# bench run: 5.25 s against 4.99, bench/README.md).
_RANK: contextvars.ContextVar[int] = contextvars.ContextVar("inlet_cpu_rank", default=0)
_TURN = threading.Condition()  # guards _QUEUE and _BUSY; notified whenever a part ends or the pool is retired
_QUEUE: list[_Part] = []  # a heap
_BUSY = 0  # parts on the pool's workers now
_ARRIVAL = itertools.count()


@dataclass(order=True)
class _Part:
    """One part waiting for, or given to, the pool."""

    rank: int
    arrival: int
    fn: Callable[[Any], Any] = field(compare=False)
    items: Any = field(compare=False)
    future: Future | None = field(default=None, compare=False)  # set once it went to the pool
    pool: ProcessPoolExecutor | None = field(default=None, compare=False)  # the pool it went to
    taken_back: bool = field(default=False, compare=False)  # never reached a worker: its caller does it


@contextmanager
def cpu_rank(rank: int) -> Iterator[None]:
    """Give the parts that this thread sends to the pool in the block this rank: a lower rank goes first."""
    token = _RANK.set(rank)
    try:
        yield
    finally:
        _RANK.reset(token)


def _ended(_: Future) -> None:
    """A part left its worker (done, failed or cancelled): free its place and wake the waiting callers."""
    global _BUSY
    with _TURN:
        _BUSY -= 1
        _TURN.notify_all()


def _hand_out(pool: ProcessPoolExecutor, workers: int) -> None:
    """Send queued parts, lowest rank first, to the pool while it has a free worker (the caller holds _TURN)."""
    global _BUSY
    while _QUEUE and _BUSY < workers:
        part = heapq.heappop(_QUEUE)
        try:
            future = pool.submit(part.fn, part.items)
        except (BrokenProcessPool, RuntimeError):  # broken, or retired by another batch's thread meanwhile
            part.taken_back = True  # its caller does it; the others take theirs back once the pool is retired
            _retire(pool)
            return
        part.future, part.pool = future, pool
        _BUSY += 1
        future.add_done_callback(_ended)


def _take_back(mine: list[_Part]) -> None:
    """Mark the caller's parts still queued as taken back, out of the queue (the caller holds _TURN)."""
    for part in mine:
        if part.future is None:
            part.taken_back = True
    _QUEUE[:] = [p for p in _QUEUE if not p.taken_back]
    heapq.heapify(_QUEUE)


def map_parts(fn: Callable[[list[T]], R], parts: Sequence[list[T]], *, died: Callable[[T], R] | None = None,
              join: Callable[[list[R]], R] | None = None) -> list[R]:
    """Apply fn to every part, on the pool when there is one and more than one part; results in part order.

    Parts queue for the pool's workers by their batch's rank (cpu_rank), and the calling thread waits: the run's
    process is bound by its interpreter lock (the other batches' embedding, validation and commits need it), so
    a part done there slowed them more than it gained. A cold bench run took 11.5 s waiting, 12.4 s taking parts
    from the end (bench/README.md). Without a pool, or once it is retired, the calling thread does every part.
    A worker that dies (the OOM killer, a crash in a C extension) breaks the pool: with died and join, the
    pool is retired, the parts it held are done again item by item, each in a process of its own, and an
    item whose process dies again gets died(item); join puts a part's item results back together.
    """
    if cpu_pool()[0] is None or len(parts) < 2:
        return [fn(p) for p in parts]
    rank = _RANK.get()
    mine = [_Part(rank, next(_ARRIVAL), fn, p) for p in parts]
    results: list[Any] = [None] * len(parts)
    lost: list[int] = []
    with _TURN:
        for part in mine:
            heapq.heappush(_QUEUE, part)
    try:
        _await(mine, results, lost, recover=died is not None and join is not None)
    finally:  # also when it raised: no part of this call stays queued for the others to hand out
        with _TURN:
            _take_back(mine)
    if died is not None and join is not None:  # lost is empty otherwise
        for i in lost:  # which item killed the worker is unknown: each alone finds it, the others come through
            results[i] = join([_alone(fn, item, died) for item in parts[i]])
    return results


def _await(mine: list[_Part], results: list[Any], lost: list[int], *, recover: bool) -> None:
    """Hand out queued parts while workers are free and collect this call's results; a dead worker's part goes to lost.

    A part that never reached a worker is done in this thread. recover False: a dead worker's part raises instead.
    """
    left = set(range(len(mine)))
    while left:
        with _TURN:
            pool, workers = cpu_pool()
            if pool is None:
                _take_back(mine)
            else:
                _hand_out(pool, workers)
            ready = [i for i in left if mine[i].taken_back or (mine[i].future is not None and mine[i].future.done())]
            if not ready:
                _TURN.wait(timeout=1.0)  # woken when a part ends or the pool is retired; the timeout only re-checks
                continue
        for i in sorted(ready):  # outside the lock: the other callers go on handing out parts
            left.discard(i)
            part = mine[i]
            if part.taken_back:
                results[i] = part.fn(part.items)
                continue
            try:
                results[i] = part.future.result()
            except CancelledError:  # queued in a pool retired before a worker took it: never ran
                results[i] = part.fn(part.items)
            except BrokenProcessPool:
                if part.pool is not None:
                    _retire(part.pool)
                if not recover:
                    raise
                lost.append(i)
