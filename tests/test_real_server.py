"""Against a real Prefect server started here: deploy prefect.yaml as committed, run a deployment with a
worker, and read the flow run, its task runs and its artifacts back through the Prefect client."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from uuid import UUID

import httpx
import pytest

from tests.conftest import UNREAD_SERVICES

ROOT = Path(__file__).resolve().parent.parent
PREFECT = [sys.executable, "-m", "prefect"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def prefect_server(folder: Path) -> Iterator[dict[str, str]]:
    """A Prefect server with its own database in folder; yields the environment that points a process at it."""
    port = _free_port()
    # Every service on, as a user's server has it: the session's test server turns some off (tests/conftest.py).
    user_env = {k: v for k, v in os.environ.items() if k not in UNREAD_SERVICES}
    env = {**user_env, "PREFECT_HOME": str(folder / "prefect-home"), "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_SERVER_API_PORT": str(port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen([*PREFECT, "server", "start"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 120
    with httpx.Client(timeout=2) as http:  # one client: each new one builds an SSL context (~60 ms of CPU)
        while True:
            try:
                if http.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (folder / "server.log").read_text()[-3000:]
            time.sleep(0.5)
    client_env = {k: v for k, v in env.items() if not k.startswith("PREFECT_SERVER_API_")}
    try:
        yield {**client_env, "PREFECT_API_URL": url}
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One server for this file's tests (~10 s of CPU to start each): each reads back its own flow run, by its id."""
    with prefect_server(tmp_path_factory.mktemp("prefect-server")) as env:
        yield env


def _prefect(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    out = subprocess.run([*PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         check=False)
    assert out.returncode == 0, f"prefect {' '.join(args)}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out


async def _read_back(url: str, flow_run_id: UUID) -> tuple:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
    )
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url}):
        async with get_client() as client:
            run = await client.read_flow_run(flow_run_id)
            tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            artifacts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
            deployments = await client.read_deployments()
    return run, tasks, artifacts, deployments


BATCH_STAGES = ("extract", "chunk", "refresh enrichment", "enrich", "embed", "validate")


def _stage_counts(tasks: list) -> dict[str, int]:
    """How many task runs of each stage a flow run has (batch runs apart); names are '<stage>-<suffix>'."""
    counts: dict[str, int] = {}
    for t in tasks:
        if not t.name.startswith("batch-"):
            name = t.name.rsplit("-", 1)[0]
            counts[name] = counts.get(name, 0) + 1
    return counts


async def _latest_flow_run(url: str) -> UUID:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url}):
        async with get_client() as client:
            runs = await client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=1)
    return runs[0].id


def _read_settled(url: str, flow_run_id: UUID, expected: int) -> tuple:
    """Read a finished flow run back once the server has recorded its task runs (they arrive as events)."""
    deadline = time.monotonic() + 60
    while True:
        run, tasks, artifacts, deployments = asyncio.run(_read_back(url, flow_run_id))
        settled = len(tasks) >= expected and all(t.state and t.state.is_final() for t in tasks)
        if settled or time.monotonic() > deadline:
            return run, tasks, artifacts, deployments
        time.sleep(0.5)


