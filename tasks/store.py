"""LanceDB access for the write path: open tables, look rows up by key, create with the right schema."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import lancedb
import pyarrow as pa

from schemas.arrow import DOCUMENT_ROWS_SCHEMA, conform

DOCUMENTS = "documents"
RUNS = "runs"
QUARANTINE = "quarantine"
_IN_BATCH = 5000  # keys per IN (...) filter: keeps each SQL predicate small
# Lance file format for new tables. 2.2 (this LanceDB's default) compresses data blocks, so fetching
# the ~17 columns of 10 search hits from 1M rows took ~39 ms; 2.1, the format Lance marks stable, takes
# ~6 ms at the same size on disk (bench/README.md). Tables already written keep their own format.
FILE_FORMAT = "2.1"


def connect(uri: str | Path) -> lancedb.DBConnection:
    """Open (creating if needed) the LanceDB database at uri; tables it creates use FILE_FORMAT."""
    Path(uri).mkdir(parents=True, exist_ok=True)
    return lancedb.connect(str(uri), storage_options={"new_table_data_storage_version": FILE_FORMAT})


def table_names(db: lancedb.DBConnection) -> set[str]:
    """Return the names of the tables in db."""
    listed = db.list_tables()
    return set(getattr(listed, "tables", listed))


def open_table(db: lancedb.DBConnection, name: str) -> lancedb.table.Table | None:
    """Open a table, or return None when it does not exist yet."""
    return db.open_table(name) if name in table_names(db) else None


def sql_list(values: Iterable[str]) -> str:
    """Render values as a SQL IN list of single-quoted literals."""
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def select_where_in(table: lancedb.table.Table | None, column: str, values: Iterable[str],
                    columns: list[str], schema: pa.Schema) -> pa.Table:
    """Return rows whose column is in values, only the named columns; empty when table is None."""
    values = sorted(set(values))
    parts = [pa.Table.from_pylist([], schema=pa.schema([schema.field(c) for c in columns]))]
    if table is not None:
        for i in range(0, len(values), _IN_BATCH):
            where = f"{column} IN ({sql_list(values[i : i + _IN_BATCH])})"
            parts.append(table.search().where(where).select(columns).limit(None).to_arrow())
    return pa.concat_tables([conform(p, parts[0].schema) for p in parts])


def ensure_columns(table: lancedb.table.Table, schema: pa.Schema) -> None:
    """Add the columns of schema that a table written by an older Inlet lacks (null in its old rows)."""
    missing = [pa.field(f.name, f.type, nullable=True) for f in schema if f.name not in table.schema.names]
    if missing:
        table.add_columns(missing)


def known_documents(db: lancedb.DBConnection, name: str = DOCUMENTS) -> pa.Table:
    """Return every row of the documents table (no vectors: it stays small)."""
    table = open_table(db, name)
    if table is None:
        return DOCUMENT_ROWS_SCHEMA.empty_table()
    ensure_columns(table, DOCUMENT_ROWS_SCHEMA)
    return conform(table.to_arrow(), DOCUMENT_ROWS_SCHEMA)
