"""Memory between batches: freed pages go back to the system, and start-up objects stay out of the collector's walks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tasks.memory import _malloc_trim

glibc_only = pytest.mark.skipif(_malloc_trim() is None, reason="glibc only: malloc_trim")


@glibc_only
def test_freed_heap_memory_below_a_live_allocation_is_returned_by_release_memory():
    # In a fresh interpreter, so that what the test suite holds does not blur the numbers.
    script = textwrap.dedent("""
        from tasks.memory import release_memory

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


@glibc_only
def test_lean_allocators_cap_the_arenas_and_hand_arrow_the_system_allocator():
    script = textwrap.dedent("""
        import pyarrow as pa
        from tasks.memory import use_lean_allocators

        before = pa.default_memory_pool().backend_name
        took = use_lean_allocators()
        print(before, took, pa.default_memory_pool().backend_name)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    before, took, after = out.stdout.split()
    assert (took, after) == ("True", "system") and before != "system"


def test_what_the_flow_and_gx_imports_made_is_frozen_out_of_full_collections():
    # A full collection walked every module, class and function of Prefect and GX: 0.1-0.2 s with all threads
    # stopped, landing in whatever stage allocated at the time.
    code = ("import gc; import flows.ingest; after_flow = gc.get_freeze_count(); "
            "from tasks.quality import _gx; _gx(); print(after_flow, gc.get_freeze_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    after_flow, after_gx = map(int, out.stdout.split())
    assert after_flow > 0, "the flow module's imports are not frozen"
    assert after_gx > after_flow, "GX's imports are not frozen"
