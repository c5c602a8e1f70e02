"""Hand freed memory back to the operating system between batches, so a long run's RSS follows its live data."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc

import pyarrow as pa

_M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)
LEAN_ARENAS = 2


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


def use_lean_allocators() -> bool:
    """Cap glibc's malloc arenas at two and give Arrow the system allocator; return whether the cap took.

    A run's threads (batches, LanceDB's runtime) each keep a malloc arena and Arrow's mimalloc keeps its
    own segments: freed memory stays in them. On 30,000 documents this lowered the peak from 1,717 to
    1,309 MB (bench/README.md). Process-wide, so set from the flow (execution.lean_memory), where Inlet
    owns the process; arenas made before the call keep their pages.
    """
    libc = _libc()
    arenas = libc is not None and hasattr(libc, "mallopt") and libc.mallopt(_M_ARENA_MAX, LEAN_ARENAS) == 1
    pa.set_memory_pool(pa.system_memory_pool())
    return arenas


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:
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


def freeze_imports() -> None:
    """Move every object alive now to the garbage collector's permanent generation; call right after imports.

    Modules, classes and functions live as long as the process, yet each full collection walked them all:
    with Prefect and GX loaded one took 0.1-0.2 s with every thread stopped, in whichever stage happened to
    allocate then (a 1% run's validate went from 0.05 to 0.25 s when a change elsewhere moved one there;
    bench/README.md). Frozen, they are not walked again. What the imports left as garbage (tens of objects)
    stays with them.
    """
    gc.freeze()
