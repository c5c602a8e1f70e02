"""bench/dask_scaling.py: the throughput ratio of 2 Dask workers over 1, and the config it measures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

_SPEC = importlib.util.spec_from_file_location("dask_scaling",
                                               Path(__file__).resolve().parent.parent / "bench" / "dask_scaling.py")
dask_scaling = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(dask_scaling)


def test_the_ratio_is_the_median_span_of_one_worker_over_two():
    runs = [{"workers": 1, "batch_span_s": s} for s in (180.0, 190.0, 170.0)]
    runs += [{"workers": 2, "batch_span_s": s} for s in (100.0, 120.0, 90.0)]
    summary = dask_scaling.summarize(runs)
    assert summary["median_span_s"] == {1: 180.0, 2: 100.0}
    assert summary["ratio_2_over_1"] == 1.8


def test_the_config_is_a_cold_dask_ingest_of_the_chosen_formats_and_loads(tmp_path):
    from schemas.config import load_config

    path = dask_scaling.write_config(tmp_path / "state", ["pdf", "html"], 2, 12)
    data = yaml.safe_load(path.read_text())
    assert data["execution"] == {"task_runner": "dask", "workers": 2, "batch_docs": 12}
    assert [s["include"] for s in data["sources"]] == [["**/*.pdf"], ["**/*.html", "**/*.htm"]]
    cfg = load_config(str(path))  # a key the config model does not know would fail here
    assert cfg.execution.workers == 2 and cfg.enrichment.enabled is False
