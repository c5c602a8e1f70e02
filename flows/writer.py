"""The run's one writer per index: finished batches come in, commits go out in groups, then the run is published."""

from __future__ import annotations

import pyarrow as pa

from flows.batch import IndexWork
from runtime.clock import Stopwatch
from store.commit import CommitTarget, LoadResult
from tasks.load import fulltext_stage, publish_stage, upsert_stage


class Writer:
    """The run's one writer for one index: finished batches come in, commits go out in groups of commit_rows.

    A run so makes a handful of table versions whatever its number of batches, holds at most one group in
    memory, and a crash loses at most one group of finished model work. Readers see none of it until
    finish() publishes the run's last version.
    """

    def __init__(self, target: CommitTarget, documents_path: str, *, commit_rows: int, batches: int = 0,
                 fulltext_index: bool = False, known: pa.Table | None = None, keeps: bool = False) -> None:
        # known: the documents table read at the run's start, so that no group reads it again (see commit_group).
        self.target, self._documents, self._commit_rows, self._known = target, documents_path, commit_rows, known
        self._batches, self._fulltext = batches, fulltext_index
        self._keeps = keeps  # the main index's writer keeps the run's extractions in its store (tasks/kept.py)
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
        index only until the run folds them in (past MAX_UNINDEXED_FULLTEXT rows, store/commit.py), as any run does.
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
                self.clock.run("index", fulltext_stage, self.target.store_uri, self.target.chunks_table,
                               self.target.fulltext_language)

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
        done = upsert_stage(self.target, self._documents, [b.extracted for b in group], [b.embedded for b in group],
                            last=last, known=self._known,
                            kept_paths=[b.kept for b in group if b.kept] if self._keeps else None)
        self._committed = True
        for name in ("chunks_added", "chunks_removed", "chunks_reused", "chunks_written", "docs_quarantined"):
            setattr(self.result, name, getattr(self.result, name) + getattr(done, name))
        self.result.versions.update(done.versions)

    def finish(self, *, ann_min_rows: int, hold: bool = False) -> LoadResult:
        """Commit the last group with the run's deletions, refresh indexes, tag and publish; return the totals.

        Both are task runs in every run, a no-op's too (its commit has nothing to write, its publish only tags
        the version readers already see with the run id): the Prefect UI shows every run's whole DAG.
        """
        self._commit(last=True)
        target = self.target
        published = self.clock.run("publish", publish_stage, target.store_uri, target.chunks_table, target.run_id,
                                   fulltext_index=self._fulltext, ann_min_rows=ann_min_rows,
                                   fulltext_language=target.fulltext_language, hold=hold)
        self.result.indexes = published.indexes
        self.result.held = published.held
        if published.version is not None:
            self.result.versions[target.chunks_table] = published.version
        return self.result