def test_a_deployment_from_prefect_yaml_runs_on_a_worker_and_reports_to_the_server(server, corpus, write_config):
    (corpus / "broken.pdf").write_bytes(b"%PDF-1.4 not really")  # quarantined: the run has a report to post
    config = write_config(corpus, execution={"batch_docs": 2})  # several batches
    _prefect(server, "work-pool", "create", "local-proc", "--type", "process")
    _prefect(server, "--no-prompt", "deploy", "--all")
    # The hourly schedule stays, paused: at the top of an hour its own run would take the deployment's one
    # concurrency slot, and the manual run below would wait (AwaitingConcurrencySlot) past the worker's one poll.
    _prefect(server, "--no-prompt", "deployment", "schedule", "pause", "--all")
    started = _prefect(server, "deployment", "run", "ingest/ingest", "--params",
                       json.dumps({"config_path": str(config)}))
    flow_run_id = UUID(next(line.split()[-1] for line in started.stdout.splitlines() if "UUID" in line))
    _prefect(server, "worker", "start", "--pool", "local-proc", "--run-once", timeout=600)

    # Three batches of two; the writer commits the first two and builds the full-text index while the last runs.
    per_run = {"crawl": 1, "detect": 1, "upsert": 2, "index": 1, "publish": 1, "report": 1}
    expected = {**per_run, **dict.fromkeys(BATCH_STAGES, 3)}
    run, tasks, artifacts, deployments = _read_settled(server["PREFECT_API_URL"], flow_run_id,
                                                       3 + sum(expected.values()))
    assert {d.name for d in deployments} == {"ingest", "watch", "maintenance", "eval"}
    ingest = next(d for d in deployments if d.name == "ingest")
    assert ingest.global_concurrency_limit.limit == 1, "one ingest run at a time"
    assert ingest.concurrency_options.collision_strategy == "ENQUEUE"
    assert [s.schedule.cron for s in ingest.schedules] == ["0 * * * *"]
    assert run.state.is_completed(), run.state
    # Every stage is a task run the UI shows: per batch its six, around them the run's own.
    batches = sorted(t.name for t in tasks if t.name.startswith("batch-"))
    assert batches == ["batch-0", "batch-1", "batch-2"], batches
    assert _stage_counts(tasks) == expected
    assert all(t.state.is_completed() for t in tasks), [(t.name, t.state.type) for t in tasks]
    summary = next(a for a in artifacts if a.key == "ingest-run-summary")
    metrics = {row["metric"]: row["value"] for row in json.loads(summary.data)} if isinstance(summary.data, str) \
        else {row["metric"]: row["value"] for row in summary.data}
    assert summary.type == "table" and metrics["docs_new"] > 0 and metrics["version chunks"] >= 1
    assert metrics["tag"].startswith("run-") and "seconds embed" in metrics
    # One bar over the run's batches, made only once they have run 2 s (tests/test_progress.py): at 100% if made.
    progress = {a.key: a for a in artifacts if a.type == "progress"}
    assert set(progress) <= {"ingest-progress-batches"}, set(progress)
    assert all(float(a.data) == 100.0 for a in progress.values())
    quarantine = next(a for a in artifacts if a.key == "ingest-run-quarantine")
    assert quarantine.type == "markdown" and quarantine.data.startswith("## Quarantined documents (1)")
    assert "broken.pdf" in quarantine.data and metrics["checks_run"] == 13


def test_a_one_document_incremental_run_shows_every_stage_in_the_prefect_ui(server, markdown_corpus, write_config):
    """The run most schedules make: one document changed. Its DAG is the whole DAG, each stage a task run.

    Markdown alone: every stage runs for it, and a PDF, DOCX or HTML file would make the cold run's process start
    extraction workers (~10 s of CPU) that this test does not look at.
    """
    corpus = markdown_corpus
    config = write_config(corpus)
    inlet = [sys.executable, "-m", "inlet.cli", "ingest", "--quiet", "--config", str(config)]
    for step in ("cold", "one document"):
        if step == "one document":
            guide = corpus / "guides" / "boat-maintenance.md"  # read in the run's process: no extraction worker
            guide.write_text(guide.read_text() + "\nThe fuel dock opens at seven on weekdays.\n")
        out = subprocess.run(inlet, env=server, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        assert out.returncode == 0, out.stderr[-3000:]
    flow_run_id = asyncio.run(_latest_flow_run(server["PREFECT_API_URL"]))
    expected = {"crawl": 1, "detect": 1, **dict.fromkeys(BATCH_STAGES, 1), "upsert": 1, "publish": 1, "report": 1}
    run, tasks, artifacts, _ = _read_settled(server["PREFECT_API_URL"], flow_run_id, 1 + sum(expected.values()))
    assert run.state.is_completed(), run.state
    assert [t.name for t in tasks if t.name.startswith("batch-")] == ["batch-0"]
    assert _stage_counts(tasks) == expected
    assert all(t.state.is_completed() for t in tasks), [(t.name, t.state.type) for t in tasks]
    summary = next(a for a in artifacts if a.key == "ingest-run-summary")
    rows = json.loads(summary.data) if isinstance(summary.data, str) else summary.data
    metrics = {row["metric"]: row["value"] for row in rows}
    assert metrics["docs_changed"] == 1 and metrics["docs_new"] == 0
