"""The store's history: which runs made which table versions, and what changed between two of them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import lancedb
import pyarrow as pa

from query.search import (
    DEFAULT_CONFIG,
    resolve_version,
    select_variant,
    store_connection,
)
from schemas.arrow import PUBLISHED_TAG, QUARANTINE_SCHEMA, RUN_COUNTS, conform
from schemas.config import InletConfig, load_config
from schemas.errors import StoreError
from store.tables import tag_versions

_KEYS = ["chunk_id", "doc_id", "text_hash", "enrich_key", "embed_key"]


def _config(config: InletConfig | str | Path) -> InletConfig:
    return config if isinstance(config, InletConfig) else load_config(config)


def _table(cfg: InletConfig, name: str) -> lancedb.table.Table | None:
    db = store_connection(cfg)
    listed = db.list_tables()
    return db.open_table(name) if name in set(getattr(listed, "tables", listed)) else None


def quarantined(config: InletConfig | str | Path = DEFAULT_CONFIG, variant: str | None = None) -> list[dict]:
    """List what is quarantined now, longest first: document, stage, reason, message, since when, attempts."""
    cfg = select_variant(_config(config), variant)
    table = _table(cfg, cfg.store.quarantine_table)
    if table is None:
        return []
    have = set(table.schema.names)  # a table of an older Inlet lacks since and attempts: read as the first try
    rows = table.to_arrow()
    for name in QUARANTINE_SCHEMA.names:
        if name not in have:
            rows = rows.append_column(name, pa.nulls(rows.num_rows, QUARANTINE_SCHEMA.field(name).type))
    found = conform(rows, QUARANTINE_SCHEMA).to_pylist()
    for row in found:
        row["since"] = row["since"] or row["at"]
        row["attempts"] = row["attempts"] or 1
    return sorted(found, key=lambda r: (r["since"], r["doc_id"]))


def versions(config: InletConfig | str | Path = DEFAULT_CONFIG, variant: str | None = None) -> list[dict]:
    """List the runs, oldest first: id, times, status, the chunks version it tagged, whether readers see that
    version (published), its publish gate's verdict, and its counts."""
    cfg = select_variant(_config(config), variant)
    runs, chunks = _table(cfg, cfg.store.runs_table), _table(cfg, cfg.store.chunks_table)
    if runs is None:
        return []
    tags = tag_versions(chunks) if chunks is not None else {}
    published = tags.get(PUBLISHED_TAG)
    return [{**run_entry(row, tags, published, cfg.store.chunks_table), **{k: row.get(k) for k in RUN_COUNTS}}
            for row in sorted(runs.to_arrow().to_pylist(), key=lambda r: r["started_at"])]


def run_entry(row: dict, tags: dict[str, int], published: int | None, chunks_table: str) -> dict:
    """A runs row as the history lists it: times, status, gate, the chunks version it tagged (else the one it
    recorded), and whether readers are served that version."""
    table_versions = row["_versions"] if "_versions" in row else json.loads(row["versions"] or "{}")
    chunks_version = tags.get(row["run_id"], table_versions.get(chunks_table))
    return {"run_id": row["run_id"], "started_at": row["started_at"], "finished_at": row["finished_at"],
            "status": row["status"], "tag": row["run_id"] if row["run_id"] in tags else None,
            "chunks_version": chunks_version, "versions": table_versions, "gate": row.get("gate"),
            "published": chunks_version is not None and chunks_version == published}


_LISTED = ["run_id", "started_at", "finished_at", "status", "versions", "gate"]


