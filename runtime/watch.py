"""Live mode's notices: file-system events routed to the sources they touch, and the set of sources due a run."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("inlet.watch")

Route = Callable[[str], set[str]]  # an event's path -> the names of the sources it may change


class Pending:
    """Sources with changes not yet ingested, why, and the paths events named; threads add, the watch loop takes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[str, str] = {}
        self._paths: dict[str, set[str] | None] = {}  # None: the whole source must be listed
        self._first: float | None = None  # when the oldest unhandled notice came (monotonic)

    def add(self, names: Iterable[str], why: str, paths: dict[str, set[str]] | None = None) -> None:
        """Mark sources due, keeping the first reason each was marked for; paths: what events named, per source.

        A source marked without paths (a reconciliation, a poll, a retry) is listed whole, whatever else is pending.
        """
        with self._cond:
            for name in names:
                self._due.setdefault(name, why)
                named = (paths or {}).get(name)
                if named is None:
                    self._paths[name] = None
                elif self._paths.get(name, set()) is not None:
                    self._paths[name] = self._paths.get(name, set()) | named
            if self._due and self._first is None:
                self._first = time.monotonic()
            self._cond.notify_all()

    def waiting(self) -> bool:
        """Whether any source is due (a change noticed and not yet taken)."""
        with self._cond:
            return bool(self._due)

    def take(self, timeout: float) -> tuple[dict[str, str], float | None, dict[str, set[str] | None]]:
        """Wait up to timeout for due sources; return them with why, the oldest notice's time and their paths; clear."""
        with self._cond:
            if not self._due:
                self._cond.wait(max(timeout, 0.0))
            due, first, paths = self._due, self._first, self._paths
            self._due, self._first, self._paths = {}, None, {}
            return due, first, paths


def follow(roots: list[Path], route: Route, pending: Pending, stop: threading.Event, *, settle_ms: int,
           max_wait_ms: int, on_failure: Callable[[Exception], None]) -> None:
    """Feed settled file-system events under roots into pending until stop is set (watchfiles: inotify & co.).

    watchfiles yields a set of changes once no event came for settle_ms (its step), or max_wait_ms after the
    first under a steady stream (its debounce): a file still being written keeps its set open. If the watch
    fails (too many folders for the OS's watch limit, a root that vanished), on_failure is told and the
    thread ends: the reconciliation crawl keeps the store converging without events.
    """
    import watchfiles

    try:
        for changes in watchfiles.watch(*roots, watch_filter=None, debounce=max_wait_ms, step=settle_ms,
                                        stop_event=stop, rust_timeout=1000, yield_on_timeout=False,
                                        raise_interrupt=False, ignore_permission_denied=True):
            named: dict[str, set[str]] = {}
            for _, path in changes:
                for name in route(path):
                    named.setdefault(name, set()).add(path)
            if named:
                log.debug("events for %s", ", ".join(sorted(named)))
                pending.add(named, "events", named)
    except Exception as exc:  # noqa: BLE001 - any failure of the OS watch ends events, not the watcher
        if not stop.is_set():
            on_failure(exc)


def start_following(roots: list[Path], route: Route, pending: Pending, stop: threading.Event, *, settle_ms: int,
                    max_wait_ms: int, on_failure: Callable[[Exception], None]) -> threading.Thread:
    """Run follow in a daemon thread and return it."""
    thread = threading.Thread(target=follow, name="inlet-watch-events", daemon=True,
                              args=(roots, route, pending, stop),
                              kwargs={"settle_ms": settle_ms, "max_wait_ms": max_wait_ms, "on_failure": on_failure})
    thread.start()
    return thread


class Schedule:
    """Deadlines of live mode's periodic work (reconciliation, polls, maintenance), on the monotonic clock."""

    def __init__(self, now: float) -> None:
        self._next: dict[str, float] = {}
        self._every: dict[str, float] = {}
        self.now = now

    def every(self, name: str, seconds: float, *, first: float | None = None) -> None:
        """Make name due every seconds, first at first (default: one period from now)."""
        self._every[name] = seconds
        self._next[name] = self.now + seconds if first is None else first

    def due(self, now: float) -> list[str]:
        """Return the names whose deadline has passed, and move each to its next deadline."""
        self.now = now
        names = [n for n, t in self._next.items() if t <= now]
        for name in names:
            self._next[name] = now + self._every[name]
        return names

    def reset(self, name: str, now: float) -> None:
        """Start name's period again from now (a reconciliation just ran for another reason)."""
        self._next[name] = now + self._every[name]

    def wait(self, now: float) -> float:
        """Seconds until the nearest deadline (0 if one has passed)."""
        return max(0.0, min(self._next.values(), default=3600.0) - now)
