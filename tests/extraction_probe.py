"""Run in a fresh process: an extraction pool whose first worker is killed at its time limit, and its replacement.

Prints one JSON line per worker asked: its pid and whether the partitioners were loaded before its initializer
ran (partitioners_ready's cache already held the forkserver's result). The one argument says what came first:
"extraction" (the extraction pool alone), "then-cpu-pool" (a CPU pool made after it, before any worker of either
started, as a run makes them) or "cpu-pool-started" (a CPU pool's worker already running: the forkserver is light).
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from runtime.cpu import worker_context
from runtime.extraction import ExtractionPool
from schemas.config import ExtractionConfig
from schemas.errors import ExtractionError
from tasks.extract import PRELOAD, partitioners_ready


def work(doc_id: str, *_args: object) -> dict:
    """An extraction worker's task: 'stall' outlives any time limit; any other says what the worker had loaded."""
    if doc_id == "stall":
        time.sleep(120)
    info = partitioners_ready.cache_info()
    # The initializer has run once here: a hit means the entry was inherited from the forkserver, a miss it was made.
    return {"pid": os.getpid(), "inherited": info.hits >= 1, "loaded": partitioners_ready() is None}


def main(first: str) -> None:
    cpu = None
    if first == "cpu-pool-started":
        cpu = ProcessPoolExecutor(max_workers=1, mp_context=worker_context())
        cpu.submit(int).result()  # the forkserver starts now, with what was asked until now
    pool = ExtractionPool(ExtractionConfig(timeout_s=3), work, partitioners_ready, PRELOAD)
    if first == "then-cpu-pool":
        cpu = ProcessPoolExecutor(max_workers=1, mp_context=worker_context())  # asks for no partitioners
    try:
        print(json.dumps(pool.result(pool.submit("first", "-"))), flush=True)
        try:
            pool.result(pool.submit("stall", "-"))
        except ExtractionError as exc:
            print(json.dumps({"stalled": exc.reason}), flush=True)
        print(json.dumps(pool.result(pool.submit("after", "-"))), flush=True)
    finally:
        pool.close()
        if cpu is not None:
            cpu.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