class RunsHistory:
    """The runs a long-lived server lists, kept between reads: each read fetches only the rows written since.

    A run adds its row when it ends, and a publish by hand rewrites one (gate); either way the row gets a row id
    not seen before, so a read lists the row ids and fetches the new ones. Reading every row again cost ~55 ms of
    CPU at 1,621 runs (a live watcher adds one per micro-batch and never drops them), at every run.
    """

    def __init__(self) -> None:
        self._rows: dict[int, dict] = {}  # row id -> the row's listed columns, its versions parsed

    def read(self, runs: lancedb.table.Table, chunks: lancedb.table.Table | None, chunks_table: str) -> list[dict]:
        """The runs oldest first, as run_entry lists them; runs should be pinned to a version (checkout)."""
        listed = runs.search().select(["run_id"]).with_row_id(True).limit(None).to_arrow()
        present = dict(zip(listed["_rowid"].to_pylist(), listed["run_id"].to_pylist(), strict=True))
        # A row id names another row once the table is compacted or made anew: kept only with the same run id.
        self._rows = {i: row for i, row in self._rows.items() if present.get(i) == row["run_id"]}
        new = [i for i in present if i not in self._rows]
        if new:
            for row in runs.take_row_ids(new).select(_LISTED).with_row_id().to_arrow().to_pylist():
                row["_versions"] = json.loads(row["versions"] or "{}")
                self._rows[row["_rowid"]] = row
        tags = tag_versions(chunks) if chunks is not None else {}
        published = tags.get(PUBLISHED_TAG)
        ordered = sorted(self._rows.values(), key=lambda r: (r["started_at"], r["_rowid"]))
        return [{**run_entry(row, tags, published, chunks_table), "row_id": row["_rowid"]} for row in ordered]


@dataclass
class Diff:
    """What changed in the chunks table between two versions."""

    old_version: int
    new_version: int
    documents_added: list[str] = field(default_factory=list)
    documents_removed: list[str] = field(default_factory=list)
    documents_changed: list[str] = field(default_factory=list)  # chunks added, removed or re-enriched/re-embedded
    chunks_added: list[str] = field(default_factory=list)
    chunks_removed: list[str] = field(default_factory=list)
    chunks_changed: list[str] = field(default_factory=list)  # same id, new enrichment or vector


def _snapshot(table: lancedb.table.Table, version: int) -> dict[str, dict]:
    table.checkout(version)
    rows = table.search().select(_KEYS).limit(None).to_arrow().to_pylist()
    return {r["chunk_id"]: r for r in rows}


def diff_snapshots(old: dict[str, dict], new: dict[str, dict], old_version: int, new_version: int) -> Diff:
    """Compare two {chunk_id: keys} snapshots of the chunks table."""
    result = Diff(old_version, new_version)
    result.chunks_added = sorted(new.keys() - old.keys())
    result.chunks_removed = sorted(old.keys() - new.keys())
    result.chunks_changed = sorted(c for c in new.keys() & old.keys()
                                   if (new[c]["enrich_key"], new[c]["embed_key"]) != (old[c]["enrich_key"],
                                                                                      old[c]["embed_key"]))
    old_docs = {r["doc_id"] for r in old.values()}
    new_docs = {r["doc_id"] for r in new.values()}
    touched = {new[c]["doc_id"] for c in result.chunks_added + result.chunks_changed}
    touched |= {old[c]["doc_id"] for c in result.chunks_removed}
    result.documents_added = sorted(new_docs - old_docs)
    result.documents_removed = sorted(old_docs - new_docs)
    result.documents_changed = sorted(touched & old_docs & new_docs)
    return result


def diff(a: int | str | datetime, b: int | str | datetime,
         config: InletConfig | str | Path = DEFAULT_CONFIG, variant: str | None = None) -> Diff:
    """Say which documents and chunks were added, removed or changed from a to b (versions, run tags or times)."""
    cfg = select_variant(_config(config), variant)
    table = _table(cfg, cfg.store.chunks_table)
    if table is None:
        msg = f"no '{cfg.store.chunks_table}' table in {cfg.store.uri}: run `inlet ingest` first"
        raise StoreError(msg)
    old_version, new_version = resolve_version(table, a), resolve_version(table, b)
    return diff_snapshots(_snapshot(table, old_version), _snapshot(table, new_version), old_version, new_version)
