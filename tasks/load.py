"""The upsert, index and publish stages: thin tasks over store/commit.py."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from runtime.artifacts import read_artifact
from runtime.failpoints import failpoint
from runtime.memory import release_memory
from schemas.arrow import DOCUMENTS_SCHEMA, EXTRACTED_SCHEMA, KEPT_SCHEMA, embedded_chunks_schema
from store.commit import (
    CommitTarget,
    LoadResult,
    commit_group,
    create_fulltext_index,
    index_coverage,
    index_state,
    publish,
    published_current,
    refresh_indexes,
    settled_documents,
    tag_version,
)
from store.model_cache import tidy_cache
from store.tables import connect, open_table

_KEY_COLUMNS = ["chunk_id", "doc_id", "enricher", "enrich_key", "embed_key"]  # what the commits need of a group's embedded chunks


@task(name="upsert", cache_policy=NO_CACHE)
def upsert_stage(target: CommitTarget, documents_path: str, extracted_paths: list[str], embedded_paths: list[str], *,
                 last: bool, known: pa.Table | None = None, kept_paths: list[str] | None = None) -> LoadResult:
    """Commit a group of finished batches (the last group also commits deletions) to LanceDB.

    kept_paths (the main index's writer): the batches' fresh extractions, kept in the store (tasks/kept.py).
    """
    schema = embedded_chunks_schema(target.dim)
    extracted = (pa.concat_tables([read_artifact(p, EXTRACTED_SCHEMA) for p in extracted_paths])
                 if extracted_paths else EXTRACTED_SCHEMA.empty_table())
    # The group's rows are read twice, batch by batch: their keys now, whole rows while LanceDB merges them.
    keys = (pa.concat_tables([read_artifact(p, schema).select(_KEY_COLUMNS) for p in embedded_paths])
            if embedded_paths else schema.empty_table().select(_KEY_COLUMNS))
    documents = settled_documents(read_artifact(documents_path, DOCUMENTS_SCHEMA), extracted["doc_id"].to_pylist(), last)
    if not documents.num_rows and not extracted.num_rows:  # a run that changed nothing: no table is touched
        get_run_logger().info("nothing to commit")
        return LoadResult()
    kept = (pa.concat_tables([KEPT_SCHEMA.empty_table(), *(read_artifact(p, KEPT_SCHEMA) for p in kept_paths)])
            if kept_paths is not None else None)
    result = commit_group(connect(target.store_uri), target, documents, extracted, keys,
                          parts=lambda: (read_artifact(p, schema) for p in embedded_paths), known=known, kept=kept)
    get_run_logger().info("chunks: %d added, %d removed, %d reused, %d rows written", result.chunks_added,
                          result.chunks_removed, result.chunks_reused, result.chunks_written)
    if kept is not None and kept.num_rows:
        get_run_logger().info("kept the extracted elements of up to %d documents (tasks/kept.py)", kept.num_rows)
    failpoint("group-committed")
    return result


@dataclass(frozen=True)
class Published:
    """What the publish stage did: the chunks table's index coverage and the version readers now see."""

    indexes: dict[str, dict[str, int]]
    version: int | None  # None: the run made no chunks table
    held: bool = False  # tagged, not published: the publish gate decides


@task(name="publish", cache_policy=NO_CACHE)
def publish_stage(store_uri: str, chunks_table: str, run_id: str, *, fulltext_index: bool, ann_min_rows: int,
                  fulltext_language: str = "auto", hold: bool = False) -> Published:
    """Bring the chunks table's indexes up to date, then tag the version and publish it to readers.

    A version readers already see (a run that changed nothing) is only tagged with the run id. hold (a publish
    gate is set): tag the new version only; the gate publishes it if it passes.
    """
    table = open_table(connect(store_uri), chunks_table)
    if table is None:
        return Published({}, None)
    if published_current(table, fulltext=fulltext_index, language=fulltext_language):
        tag_version(table, run_id)
        get_run_logger().info("nothing new to publish: version %d tagged %s", table.version, run_id)
        return Published(index_coverage(table), table.version)
    # Before the tag, so that the run's tagged version carries current indexes.
    indexes = refresh_indexes(table, fulltext=fulltext_index, ann_min_rows=ann_min_rows, language=fulltext_language)
    failpoint("indexed")
    if hold:
        tag_version(table, run_id)
        get_run_logger().info("version %d tagged %s; the publish gate decides whether readers move to it",
                              table.version, run_id)
        return Published(indexes, table.version, held=True)
    publish(table, run_id)
    failpoint("published")
    return Published(indexes, table.version)


@task(name="index", cache_policy=NO_CACHE)
def fulltext_stage(store_uri: str, chunks_table: str, fulltext_language: str = "auto") -> dict[str, dict[str, int]]:
    """Build the chunks table's full-text index over what is committed so far, if it has none; return coverage."""
    table = open_table(connect(store_uri), chunks_table)
    if table is not None and index_state(table, "text")[0] is None:
        create_fulltext_index(table, fulltext_language)
    return {} if table is None else index_coverage(table)


@task(name="tidy model cache", cache_policy=NO_CACHE)
def tidy_cache_stage(store_uri: str, cache_table: str) -> dict[str, int] | None:
    """Merge the model cache's small fragments and index its keys, when lookups would scan too many of them."""
    done = tidy_cache(store_uri, cache_table)
    release_memory()  # what the merge read and wrote goes back before the next batch's
    if done is None:
        get_run_logger().info("model cache: nothing to tidy")
    else:
        get_run_logger().info("model cache: %(fragments_before)d fragments merged into %(fragments_after)d", done)
    return done

