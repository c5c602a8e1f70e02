"""The one stopwatch: seconds per named step, summed when a step runs more than once (a stage in each batch)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


class Stopwatch:
    """Seconds per step name, in the order the steps first ran."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        """Count seconds to a step (measured elsewhere, e.g. inside a worker process)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def timing(self, name: str) -> Iterator[None]:
        """Count the block's wall time to the step, also when it raises."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def run(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call fn, counting its wall time to the step; return what it returns."""
        with self.timing(name):
            return fn(*args, **kwargs)

    def rounded(self) -> dict[str, float]:
        """The seconds, to the millisecond."""
        return {name: round(value, 3) for name, value in self.seconds.items()}
