"""A worker for tests/test_worker.py: holds memory, sleeps, raises or dies on request."""

from __future__ import annotations

import os
import signal
import time

print("printed while the worker is imported: not an answer")  # noqa: T201 - the channel must not see it

from runtime.worker import emit, serve  # noqa: E402 - after the print, on purpose

HELD: list[bytearray] = []


class TwoPartError(Exception):
    """An exception that pickles but does not unpickle (its __init__ wants two arguments), as httpx's do."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")


def handle(request: tuple) -> object:
    """("grow", mb) holds mb more; ("raise", text), ("raise-two",) raise; ("sleep", s); ("events", n); ("die",)."""
    if request[0] == "grow":
        HELD.append(bytearray(os.urandom(16)) * (request[1] << 16))  # touched pages: resident, not just reserved
        return len(HELD)
    if request[0] == "raise":
        raise ValueError(request[1])
    if request[0] == "raise-two":
        raise TwoPartError("status 503", "the API is down")
    if request[0] == "sleep":
        time.sleep(request[1])
    if request[0] == "ingest":  # as a run does: names its flow run, then works for request[1] seconds
        emit(("run", "run-1"))
        time.sleep(request[1])
    if request[0] == "events":  # emits request[1] events, numbered, before its answer
        for i in range(request[1]):
            emit(("event", i))
    if request[0] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    print("a print must not reach the channel")
    return os.getpid()


def worker_main(args: list[str]) -> None:
    """Serve requests; ready says the arguments and the pid."""
    serve(lambda: {"argv": args, "pid": os.getpid()}, handle)
