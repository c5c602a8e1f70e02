"""Progress of long stages: a Prefect progress artifact per stage, and a terminal bar while a CLI shows them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress

_bars: Progress | None = None  # set by terminal_bars(): the CLI's ingest shows one bar per stage
_ARTIFACT_EVERY_S = 2.0  # at most one progress update to the API this often (and at the end)

Advance = Callable[[int], None]
# Inside a batch the stages stay quiet: the run shows one "batches" bar and artifact, not one per stage and batch.
_quiet: ContextVar[bool] = ContextVar("inlet_quiet_progress", default=False)


@contextmanager
def quiet_stages() -> Iterator[None]:
    """Silence stage_progress while the block runs (a batch's stages)."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)


def new_bars() -> Progress:
    """The terminal's progress display (stderr): one bar per long stage."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(TextColumn("{task.description:<10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=False)


@contextmanager
def terminal_bars() -> Iterator[None]:
    """Show a progress bar per long stage on the terminal (stderr) while the block runs."""
    global _bars
    with new_bars() as bars:
        _bars = bars
        try:
            yield
        finally:
            _bars = None


class _ForwardedBars:
    """The two calls stage_progress makes on a rich Progress, sent elsewhere (the warm process's caller draws them)."""

    def __init__(self, send: Callable[[tuple], None]) -> None:
        self._send, self._next = send, 0

    def add_task(self, description: str, total: int) -> int:
        self._next += 1
        self._send(("bar", self._next, description, total, 0))
        return self._next

    def update(self, task: int, completed: int) -> None:
        self._send(("bar", task, None, None, completed))


@contextmanager
def forwarded_bars(send: Callable[[tuple], None]) -> Iterator[None]:
    """While the block runs, send each stage's bar as ("bar", id, description, total, completed) events."""
    global _bars
    _bars = _ForwardedBars(send)  # type: ignore[assignment] - the part of Progress that stage_progress uses
    try:
        yield
    finally:
        _bars = None


class BarsFromEvents:
    """Draw on a terminal the bars that forwarded_bars() sent (the command's side of a hand-over)."""

    def __init__(self, bars: Progress) -> None:
        self._bars, self._tasks = bars, {}

    def show(self, event: tuple) -> None:
        """Apply one ("bar", id, description, total, completed) event."""
        _, task, description, total, completed = event
        if task not in self._tasks:
            self._tasks[task] = self._bars.add_task(description or "", total=total)
        self._bars.update(self._tasks[task], completed=completed)


def _in_a_run() -> bool:
    """Tell whether a Prefect flow or task run is current (artifacts have a run to belong to)."""
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _artifact(stage: str, total: int) -> Callable[[float], None]:
    """Create the stage's progress artifact; return its updater."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    artifact_id = create_progress_artifact(0.0, key=f"ingest-progress-{stage}",
                                           description=f"{stage}: {total} items")
    return lambda percent: update_progress_artifact(artifact_id, percent)


@contextmanager
def stage_progress(stage: str, total: int) -> Iterator[Advance]:
    """Yield advance(n) for a stage over total items: it moves the stage's Prefect progress artifact and bar.

    The artifact is made once the stage has run _ARTIFACT_EVERY_S with items still to do: a stage done
    sooner, or all at once (a run of one batch), has no progress to watch, and its two API calls (~36 ms,
    bench/README.md) were ~5% of a small run's time.
    """
    if total <= 0 or _quiet.get():
        yield lambda n: None
        return
    in_run = _in_a_run()
    update: Callable[[float], None] | None = None
    bar = _bars.add_task(stage, total=total) if _bars is not None else None
    done, last = 0, time.monotonic()

    def advance(n: int) -> None:
        nonlocal done, last, update
        done += n
        if bar is not None:
            _bars.update(bar, completed=done)
        due = time.monotonic() - last >= _ARTIFACT_EVERY_S
        if in_run and ((due and (update is not None or done < total)) or (update is not None and done >= total)):
            update = update or _artifact(stage, total)
            update(min(100.0, 100.0 * done / total))
            last = time.monotonic()

    yield advance
    if update is not None and done < total:  # items skipped (cached, quarantined early): the stage is done
        update(100.0)
    if bar is not None:
        _bars.update(bar, completed=total)
