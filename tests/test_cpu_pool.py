"""The CPU pool: parts done by worker processes (by the calling thread when there is none), results in part order."""

from __future__ import annotations

import os
import threading
import time

import pytest

from runtime.cpu import close_cpu_pool, cpu_pool, cpu_rank, map_parts, split_by_size, start_cpu_pool


def _where(part: list[int]) -> tuple[list[int], int]:
    time.sleep(0.05)  # long enough that the workers get their share
    return [n * 2 for n in part], os.getpid()


def test_parts_are_cut_by_size_in_order_and_a_large_item_stands_alone():
    assert split_by_size(list("abcdef"), [1, 1, 1, 5, 1, 1], part_bytes=3) == [["a", "b", "c"], ["d"], ["e", "f"]]
    assert split_by_size([], [], part_bytes=3) == []


def test_without_a_pool_parts_run_in_the_calling_process():
    assert cpu_pool() == (None, 0)
    assert map_parts(_where, [[1], [2]]) == [([2], os.getpid()), ([4], os.getpid())]


@pytest.fixture
def pool():
    start_cpu_pool(2)
    deadline = time.monotonic() + 60
    while cpu_pool()[0] is None:  # it starts in the background; parts meanwhile run in the caller
        assert time.monotonic() < deadline, "the pool did not come up"
        time.sleep(0.05)
    yield
    close_cpu_pool()


@pytest.mark.usefixtures("pool")
def test_parts_go_to_the_workers_only_and_come_back_in_order():
    parts = [[n] for n in range(40)]
    results = map_parts(_where, parts)
    assert [r[0] for r in results] == [[n * 2] for n in range(40)], "results in part order"
    pids = {r[1] for r in results}
    assert os.getpid() not in pids, "the calling thread leaves the parts to the workers (its interpreter lock is busy)"
    assert len(pids) >= 2, "both worker processes took parts"


def _dies_on_13(part: list[tuple[int, int]]) -> list[int]:
    """A worker process dies on 13, as the OOM killer or a crashing C extension would end it (the caller does not)."""
    if any(n == 13 and os.getpid() != caller for n, caller in part):
        os._exit(137)
    time.sleep(0.05)  # long enough that the workers get their share
    return [n * 2 for n, _ in part]


@pytest.mark.usefixtures("pool")
def test_a_worker_that_dies_costs_its_item_only_and_the_pool_is_retired():
    me = os.getpid()
    parts = [[(n, me) for n in range(k, k + 4)] for k in range(0, 80, 4)]  # a worker takes the part with 13
    results = map_parts(_dies_on_13, parts, died=lambda item: [-1], join=lambda rs: [x for r in rs for x in r])
    assert results == [[-1 if n == 13 else n * 2 for n, _ in part] for part in parts], \
        "every other item of the dead worker's part came through"
    assert cpu_pool() == (None, 0), "a broken pool is not offered to later parts"
    assert map_parts(_dies_on_13, [[(1, me)], [(2, me)]]) == [[2], [4]], "later parts run in the calling thread"


def _started(part: list[int]) -> list[float]:
    """When a worker took the part up (wall clock, comparable across processes)."""
    began = time.time()
    time.sleep(0.4)
    return [began] * len(part)


@pytest.mark.usefixtures("pool")
def test_the_earliest_batch_gets_the_workers_first_whatever_came_first():
    """A later batch's parts queued first must not hold the earlier batch's parts back from the workers."""
    starts: dict[str, list[float]] = {}

    def batch(name: str, rank: int, parts: int) -> None:
        with cpu_rank(rank):
            starts[name] = [r[0] for r in map_parts(_started, [[n] for n in range(parts)])]

    later = threading.Thread(target=batch, args=("later", 5, 6))
    later.start()
    time.sleep(0.1)  # its first two parts are on the two workers, four wait
    batch("earlier", 1, 4)
    later.join()
    waiting = sorted(starts["later"])[2:]  # the parts that were still queued when the earlier batch came
    assert max(starts["earlier"]) < min(waiting), "the earlier batch's parts went to the workers first"
