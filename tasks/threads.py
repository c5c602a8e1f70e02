"""Two pieces of work at once: one in a helper thread, one in the caller's."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

A = TypeVar("A")
H = TypeVar("H")


def beside(aside: Callable[[], A], here: Callable[[], H]) -> tuple[A, H]:
    """Run aside in a helper thread while here runs in this one; return both results, raising what aside raised.

    For work that spends its time off the interpreter lock (LanceDB, Parquet, a server's answer) beside work
    that does not; two pieces of Python work gain nothing. Both have ended when it returns or raises.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="inlet-beside") as helper:
        theirs = helper.submit(aside)
        mine = here()
        return theirs.result(), mine
