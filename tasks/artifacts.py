"""Read and write the Parquet artifacts that stages hand to each other."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.arrow import conform


def write_artifact(table: pa.Table, run_dir: str | Path, name: str, schema: pa.Schema) -> str:
    """Write table as <run_dir>/<name>.parquet after casting it to schema; return the path."""
    path = Path(run_dir) / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(conform(table, schema), path)
    return str(path)


def read_artifact(path: str | Path, schema: pa.Schema) -> pa.Table:
    """Read an artifact and cast it to schema."""
    return conform(pq.read_table(path), schema)
