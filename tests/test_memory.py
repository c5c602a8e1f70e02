"""Memory between batches: freed pages go back to the system, and start-up objects stay out of the collector's walks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from runtime.memory import _malloc_trim

glibc_only = pytest.mark.skipif(_malloc_trim() is None, reason="glibc only: malloc_trim")


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
