"""One writer at a time: a second run against the same store is refused (or waits), never interleaved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from schemas.errors import StoreBusyError, StoreError
from store.tables import WRITER_INFO, writer_lock
from tests.gemini_server import Faults, GeminiServer

ROOT = Path(__file__).resolve().parent.parent
HOLD = "from store.tables import writer_lock; import sys, time\nwith writer_lock(sys.argv[1], 'holder-run'):\n" \
       "    print('held', flush=True); time.sleep(float(sys.argv[2]))\n"


def _holder(store: Path, seconds: float) -> subprocess.Popen:
    """Another process holding the store's writer lock for a while."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(store), str(seconds)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def test_a_second_writer_is_refused_naming_the_first_then_waits_if_asked(tmp_path):
    store = tmp_path / "lancedb"
    proc = _holder(store, 2.0)
    with pytest.raises(StoreBusyError, match=r"being written by holder-run \(pid \d+ .*second-run wrote nothing"), \
            writer_lock(store, "second-run"):
        pass
    started = time.monotonic()
    with writer_lock(store, "patient-run", wait_s=30):  # queued behind the holder, then in
        assert time.monotonic() - started > 0.5
    proc.wait(timeout=30)


WATCH_AND_HOLD = ("from store.tables import watcher_lock, writer_lock; import sys, time\n"
                  "with watcher_lock(sys.argv[1]):\n"
                  "    with writer_lock(sys.argv[1], 'watch-micro-batch'):\n"
                  "        print('held', flush=True); time.sleep(float(sys.argv[2]))\n"
                  "    time.sleep(30)\n")


def test_a_scheduled_run_waits_for_a_watchers_micro_batch_instead_of_failing(tmp_path):
    store = tmp_path / "lancedb"
    proc = subprocess.Popen([sys.executable, "-c", WATCH_AND_HOLD, str(store), "1.5"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        started = time.monotonic()
        with writer_lock(store, "scheduled-run"):  # lock_wait_s 0, but the store is watched: it waits its turn
            assert time.monotonic() - started > 0.5
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_killed_writer_leaves_no_lock_behind(tmp_path):
    store = tmp_path / "lancedb"
    proc = _holder(store, 60.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    with writer_lock(store, "next-run"):
        pass


def test_a_second_ingest_is_refused_while_the_first_is_writing(markdown_corpus, write_config, tmp_path,
                                                            prefect_harness):
    # The first ingest embeds through a Gemini-protocol server that holds every answer until the second ingest
    # has been refused: the first is still writing then, however long the second takes to start.
    gate = threading.Event()
    server = GeminiServer(Faults(gate=gate)).start()
    try:
        # A held answer is not a time-out: the client waits as long as the gate may hold it.
        # The lock is the point, not validation: the first run need not load great-expectations (~5 s of CPU).
        config = write_config(markdown_corpus, embedding={"kind": "gemini", "dim": 32, "base_url": server.base_url,
                                                 "timeout_s": 300}, quality={"enabled": False})
        from prefect.settings import PREFECT_API_URL

        # Runs report to the session's Prefect server: no temporary server started and stopped per run.
        env = {**os.environ, "GEMINI_API_KEY": "AIza-test-key-0123", "PREFECT_API_URL": str(PREFECT_API_URL.value())}
        inlet = [sys.executable, "-m", "inlet.cli", "ingest", "--config", str(config)]
        first = subprocess.Popen(inlet, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(tmp_path / "store" / "lancedb" / WRITER_INFO, timeout=120)
        second = subprocess.run(inlet, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
        gate.set()
        assert second.returncode == 2, second.stderr[-2000:]
        assert "is being written by run-" in second.stderr and "wrote nothing" in second.stderr
        out, err = first.communicate(timeout=300)
        assert first.returncode == 0, err[-2000:]
        runs = [p.name for p in (tmp_path / "store" / "runs").iterdir() if p.name.startswith("run-")]
        assert len(runs) == 1 and runs[0] in out, "the refused run left no run folder"
        third = subprocess.run(inlet, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert third.returncode == 0 and "docs unchanged" in third.stdout, third.stderr[-2000:]
    finally:
        gate.set()
        server.stop()


def test_a_store_folder_that_cannot_be_made_is_a_store_error_naming_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match=r"file/lancedb: cannot create the store folder \(store.uri\)"), \
            writer_lock(blocker / "lancedb", "a-run"):
        pass


def test_a_store_on_object_storage_is_refused_by_the_servers_answer_not_a_clock(prefect_harness):
    # The Prefect concurrency limit stands in for flock there; wait_s=0 must mean "busy", never "the API was slow".
    import threading

    uri = "s3://lock-test/lancedb"
    with writer_lock(uri, "holder-run"), \
            pytest.raises(StoreBusyError, match="being written by another run.*second-run wrote nothing"), \
            writer_lock(uri, "second-run"):
        pass
    with writer_lock(uri, "after-release"):  # released on exit: the next run gets in at once
        pass
    held, released = threading.Event(), threading.Event()

    def hold_briefly() -> None:
        with writer_lock(uri, "holder-run"):
            held.set()
            released.wait(30)

    holder = threading.Thread(target=hold_briefly)
    holder.start()
    assert held.wait(60)
    threading.Timer(1.0, released.set).start()
    with writer_lock(uri, "patient-run", wait_s=60):  # queued behind the holder, then in
        assert released.is_set()
    holder.join(30)
