"""Maintenance operations on the store's tables: compaction and pruning, published tags, integrity inputs, repairs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import lancedb
import pyarrow as pa
import pyarrow.compute as pc

from runtime.memory import release_memory
from schemas.arrow import PUBLISHED_TAG
from store.tables import IN_BATCH, connect, open_table, sql_list, table_names

_FOREVER = timedelta(days=36_500)  # optimize() without pruning
_VECTOR_BATCH = 20_000  # vectors checked at a time: memory stays flat however large the table


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.astimezone(UTC)


def expired_tags(tags: dict[str, dict], versions: list[dict], cutoff: datetime) -> list[str]:
    """Name the run tags on versions older than cutoff (or on versions already gone): they would block pruning.

    The published tag is never one of them: readers follow it, and compaction moves it along.
    """
    stamps = {v["version"]: _aware(v["timestamp"]) for v in versions}
    return sorted(name for name, tag in tags.items() if name != PUBLISHED_TAG
                  and (tag["version"] not in stamps or stamps[tag["version"]] < cutoff))


def thinned_tags(tags: dict[str, dict], versions: list[dict], recent: datetime) -> list[str]:
    """Name the run tags older than recent that live mode drops: all but the last of each hour are.

    Live mode tags thousands of micro-batch runs a day; one per hour keeps `as_of` by run or time
    answering to the hour, with the tag count bounded by retention_days x 24.
    """
    stamps = {v["version"]: _aware(v["timestamp"]) for v in versions}
    last_of_hour: dict[datetime, tuple[int, str]] = {}
    old = []
    for name, tag in tags.items():
        stamp = stamps.get(tag["version"])
        if name == PUBLISHED_TAG or stamp is None or stamp >= recent:
            continue
        old.append(name)
        hour = stamp.replace(minute=0, second=0, microsecond=0)
        last_of_hour[hour] = max(last_of_hour.get(hour, (-1, "")), (tag["version"], name))
    kept = {name for _, name in last_of_hour.values()}
    return sorted(n for n in old if n not in kept)


def published_at_latest(store_uri: str, chunks_tables: list[str]) -> list[str]:
    """Name the chunks tables whose published tag is on their latest version (nothing unpublished after it)."""
    db = connect(store_uri)
    found = []
    for name in chunks_tables:
        table = open_table(db, name)
        if table is not None and table.tags.list().get(PUBLISHED_TAG, {}).get("version") == table.version:
            found.append(name)
    return found


def republish(store_uri: str, chunks_tables: list[str]) -> None:
    """Move the published tag of these tables to their latest version: maintenance changed files, not runs' rows."""
    db = connect(store_uri)
    for name in chunks_tables:
        table = open_table(db, name)
        if table is not None:
            table.tags.update(PUBLISHED_TAG, table.version)


def table_shape(table: lancedb.table.Table, versions: list[dict] | None = None) -> dict[str, int]:
    """A table's versions, data files and rows (versions: its list_versions(), when already read)."""
    return {"versions": len(versions if versions is not None else table.list_versions()),
            "fragments": table.stats()["fragment_stats"]["num_fragments"], "rows": table.count_rows()}


# Live compaction's tiers. Fragments under LIVE_FLOOR_ROWS always merge; a larger one merges only once the newer
# rows after it add up to as many as it holds, so each row is rewritten about log2(LIVE_MAX_ROWS / floor) times
# and fragment sizes at least double going back in time; from LIVE_MAX_ROWS on, live mode leaves a fragment to the
# nightly maintenance. Deletions rewrite fragments on their own and leave small ones among large ones: past
# LIVE_MAX_FRAGMENTS, everything under LIVE_MAX_ROWS merges at once (a rare, larger rewrite that resets the count).
LIVE_FLOOR_ROWS = 1_024
LIVE_MAX_ROWS = 65_536
LIVE_MAX_FRAGMENTS = 24
DELETED_SHARE = 0.1  # Lance's own threshold for rewriting a fragment to drop its deleted rows


def live_exclusions(fragments: list[tuple[int, int, int]], floor: int = LIVE_FLOOR_ROWS,
                    most: int = LIVE_MAX_ROWS, max_fragments: int = LIVE_MAX_FRAGMENTS) -> list[int]:
    """The fragment ids a live compaction leaves alone, from (id, live rows, physical rows) in table order.

    The newest fragments merge into one while each older one holds no more rows than all the newer ones together
    (or under floor); the first that holds more ends the run. Older ones stay, except a fragment under most
    whose deleted share reached DELETED_SHARE: that one is rewritten on its own. With more than max_fragments,
    only fragments of most rows or more stay.
    """
    if len(fragments) > max_fragments:
        return sorted(frag_id for frag_id, rows, _ in fragments if rows >= most)
    excluded: list[int] = []
    newer = 0
    merging = True
    for frag_id, rows, physical in reversed(fragments):
        if merging and rows < most and (not newer or rows < floor or rows <= newer):
            newer += rows
            continue
        merging = False
        if rows >= most or not physical or (physical - rows) / physical < DELETED_SHARE:
            excluded.append(frag_id)
    return sorted(excluded)


