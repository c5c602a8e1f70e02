"""A worker for tests/test_worker.py: holds memory, raises or dies on request."""

from __future__ import annotations

import os
import signal
import sys

print("printed while the worker is imported: not an answer")  # noqa: T201 - the channel must not see it

from runtime.worker import serve  # noqa: E402 - after the print, on purpose

HELD: list[bytearray] = []


def handle(request: tuple) -> object:
    """("grow", mb) holds mb more; ("raise", text) raises; ("die",) kills this process; ("pid",) its pid."""
    if request[0] == "grow":
        HELD.append(bytearray(os.urandom(16)) * (request[1] << 16))  # touched pages: resident, not just reserved
        return len(HELD)
    if request[0] == "raise":
        raise ValueError(request[1])
    if request[0] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    print("a print must not reach the channel")
    return os.getpid()


if __name__ == "__main__":
    serve(lambda: {"argv": sys.argv[1:], "pid": os.getpid()}, handle)
