"""Shared fixtures: a real Prefect test server, throwaway copies of the sample corpus, configs in tmp_path."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import providers  # noqa: F401 - offline switches before Prefect loads

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "sample"
SHARED = ROOT.parent / "shared"
CORPORA = SHARED / "corpora"

os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect"))


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One real, temporary Prefect API server for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A private copy of the sample corpus that a test may edit."""
    target = tmp_path / "corpus"
    shutil.copytree(SAMPLE, target)
    return target


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[..., Path]:
    """Write a config for a corpus folder with a store in tmp_path; keyword sections override defaults."""

    def _write(source: Path, *, name: str = "inlet.yaml", store: str = "store", **sections: dict) -> Path:
        data = {
            "sources": [{"name": "sample", "path": str(source),
                         "metadata": {"doc_type": "club-docs", "tags": ["sailing"], "subject": "sailing"}}],
            "embedding": {"kind": "hashing", "dim": 64},
            "store": {"uri": str(tmp_path / store / "lancedb"), "artifacts": str(tmp_path / store / "runs")},
        }
        for key, value in sections.items():
            data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        return path

    return _write


@pytest.fixture(scope="session")
def shared_corpora() -> Path:
    """../shared/corpora, or skip when this checkout has no shared folder beside it."""
    if not CORPORA.is_dir():
        pytest.skip("../shared/corpora is not present")
    return CORPORA


def run_artifact(run_dir: Path, name: str) -> pa.Table:
    """Concatenate one stage's artifact over a run's batches (an empty table when the run had no batch)."""
    files = sorted(run_dir.glob(f"batches/*/{name}.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else pa.table({"doc_id": pa.array([], pa.string())})
