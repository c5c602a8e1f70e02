"""The CPU pool: parts shared between worker processes and the calling thread, results in part order."""

from __future__ import annotations

import os
import time

import pytest

from tasks.cpu import close_cpu_pool, cpu_pool, map_parts, split_by_size, start_cpu_pool


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
def test_parts_go_to_the_workers_and_the_caller_and_come_back_in_order():
    parts = [[n] for n in range(40)]
    results = map_parts(_where, parts)
    assert [r[0] for r in results] == [[n * 2] for n in range(40)], "results in part order"
    pids = {r[1] for r in results}
    assert os.getpid() in pids, "the calling thread took parts while the workers started"
    assert len(pids - {os.getpid()}) >= 1, "worker processes took parts too"
