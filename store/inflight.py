"""Which documents a commit group was committing when its run was stopped: the next run does them again.

A group commits its chunks, then its documents rows, whose content hash marks those chunks as committed.
A run killed between the two leaves the new chunks under the old rows; the next run finds the file
changed and converges, unless the file went back to its old bytes meanwhile: its hash then matches the
old row, and the chunks of the edit would stay. So before its chunk commit a group leaves a marker naming
its documents in <artifacts>/inflight/<chunks table>-<store key>/, and removes it after its documents
commit. A run reads the markers that killed runs left and does their documents again whatever their hashes
say (reason "interrupted"), then removes the markers whose documents it settled. One small file a group.
"""

from __future__ import annotations

import hashlib
import json
import uuid

from runtime.artifacts import join, list_names, read_bytes, remove, write_bytes
from schemas.errors import StoreError

FOLDER = "inflight"


def folder(artifacts: str, store_uri: str, chunks_table: str) -> str:
    """The markers' folder of one index (a store and its chunks table) under the artifact root.

    Keyed by the store too: two stores that share an artifact root (staging and production, say) would
    otherwise read, and settle, each other's markers, so a kill in one could go unrepaired.
    """
    key = hashlib.sha256(str(store_uri).encode()).hexdigest()[:12]
    return join(artifacts, FOLDER, f"{chunks_table}-{key}")


def mark(where: str, run_id: str, doc_ids: list[str]) -> str:
    """Leave a marker naming the documents a group is about to commit; return its path."""
    return write_bytes(where, f"{run_id}.{uuid.uuid4().hex[:8]}.json", json.dumps(sorted(doc_ids)).encode())


def done(marker: str) -> None:
    """Remove a group's marker once its documents rows are committed."""
    remove(marker)


def left(where: str) -> dict[str, list[str]]:
    """The markers killed runs left in the folder: {path: the doc ids it names}.

    A marker that is not a JSON list of doc ids (written by something else) stops the run with its path:
    skipped, its documents could keep a killed run's chunks unseen.
    """
    found = {}
    for name in sorted(list_names(where)):
        if not name.endswith(".json"):
            continue  # a write still aside (runtime/artifacts.py write_bytes)
        path = join(where, name)
        try:
            ids = json.loads(read_bytes(path))
        except (ValueError, UnicodeDecodeError) as exc:
            ids = exc
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            msg = (f"{path}: not an in-flight marker (a JSON list of doc ids): {ids}; delete it to go on "
                   "(the documents it named are then redone only when their files change)")
            raise StoreError(msg)
        found[path] = ids
    return found


def settle(markers: dict[str, list[str]], worked: set[str]) -> None:
    """Remove the markers all of whose documents this run did again (new, changed or deleted)."""
    for path, doc_ids in markers.items():
        if worked.issuperset(doc_ids):
            remove(path)
