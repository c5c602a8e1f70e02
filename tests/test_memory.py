"""Memory between batches: freed pages go back to the system, and start-up objects stay out of the collector's walks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from runtime.memory import _malloc_trim

glibc_only = pytest.mark.skipif(_malloc_trim() is None, reason="glibc only: malloc_trim")


ARENAS = textwrap.dedent("""
    import ctypes, sys, threading
    from runtime.memory import limit_malloc_arenas

    print(limit_malloc_arenas(2) if sys.argv[1] == "capped" else None, flush=True)
    ready, go = threading.Barrier(9), threading.Event()
    held = []

    def allocate():
        ready.wait()  # all alive at once: each would take an arena of its own
        held.append([b"x" * 200_000 for _ in range(20)])
        go.wait()

    threads = [threading.Thread(target=allocate) for _ in range(8)]
    for t in threads:
        t.start()
    ready.wait()
    while len(held) < 8:
        pass
    ctypes.CDLL(None).malloc_stats()  # one "Arena n:" block per arena, on stderr
    go.set()
""")


@glibc_only
def test_a_watcher_caps_malloc_arenas_so_its_threads_share_two():
    def arenas(mode: str, **env: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, check=True,
                             env={k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env)
        return out.stdout.strip(), out.stderr.count("Arena ")

    assert arenas("capped") == ("True", 2)
    assert arenas("free")[1] > 2, "without the cap, eight allocating threads take arenas of their own"
    assert arenas("capped", MALLOC_ARENA_MAX="4")[0] == "False", "the operator's MALLOC_ARENA_MAX wins"


@glibc_only
def test_freed_heap_memory_below_a_live_allocation_is_returned_by_release_memory():
    # In a fresh interpreter, so that what the test suite holds does not blur the numbers.
    script = textwrap.dedent("""
        from runtime.memory import release_memory

        def anon_mb():
            with open("/proc/self/status") as fh:
                return next(int(line.split()[1]) for line in fh if line.startswith("RssAnon")) // 1024

        blobs = [b"x" * 100_000 for _ in range(2_000)]  # 200 MB in malloc's heap, pages touched
        pin = b"y" * 100_000  # above them: glibc trims only the heap's top by itself
        del blobs
        before = anon_mb()
        release_memory()
        print(before, anon_mb())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    before, after = map(int, out.stdout.split())
    assert before - after > 150, f"RssAnon {before} MB -> {after} MB"
