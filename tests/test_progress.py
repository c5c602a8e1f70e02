"""Progress artifacts: a stage that runs long enough gets one in the UI; a quick one costs no API calls."""

from __future__ import annotations

import time
import uuid

import pytest
from prefect import flow
from prefect.artifacts import Artifact

from runtime import progress
from runtime.progress import stage_progress


@flow
def _stage_over(stage: str, items: int, pause_s: float) -> None:
    with stage_progress(stage, items) as advance:
        for _ in range(items):
            time.sleep(pause_s)
            advance(1)


def test_a_stage_done_before_the_update_interval_makes_no_progress_artifact(prefect_harness) -> None:
    stage = f"quick-{uuid.uuid4().hex[:8]}"
    _stage_over(stage, 3, 0.0)
    assert Artifact.get(f"ingest-progress-{stage}") is None


def test_a_stage_running_past_the_update_interval_shows_its_progress_to_the_end(prefect_harness, monkeypatch) -> None:
    monkeypatch.setattr(progress, "_ARTIFACT_EVERY_S", 0.05)
    stage = f"slow-{uuid.uuid4().hex[:8]}"
    _stage_over(stage, 3, 0.1)
    artifact = Artifact.get(f"ingest-progress-{stage}")
    assert artifact is not None and artifact.type == "progress"
    assert float(artifact.data) == pytest.approx(100.0)


def test_a_stage_done_all_at_once_after_the_interval_makes_no_progress_artifact(prefect_harness, monkeypatch) -> None:
    # A run of one batch: its only update is the last one; a bar made then would show nothing but 100%.
    monkeypatch.setattr(progress, "_ARTIFACT_EVERY_S", 0.05)
    stage = f"whole-{uuid.uuid4().hex[:8]}"
    _stage_over(stage, 1, 0.1)
    assert Artifact.get(f"ingest-progress-{stage}") is None
