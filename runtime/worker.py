"""One warm worker process for a long-lived service, replaced by a warmed spare once its memory has grown.

A process that runs thousands of micro-batches keeps what its libraries' allocators and thread pools keep:
in 180 micro-batches, one process's live heap grew 35 MB while its resident memory grew 250 MB (glibc's
per-thread arenas, Lance's thread pools; bench/README.md, "Live freshness"). No setting of ours bounds
that, so the watcher bounds it the way long-lived servers do (gunicorn's max_requests, Celery's
worker_max_memory_per_child): the work runs in a child process, and once the child has grown past its
settled size by a set amount, a spare is started and warmed beside it and takes over between two requests.

Requests go down the child's stdin, answers come back on a pipe of their own (its descriptor named in
CHANNEL_ENV), pickled, one at a time; before its answer, a request may send events (emit(): log lines, progress)
that the caller's on_event receives as they happen; the child's stdout is the parent's stderr, so nothing a library prints,
even while it is imported, can reach the channel or a parent's own output (`inlet watch --json`). A child whose
parent died (SIGKILL of the watcher) kills itself within a quarter second, once it gets the CPU (at its lower
priority a busy machine may make that seconds): it is part of the watcher, and a restarted watcher must find no
second writer still running.
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from schemas.errors import WorkerDiedError

log = logging.getLogger("inlet.worker")
GUARD_S = 0.25  # how often a child checks that its parent is alive
CHANNEL_ENV = "INLET_WORKER_CHANNEL"  # the descriptor a worker writes its answers to
PARENT_ENV = "INLET_WORKER_PARENT"  # the watcher's pid: read before the worker's imports, which take seconds
NICE_ENV = "INLET_WORKER_NICE"  # added to the worker's nice value before it starts any thread (they inherit it)
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class _Child:
    """One started worker process: its pipes, what it said when ready, and its memory once settled."""

    proc: subprocess.Popen
    answers: IO[bytes]  # the read end of the child's answer pipe
    ready: dict
    calls: int = 0
    settled_mb: float | None = None  # resident memory after the settling calls; growth is measured from here

    def rss_mb(self) -> float:
        """Resident memory now, in MB (0 when it has exited)."""
        try:
            return psutil.Process(self.proc.pid).memory_info().rss / 2**20
        except psutil.Error:
            return 0.0

    def send(self, message: Any) -> None:
        assert self.proc.stdin is not None
        pickle.dump(message, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.flush()

    def receive(self) -> tuple[str, Any]:
        return pickle.load(self.answers)

    def lost(self) -> int:
        """The channel broke: make sure the process is gone, and return its exit code."""
        self.proc.kill()  # a child that broke its channel but lives would otherwise be waited for forever
        code = self.proc.wait()
        self.answers.close()
        return code

    def stop(self, wait_s: float = 30.0) -> None:
        """Ask it to exit after its current request; kill it if it does not."""
        try:
            self.send(None)
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.answers.close()


@dataclass
class WarmWorker:
    """Run requests in a warm child process (module.worker_main(args)); replace it once it has grown.

    settle_calls: requests after which the child's memory counts as settled (models loaded, caches full);
    growth_mb: growth past that at which a spare is started; it takes over at the next request once warm.
    nice: added to the child's nice value (os.nice), so that other processes of the machine go first when both
    want the cores (its own child processes inherit it); 0 leaves it as this process's.
    """

    module: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    growth_mb: float = 128.0
    settle_calls: int = 40
    nice: int = 0
    on_replaced: Callable[[dict], None] = lambda info: None
    current: _Child | None = None
    replaced: int = 0  # workers handed over to a spare
    spares_started: int = 0
    _spare: _Child | None = None  # warm, waiting to take over
    _warming: subprocess.Popen | None = None  # a spare's process while it warms up
    _spare_error: BaseException | None = None
    _spare_thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> dict:
        """Start the worker (if none runs) and wait until it is warm; return what it reported when ready."""
        if self.current is None:
            self.current = self._spawn()
        return self.current.ready

    def pid(self) -> int | None:
        """The running worker's process id."""
        return self.current.proc.pid if self.current is not None else None

    def call(self, request: Any, on_event: Callable[[Any], None] = lambda event: None) -> Any:
        """Run one request in the worker; re-raise its exception; WorkerDiedError if the process died doing it.

        on_event: called with each event the request emits before its answer (in this thread).
        """
        self.hand_over()
        if self.current is None and self._spare_thread is not None:
            self._spare_thread.join()  # the worker died while a spare warmed: that spare takes its place
            self.hand_over()
        child = self.current if self.current is not None else self._first()
        try:
            child.send(request)
            kind, value = child.receive()
            while kind == "event":
                on_event(value)
                kind, value = child.receive()
        except Exception as exc:  # noqa: BLE001 - whatever broke the channel, it cannot be trusted again
            code = child.lost()
            self.current = None
            raise WorkerDiedError(f"the worker process {child.proc.pid} died (exit code {code}) during {request[0]!r}; "
                                  "a new one starts with the next request") from exc
        child.calls += 1
        self._watch_memory(child)
        if kind == "raise":
            raise value
        return value

    def hand_over(self) -> None:
        """Between requests: hand over to a spare that is warm (the old worker exits in the background)."""
        with self._lock:
            spare, error = self._spare, self._spare_error
            if spare is None and error is None:
                return
            self._spare = self._spare_error = None
        assert self._spare_thread is not None
        self._spare_thread.join()
        self._spare_thread = None
        if spare is not None and spare.proc.poll() is not None:
            error = WorkerDiedError(f"it exited (code {spare.lost()}) before taking over")
            spare = None
        if spare is None:
            log.warning("a spare worker failed (%s: %s); the current one goes on", type(error).__name__, error)
            if self.current is not None:
                self.current.settled_mb = self.current.rss_mb()  # try again after as much growth again
            return
        old, self.current = self.current, spare
        if old is None:  # the worker had died meanwhile: the spare simply takes its place
            return
        self.replaced += 1
        info = {"replaced": self.replaced, "calls": old.calls, "settled_mb": round(old.settled_mb or 0.0, 1),
                "rss_mb": round(old.rss_mb(), 1), "pid": spare.proc.pid}
        # Stopped in the background: the request that is waiting does not wait for an interpreter to shut down.
        threading.Thread(target=old.stop, name="inlet-worker-stop", daemon=True).start()
        log.info("worker replaced by a warm spare: %s", info)
        self.on_replaced(info)

    def abort(self, pid: int | None = None) -> None:
        """Kill the worker in the middle of its request (its caller gave up): the waiting call() raises WorkerDiedError.

        pid: only if the worker is still that process (an abort that comes late never reaches the next request's).
        A kill, not a request to stop: the pipeline is built to converge from a kill at any point.
        """
        child = self.current
        if child is not None and (pid is None or child.proc.pid == pid):
            child.proc.kill()

    def close(self) -> None:
        """Stop the worker, and any spare (one still warming up is killed: nothing of it is needed)."""
        with self._lock:
            warming = self._warming
        if warming is not None:
            warming.kill()
        if self._spare_thread is not None:
            self._spare_thread.join()
            self._spare_thread = None
        for child in (self.current, self._spare):
            if child is not None:
                child.stop()
        self.current = self._spare = None

    def _first(self) -> _Child:
        self.current = self._spawn()
        return self.current

    def _watch_memory(self, child: _Child) -> None:
        """Note the settled size after settle_calls; past it by growth_mb, start warming a spare."""
        if child.calls < self.settle_calls:
            return
        rss = child.rss_mb()
        if child.settled_mb is None:
            child.settled_mb = rss
        elif rss > child.settled_mb + self.growth_mb and self._spare_thread is None:
            self.spares_started += 1
            self._spare_thread = threading.Thread(target=self._warm_spare, name="inlet-worker-spare", daemon=True)
            self._spare_thread.start()

    def _warm_spare(self) -> None:
        def warming(proc: subprocess.Popen | None) -> None:
            with self._lock:
                self._warming = proc

        try:
            spare = self._spawn(warming)
        except BaseException as exc:  # noqa: BLE001 - reported at the next request; the current worker goes on
            with self._lock:
                self._spare_error, self._warming = exc, None
            return
        with self._lock:
            self._spare, self._warming = spare, None

    def _spawn(self, started: Callable[[subprocess.Popen], None] = lambda proc: None) -> _Child:
        """Start the worker process and wait for its ready message (or its exception)."""
        read, write = os.pipe()
        # -P and PYTHONPATH: this code's own folder is what the worker imports, whatever the current folder holds.
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, **self.env, CHANNEL_ENV: str(write), PARENT_ENV: str(os.getpid()),
               NICE_ENV: str(self.nice), "PYTHONPATH": path}
        try:
            proc = subprocess.Popen([sys.executable, "-P", "-m", "runtime.worker", self.module, *self.args], env=env,
                                    pass_fds=(write,), stdin=subprocess.PIPE,
                                    stdout=2)  # fd 2: sys.stderr may have no descriptor (pytest)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)  # the child holds it now: its exit is our end of file
        started(proc)
        child = _Child(proc, os.fdopen(read, "rb"), {})
        try:
            kind, value = child.receive()
        except Exception as exc:  # noqa: BLE001 - a broken or closed channel: the process is of no use
            code = child.lost()
            raise WorkerDiedError(f"the worker process ({self.module}) exited with code {code} before it was "
                                  "ready; its output above says why") from exc
        if kind == "raise":
            child.stop()
            raise value
        child.ready = value
        return child


