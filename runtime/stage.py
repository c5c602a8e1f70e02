"""The one way stages become Prefect tasks."""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable
from typing import Any


class Stage:
    """A stage function that becomes its Prefect task on first call.

    Modules holding stages then import without Prefect (~1 s): the worker processes of the CPU pool
    (runtime/cpu.py) load them for their pure functions and never run a stage.
    """

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        functools.update_wrapper(self, fn)
        self.name = name
        self.fn = fn
        self._task: Any = None
        self._lock = threading.Lock()

    def task(self) -> Any:
        """Return the Prefect task, made once."""
        with self._lock:
            if self._task is None:
                from prefect import task
                from prefect.cache_policies import NO_CACHE

                self._task = task(name=self.name, cache_policy=NO_CACHE)(self.fn)
            return self._task

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the stage as a Prefect task (inside a flow or task run; plainly outside one)."""
        return self.task()(*(opaque_value(a) for a in args), **{k: opaque_value(v) for k, v in kwargs.items()})

    def __reduce__(self) -> tuple:
        """Pickle as a reference to the module attribute, as functions are (Dask ships the batch task by value)."""
        return (_stage_named, (self.fn.__module__, self.fn.__qualname__))


_SCALARS = (str, bytes, int, float, bool, type(None))


def opaque_value(value: Any) -> Any:
    """Wrap a task argument in Prefect's opaque: its dependency on the task that returned it is kept, unwalked.

    Prefect otherwise walks every argument, three times a call, looking for futures and results of other
    tasks inside it. Stages are handed configs, tables and lists of paths, never a future: a stage call with
    a config took 9.1 ms walked and 4.4 ms unwalked (bench/README.md, 2026-11-24 morning).
    """
    if isinstance(value, _SCALARS):
        return value
    from prefect.utilities.annotations import opaque

    return opaque(value)


def _stage_named(module: str, name: str) -> Stage:
    return getattr(importlib.import_module(module), name)


def stage(name: str) -> Callable[[Callable[..., Any]], Stage]:
    """Wrap a stage function as a Prefect task with a readable name.

    No Prefect result cache: LanceDB and the content-keyed model caches decide what is redone,
    and hashing the inputs (tables among them) on every call would be wasted work.
    """
    return lambda fn: Stage(fn, name)