def fragment_rows(table: lancedb.table.Table) -> list[tuple[int, int, int]]:
    """(id, live rows, physical rows) of each fragment of the table, in table order (from the manifest alone)."""
    found = []
    for fragment in table.to_lance().get_fragments():
        meta = fragment.metadata
        found.append((meta.id, meta.num_rows, meta.physical_rows))
    return found


def compact_and_prune(table: lancedb.table.Table, older_than: timedelta, *, live: bool = False) -> None:
    """Merge the table's small data files, then delete the files of untagged versions older than older_than.

    Lance's own calls, not LanceDB's optimize(): that also merged every index, which at 100k documents made
    it 187 s at a 2.6 GB peak; compaction alone is 32 s at 1.2 GB, and the index refresh merges the indexes
    after (67 s, 0.6 GB). Tagged versions are kept, as optimize() kept them. live: merge in tiers
    (live_exclusions), so that a watcher's upkeep costs the same in a table of 20k rows or of millions.
    """
    options = {"excluded_fragment_ids": live_exclusions(fragment_rows(table))} if live else {}
    table.to_lance().optimize.compact_files(**options)
    table.checkout_latest()
    table.to_lance().cleanup_old_versions(older_than=older_than, error_if_tagged_old_versions=False)
    table.checkout_latest()


def compact_store(store_uri: str, retention_days: float, now: datetime,
                  keep_recent: timedelta | None = None) -> dict[str, dict]:
    """Compact every table of the store, drop run tags older than the retention, prune older versions.

    keep_recent (live mode): prune untagged versions older than this instead of the retention, keep one run
    tag per hour past it (thinned_tags), and compact in tiers (compact_and_prune).
    """
    db = connect(store_uri)
    cutoff = now - timedelta(days=retention_days)
    prune_after = timedelta(days=retention_days) if keep_recent is None else min(keep_recent,
                                                                               timedelta(days=retention_days))
    out = {}
    for name in sorted(table_names(db)):
        table = db.open_table(name)
        versions = table.list_versions()  # every manifest is read: once per table, not once per question
        before = table_shape(table, versions)
        tags = table.tags.list()
        dropped = expired_tags(tags, versions, cutoff)
        if keep_recent is not None:
            dropped = sorted({*dropped, *thinned_tags({k: v for k, v in tags.items() if k not in dropped},
                                                      versions, now - prune_after)})
        for tag in dropped:  # a tagged version cannot be pruned: the tag goes with the version it keeps
            table.tags.delete(tag)
        published = tags.get(PUBLISHED_TAG, {}).get("version")
        at_latest = published == table.version
        stamps = {v["version"]: _aware(v["timestamp"]) for v in versions}
        # Readers still need a published version that is not the latest (a run committed after it and did not
        # finish): past the cutoff, nothing is pruned until the next run publishes.
        kept = (f"version {published} is still the published one: versions were not pruned"
                if published is not None and not at_latest and stamps.get(published, now) < now - prune_after
                else None)
        if at_latest:  # the tag would block pruning its version; readers see the same rows at the latest meanwhile
            table.tags.delete(PUBLISHED_TAG)
        compact_and_prune(table, _FOREVER if kept else prune_after, live=keep_recent is not None)
        if at_latest:  # same rows, fewer files: readers move on to the compacted version
            table.tags.create(PUBLISHED_TAG, table.version)
        out[name] = {"before": before, "after": table_shape(table), "tags_removed": dropped,
                     **({"kept": kept} if kept else {})}
    return out


