"""prefect.yaml as committed: its deployments, and `inlet serve` built from the same file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows.serve import PREFECT_YAML, ROOT, runner_deployments
from schemas.errors import ConfigError


def test_prefect_yaml_schedules_ingest_hourly_maintenance_nightly_and_eval_weekly_one_run_at_a_time():
    spec = {d["name"]: d for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"]}
    assert set(spec) == {"ingest", "watch", "maintenance", "eval"}
    assert {name: d["schedules"][0]["cron"] for name, d in spec.items() if name != "watch"} == {
        "ingest": "0 * * * *", "maintenance": "30 2 * * *", "eval": "0 4 * * 1"}
    assert "schedules" not in spec["watch"], "live mode is started once and runs until cancelled"
    assert spec["ingest"]["triggers"][0]["expect"] == ["inlet.sources.changed"]
    for d in spec.values():
        assert d["work_pool"]["name"] == "local-proc" and d["concurrency_limit"]["limit"] == 1
        assert (ROOT / d["entrypoint"].split(":")[0]).is_file()
        for key in ("config_path", "dataset"):
            if key in d["parameters"]:
                assert (ROOT / d["parameters"][key]).is_file(), d["parameters"][key]


def test_serve_builds_the_same_deployments_with_project_paths():
    served = {d.name: d for d in runner_deployments()}
    assert set(served) == {"ingest", "watch", "maintenance", "eval"}
    assert [t.expect for t in served["ingest"].triggers] == [{"inlet.sources.changed"}]
    assert [s.schedule.cron for s in served["maintenance"].schedules] == ["30 2 * * *"]
    assert served["ingest"].concurrency_limit == 1
    assert Path(served["eval"].parameters["dataset"]).is_absolute()
    assert Path(served["eval"].parameters["dataset"]).is_file()
    with pytest.raises(ConfigError, match="no deployment named nightly"):
        runner_deployments(names=["nightly"])
