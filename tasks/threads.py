"""Two pieces of work at once: one in a helper thread, one in the caller's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

A = TypeVar("A")
H = TypeVar("H")


def beside(aside: Callable[[], A], here: Callable[[], H]) -> tuple[A, H]:
    """Run aside in a helper thread while here runs in this one; return both results, raising what aside raised.

    For work that spends its time off the interpreter lock (LanceDB, Parquet, a server's answer) beside work
    that does not; two pieces of Python work gain nothing.
    """
    done: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            done.append((True, aside()))
        except BaseException as exc:  # noqa: BLE001 - raised again in the calling thread below
            done.append((False, exc))

    helper = threading.Thread(target=run, name="inlet-beside", daemon=True)
    helper.start()
    try:
        mine = here()
    finally:
        helper.join()
    ok, theirs = done[0]
    if not ok:
        raise theirs  # type: ignore[misc]
    return theirs, mine  # type: ignore[return-value]
