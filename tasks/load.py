"""The upsert, index and publish stages, and the run's one writer that groups finished batches into commits."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING

import pyarrow as pa
from prefect import get_run_logger

from runtime.artifacts import read_artifact
from runtime.clock import Stopwatch
from runtime.failpoints import failpoint
from runtime.stage import stage
from schemas.arrow import DOCUMENTS_SCHEMA, EXTRACTED_SCHEMA, embedded_chunks_schema
from store.commit import (
    LoadResult,
    _create_fulltext,
    _settled,
    _unindexed,
    commit_group,
    index_coverage,
    publish,
    published_current,
    refresh_indexes,
    tag_version,
)
from store.tables import QUARANTINE, connect, open_table
from tasks import uncommitted

if TYPE_CHECKING:
    from tasks.batch import IndexWork

_KEY_COLUMNS = ["chunk_id", "doc_id", "enricher", "enrich_key"]  # what the commits need of a group's embedded chunks


@stage("upsert")
def upsert_stage(store_uri: str, documents_path: str, extracted_paths: list[str], embedded_paths: list[str], *,
                 last: bool, chunks_table: str, documents_table: str, quarantine_table: str, dim: int,
                 settings_fp: str, run_id: str,
                 now: datetime, known: pa.Table | None = None, inflight_dir: str | None = None) -> dict:
    """Commit a group of finished batches (the last group also commits deletions) to LanceDB."""
    schema = embedded_chunks_schema(dim)
    extracted = (pa.concat_tables([read_artifact(p, EXTRACTED_SCHEMA) for p in extracted_paths])
                 if extracted_paths else EXTRACTED_SCHEMA.empty_table())
    # The group's rows are read twice, batch by batch: their keys now, whole rows while LanceDB merges them.
    keys = (pa.concat_tables([read_artifact(p, schema).select(_KEY_COLUMNS) for p in embedded_paths])
            if embedded_paths else schema.empty_table().select(_KEY_COLUMNS))
    documents = _settled(read_artifact(documents_path, DOCUMENTS_SCHEMA), extracted["doc_id"].to_pylist(), last)
    if not documents.num_rows and not extracted.num_rows:  # a run that changed nothing: no table is touched
        get_run_logger().info("nothing to commit")
        return asdict(LoadResult())
    result = commit_group(connect(store_uri), chunks_table, documents, extracted, keys, dim=dim,
                          settings_fp=settings_fp, run_id=run_id, now=now, documents_table=documents_table,
                          quarantine_table=quarantine_table,
                          parts=lambda: (read_artifact(p, schema) for p in embedded_paths), known=known,
                          inflight_dir=inflight_dir)
    get_run_logger().info("chunks: %d added, %d removed, %d reused, %d rows written", result.chunks_added,
                          result.chunks_removed, result.chunks_reused, result.chunks_written)
    failpoint("group-committed")
    return asdict(result)


@stage("publish")
def publish_stage(store_uri: str, chunks_table: str, run_id: str, *, fulltext_index: bool, ann_min_rows: int) -> dict:
    """Bring the chunks table's indexes up to date, then tag the version and publish it to readers.

    A version readers already see (a run that changed nothing) is only tagged with the run id.
    """
    table = open_table(connect(store_uri), chunks_table)
    if table is None:
        return {"indexes": {}, "version": None}
    if published_current(table, fulltext=fulltext_index):
        tag_version(table, run_id)
        get_run_logger().info("nothing new to publish: version %d tagged %s", table.version, run_id)
        return {"indexes": index_coverage(table), "version": table.version}
    # Before the tag, so that the run's tagged version carries current indexes.
    indexes = refresh_indexes(table, fulltext=fulltext_index, ann_min_rows=ann_min_rows)
    failpoint("indexed")
    publish(table, run_id)
    failpoint("published")
    return {"indexes": indexes, "version": table.version}


@stage("index")
def fulltext_stage(store_uri: str, chunks_table: str) -> dict:
    """Build the chunks table's full-text index over what is committed so far, if it has none; return coverage."""
    table = open_table(connect(store_uri), chunks_table)
    if table is not None and _unindexed(table, "text")[0] is None:
        _create_fulltext(table)
    return {} if table is None else index_coverage(table)


