"""The one way stages become Prefect tasks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE


def stage(name: str) -> Callable[[Callable[..., Any]], Any]:
    """Wrap a stage function as a Prefect task with a readable name.

    No Prefect result cache: LanceDB and the content-keyed model caches decide what is redone,
    and hashing the inputs (tables among them) on every call would be wasted work.
    """
    return task(name=name, cache_policy=NO_CACHE)
