"""The watcher's warm worker process: requests, errors, a death, and replacement by a spare once it has grown."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from runtime.worker import WarmWorker
from schemas.errors import WorkerDiedError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def worker():
    started = WarmWorker("tests.grow_worker", ["hello"], growth_mb=32, settle_calls=2)
    yield started
    started.close()


def test_a_worker_answers_requests_in_its_own_process_and_its_exceptions_reach_the_caller(worker):
    assert worker.start() == {"argv": ["hello"], "pid": worker.pid()}
    assert worker.call(("pid",)) == worker.pid(), "a print in the worker did not corrupt the channel"
    with pytest.raises(ValueError, match="bad request"):
        worker.call(("raise", "bad request"))
    assert worker.call(("pid",)) == worker.pid(), "an exception leaves the worker serving"
    with pytest.raises(RuntimeError, match="TwoPartError: status 503: the API is down"):
        worker.call(("raise-two",))  # pickles, but would not unpickle here: it comes as text
    assert worker.call(("pid",)) == worker.pid(), "and the channel still works"


def test_a_killed_parent_takes_its_busy_worker_along_and_the_workers_prints_never_reach_the_parents_stdout():
    parent = ("from runtime.worker import WarmWorker\n"
              "w = WarmWorker('tests.grow_worker', [])\n"
              "w.start()\n"
              "print(w.pid(), flush=True)\n"
              "w.call(('sleep', 120))\n")
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    worker = psutil.Process(int(proc.stdout.readline()))
    time.sleep(1.0)  # the worker is inside its two-minute request
    proc.kill()
    proc.wait()
    gone, alive = psutil.wait_procs([worker], timeout=10)
    assert alive == [], "it noticed its parent was gone, mid-request (stdin says nothing until it asks), and exited"
    out, err = proc.communicate(10)  # the worker held the parent's stderr until it exited
    assert out == "" and "printed while the worker is imported" in err


def test_a_worker_that_dies_mid_request_is_reported_and_a_new_one_serves_the_next(worker):
    worker.start()
    first = worker.pid()
    with pytest.raises(WorkerDiedError, match="died"):
        worker.call(("die",))
    assert worker.call(("pid",)) not in (first, None)


def test_a_worker_grown_past_its_settled_size_hands_over_to_a_warm_spare_between_requests(worker):
    replaced: list[dict] = []
    worker.on_replaced = replaced.append
    worker.start()
    first = worker.pid()
    worker.call(("grow", 1))
    worker.call(("grow", 1))  # settled after two requests
    assert worker.call(("grow", 8)) and worker.spares_started == 0, "within the allowed growth: no spare"
    worker.call(("grow", 48))  # past it: a spare starts warming
    deadline = time.monotonic() + 60
    while worker.replaced == 0 and time.monotonic() < deadline:
        worker.call(("pid",))
        time.sleep(0.2)
    assert worker.replaced == 1 and worker.pid() != first
    assert worker.call(("pid",)) == worker.pid()
    assert replaced[0]["calls"] >= 4 and replaced[0]["rss_mb"] > replaced[0]["settled_mb"] + 32


def _task_nice_values(pid: int) -> set[int]:
    """The nice value of each thread of a process (Linux: field 19 of /proc/PID/task/TID/stat)."""
    values = set()
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        values.add(int(fields[16]))
    return values


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread nice values from Linux's /proc")
def test_a_worker_started_nicer_runs_every_thread_at_that_priority():
    base = os.nice(0)
    nicer = WarmWorker("tests.grow_worker", [], nice=5)
    plain = WarmWorker("tests.grow_worker", [])
    try:
        nicer.start()
        plain.start()
        assert _task_nice_values(nicer.pid()) == {min(base + 5, 19)}, "its guard thread, started after, inherits it"
        assert _task_nice_values(plain.pid()) == {base}
        assert nicer.call(("pid",)) == nicer.pid(), "and it serves as any worker"
    finally:
        nicer.close()
        plain.close()