class Writer:
    """The run's one writer for one index: finished batches come in, commits go out in groups of commit_rows.

    A run so makes a handful of table versions whatever its number of batches, holds at most one group in
    memory, and a crash loses at most one group of finished model work. Readers see none of it until
    finish() publishes the run's last version.
    """

    def __init__(self, store_uri: str, documents_path: str, *, commit_rows: int, chunks_table: str,
                 documents_table: str, dim: int, settings_fp: str, run_id: str, now: datetime, batches: int = 0,
                 quarantine_table: str = QUARANTINE,
                 fulltext_index: bool = False, known: pa.Table | None = None, inflight_dir: str | None = None) -> None:
        self._store, self._documents, self._commit_rows = store_uri, documents_path, commit_rows
        # known: the documents table read at the run's start, so that no group reads it again (see commit_group).
        self._args = {"chunks_table": chunks_table, "documents_table": documents_table,
                      "quarantine_table": quarantine_table, "dim": dim,
                      "settings_fp": settings_fp, "run_id": run_id, "now": now, "known": known,
                      "inflight_dir": inflight_dir}
        self._batches, self._fulltext = batches, fulltext_index
        self._received = 0
        self._pending: list[IndexWork] = []
        self._committed = False
        self.result = LoadResult()
        self.clock = Stopwatch()

    def add(self, batch: IndexWork, *, hold: bool = False) -> None:
        """Take a batch's finished work for this index; commit the group once it holds commit_rows rows.

        A run that has committed nothing when only its last batch is still to come commits then, and builds
        the full-text index then, while that batch runs: done after it, both left the other core idle (a cold
        run of the bench corpus spent ~1.6 s there). The last batch's rows are then searched without the
        index, as any run's new rows are up to MAX_UNINDEXED, until a later run or maintenance folds them in.
        hold: commit nothing yet (the systemic-failure breaker is undecided); once released, what was held goes
        out in groups of commit_rows, as it would have.
        """
        self._pending.append(batch)
        self._received += 1
        if hold:
            return
        while sum(b.rows for b in self._pending) >= self._commit_rows:
            self._commit(last=False, count=self._group_size())
        if not self._committed and self._batches - self._received == 1:
            self._commit(last=False)
            if self._fulltext:
                self.clock.run("index", fulltext_stage, self._store, self._args["chunks_table"])

    def _group_size(self) -> int:
        """The number of pending batches in the next group: the fewest that hold commit_rows rows."""
        rows = 0
        for n, batch in enumerate(self._pending, start=1):
            rows += batch.rows
            if rows >= self._commit_rows:
                return n
        return len(self._pending)

    def _commit(self, *, last: bool, count: int | None = None) -> None:
        with self.clock.timing("upsert"):
            self._commit_group(last=last, count=count)

    def _commit_group(self, *, last: bool, count: int | None) -> None:
        group, self._pending = (self._pending, []) if count is None else (self._pending[:count], self._pending[count:])
        done = upsert_stage(self._store, self._documents, [b.extracted for b in group],
                            [b.embedded for b in group], last=last, **self._args)
        uncommitted.forget(b.embedded.rsplit("/", 1)[0] for b in group)
        self._committed = True
        for name in ("chunks_added", "chunks_removed", "chunks_reused", "chunks_written", "docs_quarantined"):
            setattr(self.result, name, getattr(self.result, name) + done[name])
        self.result.versions.update(done["versions"])

    def finish(self, *, fulltext_index: bool, ann_min_rows: int) -> dict:
        """Commit the last group with the run's deletions, refresh indexes, tag and publish; return the totals.

        Both are task runs in every run, a no-op's too (its commit has nothing to write, its publish only tags
        the version readers already see with the run id): the Prefect UI shows every run's whole DAG.
        """
        self._commit(last=True)
        published = self.clock.run("publish", publish_stage, self._store, self._args["chunks_table"],
                                   self._args["run_id"], fulltext_index=fulltext_index, ann_min_rows=ann_min_rows)
        self.result.indexes = published["indexes"]
        if published["version"] is not None:
            self.result.versions[self._args["chunks_table"]] = published["version"]
        return asdict(self.result)