_emit: Callable[[Any], None] | None = None  # set by serve(): sends an event to the caller of the current request


def emit(event: Any) -> None:
    """Send an event (picklable) to the caller of the request being handled; nothing outside a worker."""
    if _emit is not None:
        _emit(event)


def serve(init: Callable[[], dict], handle: Callable[[Any], Any]) -> None:
    """A worker's main loop: init() once (its result is the ready message), then handle() each request."""
    global _emit
    channel_in: IO[bytes] = sys.stdin.buffer
    channel_out = os.fdopen(int(os.environ.pop(CHANNEL_ENV)), "wb")  # popped: the worker's own children lack it
    lock = threading.Lock()  # events may come from the request's threads (Prefect runs tasks in threads)

    def write(data: bytes) -> None:
        with lock:
            channel_out.write(data)
            channel_out.flush()

    def send(kind: str, value: Any) -> None:
        try:
            data = pickle.dumps((kind, value), protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(data)  # some exceptions pickle but do not unpickle (httpx's HTTPStatusError)
        except Exception as exc:  # noqa: BLE001 - such an exception still reaches the parent, as text
            data = pickle.dumps(("raise", RuntimeError(f"{type(value).__name__}: {value} (not picklable: {exc})")))
        write(data)

    def send_event(event: Any) -> None:
        write(pickle.dumps(("event", event), protocol=pickle.HIGHEST_PROTOCOL))  # plain data: tuples of text

    _emit = send_event

    try:
        send("ok", init())
    except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
        send("raise", exc)
        return
    while True:
        try:
            request = pickle.load(channel_in)
        except EOFError:  # the parent closed the channel or died
            return
        if request is None:
            return
        try:
            send("ok", handle(request))
        except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
            send("raise", exc)


def _die_with(parent: int) -> None:
    """Exit this worker at once when its parent is gone (a SIGKILL leaves no one to stop it otherwise)."""
    while os.getppid() == parent:
        time.sleep(GUARD_S)
    os._exit(70)


if __name__ == "__main__":  # python -P -m runtime.worker <module> <args>: what WarmWorker starts
    # Before the worker's own imports (seconds): Ctrl-C reaches the whole process group, and the watcher stops
    # the worker itself after the run in progress; a watcher killed meanwhile must still take its worker along.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if int(os.environ.get(NICE_ENV, "0")) > 0:  # first, so that every thread the imports start inherits it
        os.nice(int(os.environ[NICE_ENV]))
    threading.Thread(target=_die_with, args=(int(os.environ[PARENT_ENV]),), name="inlet-worker-guard",
                     daemon=True).start()
    importlib.import_module(sys.argv[1]).worker_main(sys.argv[2:])
