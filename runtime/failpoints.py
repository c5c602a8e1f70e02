"""Named crash points: the crash tests kill a real run with SIGKILL at a stage boundary or inside a commit.

INLET_FAILPOINT=<name> kills the process the first time the run passes <name>; <name>@<n> at the n-th
time (the second batch, the second commit group). Unset, failpoint() is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

ENV = "INLET_FAILPOINT"
POINTS = (
    "crawled",             # listing written, nothing detected
    "detected",            # documents classified, no batch started
    "batch-extracted",     # a batch's elements and extracted artifacts written
    "batch-chunked",
    "enrich-cached",       # inside enrichment: one call's answers appended to the model cache, later calls not made
    "batch-enriched",
    "embed-cached",        # inside embedding: one call's vectors appended to the model cache
    "batch-embedded",
    "batch-validated",     # a batch finished, not yet handed to the writer
    "extractions-committed",  # inside a commit group: kept extractions written (tasks/kept.py), nothing else yet
    "chunks-written",      # inside a commit group: chunk rows appended, their documents' older rows not yet deleted
    "chunks-committed",    # chunks written, quarantine and documents rows not yet
    "quarantine-committed",  # quarantine rows written, documents rows not yet
    "documents-committed",  # documents rows written (a group's last commit), its in-flight marker not yet removed
    "group-committed",     # one commit group done; later batches not yet committed
    "indexed",             # indexes refreshed, run not yet tagged and published
    "published",           # the run's version tagged and published, runs row not yet written
    "reported",            # runs row written, flow about to return
)

_hits: Counter[str] = Counter()
_lock = threading.Lock()


def failpoint(name: str) -> None:
    """Kill this process with SIGKILL if INLET_FAILPOINT names this point (and this is the hit it asks for)."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    point, _, nth = wanted.partition("@")
    if point != name:
        return
    with _lock:
        _hits[name] += 1
        hit = _hits[name]
    if hit == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
