"""Hand freed memory back to the operating system between batches, so a long run's RSS follows its live data."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable

import pyarrow as pa


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library: the symbols already loaded into this process, else the one find_library names.

    find_library runs `ldconfig -p` in a subprocess (~5 ms of every run's body); the process's own
    symbols hold libc's wherever it is linked dynamically (glibc, musl).
    """
    loaded = ctypes.CDLL(None)
    if hasattr(loaded, "malloc"):
        return loaded
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None under another C library (musl, macOS), which has no such call."""
    libc = _libc()
    return getattr(libc, "malloc_trim", None) if libc is not None else None


def release_memory() -> None:
    """Return the free pages of glibc's malloc arenas and of Arrow's memory pool to the system.

    Measured on 30,000 documents (bench/README.md): the run's live memory stays flat from batch to
    batch, but the allocators keep what each batch freed (glibc per thread, Arrow's mimalloc in its
    own segments), and RSS grew by ~8 MB a batch. Both calls cost milliseconds; a batch takes seconds.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    pa.default_memory_pool().release_unused()


_M_ARENA_MAX = -8  # mallopt's parameter number for the arena cap (glibc's malloc.h)


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas for a long-lived process (MALLOC_ARENA_MAX, if set, wins); True if capped.

    glibc gives each allocating thread an arena (up to 8 per core), and an arena never returns the pages
    under its high-water mark: LanceDB's I/O threads (150 in a watcher at 1 change/s) spread their
    temporary buffers over all of them, so a long-lived process's RSS steps up to the sum of every
    arena's peak. Lance's issue 7242 describes the same with repeated merge_insert. Call it before the
    threads start; it does nothing under another C library.
    """
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    libc = _libc()
    if libc is None or not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, arenas))