class IntegrityInputs:
    """What the integrity checks read of one chunks table and its documents table."""

    def __init__(self, db: lancedb.DBConnection, chunks_name: str, documents_name: str) -> None:
        release_memory()  # what compaction and the index merge freed goes back before the columns are read
        self.chunks_table = open_table(db, chunks_name)
        docs_table = open_table(db, documents_name)
        self.documents = (docs_table.search().select(["doc_id", "total_chunks"]).limit(None).to_arrow()
                          if docs_table is not None else pa.table({"doc_id": pa.array([], pa.string()),
                                                                   "total_chunks": pa.array([], pa.int32())}))

    def chunks(self) -> pa.Table:
        """chunk_id, doc_id, total_chunks of every chunk (no vectors)."""
        return self.chunks_table.search().select(["chunk_id", "doc_id", "total_chunks"]).limit(None).to_arrow()

    def vector_size(self) -> int:
        """The size of the vectors the table holds."""
        return self.chunks_table.schema.field("vector").type.list_size

    def vector_batches(self) -> Iterator[pa.RecordBatch]:
        """(chunk_id, doc_id, vector) in batches, with a small read-ahead.

        Lance's scanner: LanceDB's query buffered ~730 MB of vectors at 864k rows, this ~470.
        """
        return self.chunks_table.to_lance().to_batches(
            columns=["chunk_id", "doc_id", "vector"], batch_size=_VECTOR_BATCH, io_buffer_size=16 * 2**20,
            batch_readahead=1, fragment_readahead=1)

    def unindexed(self) -> dict[str, int]:
        """Rows not yet in each index, by index name."""
        return {index.name: self.chunks_table.index_stats(index.name).num_unindexed_rows
                for index in self.chunks_table.list_indices()}


def delete_chunks(db: lancedb.DBConnection, chunks_name: str, chunk_ids: list[str]) -> int:
    """Delete these chunks; return how many were asked for (0 when the table is gone)."""
    if not chunk_ids or (chunks := open_table(db, chunks_name)) is None:
        return 0
    chunks.delete(f"chunk_id IN ({sql_list(chunk_ids)})")
    return len(chunk_ids)


def requeue_documents(db: lancedb.DBConnection, documents_name: str, doc_ids: list[str]) -> int:
    """Clear these documents' content hash, so that the next run hashes their files again and rebuilds them."""
    if not doc_ids or (documents := open_table(db, documents_name)) is None:
        return 0
    documents.update(where=f"doc_id IN ({sql_list(doc_ids)})", values={"content_hash": None})
    return len(doc_ids)


# --- the model cache (store/model_cache.py) -----------------------------------------------------------------


def used_model_keys(db: lancedb.DBConnection, chunks_tables: list[str]) -> pa.Array:
    """Every embed and enrich key a chunk of these tables uses now (distinct; no vectors read)."""
    parts = [pa.array([], pa.string())]
    for name in chunks_tables:
        table = open_table(db, name)
        if table is None:
            continue
        for column in ("embed_key", "enrich_key"):
            if column in table.schema.names:
                parts.append(pc.unique(table.search().select([column]).limit(None).to_arrow()[column]
                                       .combine_chunks()).drop_null())
    return pc.unique(pa.concat_arrays(parts))


def cache_entries(db: lancedb.DBConnection, name: str) -> pa.Table | None:
    """key, kind, fingerprint, vector size (null for enrichments) and unused_since of every cache row (streamed)."""
    table = open_table(db, name)
    if table is None:
        return None
    parts = []
    for batch in table.to_lance().to_batches(columns=["key", "kind", "fingerprint", "vector", "unused_since"],
                                             batch_size=_VECTOR_BATCH, batch_readahead=1, fragment_readahead=1):
        parts.append(pa.table({"key": batch["key"], "kind": batch["kind"], "fingerprint": batch["fingerprint"],
                               "size": pc.list_value_length(batch["vector"]), "unused_since": batch["unused_since"]}))
    if not parts:
        return pa.table({"key": pa.array([], pa.string()), "kind": pa.array([], pa.string()),
                         "fingerprint": pa.array([], pa.string()), "size": pa.array([], pa.int32()),
                         "unused_since": pa.array([], pa.timestamp("us", tz="UTC"))})
    return pa.concat_tables(parts)


def set_unused_since(db: lancedb.DBConnection, name: str, keys: list[str], when: datetime | None) -> None:
    """Mark these cache entries unused since when (None: in use again)."""
    table = open_table(db, name)
    for i in range(0, len(keys), IN_BATCH):
        table.update(where=f"key IN ({sql_list(keys[i : i + IN_BATCH])})", values={"unused_since": when})


def delete_cache_keys(db: lancedb.DBConnection, name: str, keys: list[str]) -> int:
    """Delete every cache row of these keys; return how many keys were asked for."""
    table = open_table(db, name)
    if table is None or not keys:
        return 0
    for i in range(0, len(keys), IN_BATCH):
        table.delete(f"key IN ({sql_list(keys[i : i + IN_BATCH])})")
    return len(keys)
