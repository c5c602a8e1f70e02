"""Shared fixtures: a real Prefect test server, throwaway copies of the sample corpus, configs in tmp_path."""

from __future__ import annotations

import logging
import os
import shutil
import urllib.request
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


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# `inlet` commands use a local Prefect server that answers at PREFECT_SERVER_API_PORT (runtime/prefect_api.py). The
# tests' commands go to the session's server or a temporary one, never to a developer's `make server` on 4311.
os.environ["PREFECT_SERVER_API_PORT"] = str(_closed_port())
# Nor do they hand their work to a developer's warm `inlet server` (runtime/warm.py); tests/test_warm.py names its own.
os.environ["INLET_WARM_SOCKET"] = "off"


# The test server's services that turn every task run's events into rows and react to them. No test reads task
# runs or events from this server (tests/test_real_server.py starts a server of its own with every service on),
# and recording them was a third of the CPU of a run-heavy test file (py-spy on the server: the task-run recorder
# and the event consumers), taken from the tests beside it on a 2-core machine.
UNREAD_SERVICES = {"PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED": "false",
                   "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "false",
                   "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false"}


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One real, temporary Prefect API server for the whole session; flow runs in this process send no heartbeats."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, PREFECT_LOGGING_TO_API_ENABLED, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with pytest.MonkeyPatch.context() as env:
        for name, value in UNREAD_SERVICES.items():
            env.setenv(name, value)  # the server subprocess reads its settings from the environment
        # A flow run ends by joining its heartbeat thread, which sleeps in whole seconds: up to 1 s a run, half of
        # tests/test_ingest_flow.py's time (53.9 s -> 28.5 s without). Heartbeats only let a server mark a crashed
        # run; no test here reads them, and the deployment test (tests/test_real_server.py) runs in a worker
        # process of its own, heartbeats on. None cannot be spelled in an environment variable, hence this form.
        # Nor do the flow runs of this process send their log lines to the server: no test reads them there (tests
        # read logs with caplog), and sending and storing them took CPU from the tests beside; the inlet commands
        # that tests run as subprocesses still send theirs, as a user's do.
        with prefect_test_harness(server_startup_timeout=120), \
                temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None, PREFECT_LOGGING_TO_API_ENABLED: False}):
            yield


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A private copy of the sample corpus that a test may edit."""
    target = tmp_path / "corpus"
    shutil.copytree(SAMPLE, target)
    return target


@pytest.fixture
def markdown_corpus(tmp_path: Path) -> Path:
    """A private copy of the sample's Markdown guide alone: read in the run's own process, no extraction worker.

    For tests of orchestration (locks, resumed jobs, linked runs) where the file formats play no part: each
    non-Markdown document makes a fresh process start an extraction worker (unstructured and spaCy, ~10 s of CPU).
    """
    target = tmp_path / "markdown-corpus"  # beside `corpus`, which a fixture of the same test may also make
    (target / "guides").mkdir(parents=True)
    shutil.copy2(SAMPLE / "guides" / "boat-maintenance.md", target / "guides" / "boat-maintenance.md")
    return target


def config_writer(folder: Path) -> Callable[..., Path]:
    """A function that writes a config for a corpus folder with a store in folder; keyword sections override defaults."""

    def _write(source: Path, *, name: str = "inlet.yaml", store: str = "store", **sections: dict) -> Path:
        data = {
            "sources": [{"name": "sample", "path": str(source),
                         "metadata": {"doc_type": "club-docs", "tags": ["sailing"], "subject": "sailing"}}],
            "embedding": {"kind": "hashing", "dim": 64},
            # The hashing embedder stands in for e5, so its fusion is e5's: over hashing alone a hybrid search would
            # be full-text's (schemas/config.py EMBEDDER_FUSION), and the tests' hybrid searches must run both sides.
            "query": {"vector_weight": 0.5, "fulltext_weight": 0.5},
            "store": {"uri": str(folder / store / "lancedb"), "artifacts": str(folder / store / "runs")},
        }
        for key, value in sections.items():
            data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
        path = folder / name
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        return path

    return _write


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[..., Path]:
    """Write a config for a corpus folder with a store in tmp_path; keyword sections override defaults."""
    return config_writer(tmp_path)


class _Requests(logging.Handler):
    """The S3 server's access log: one line per request."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def s3():
    """A local S3-compatible server with a bucket 'docs'; yields (endpoint, boto3 client, request log)."""
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # moto keeps its buckets in the process, not in the server: start each test from an empty one.
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10).close()
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
    client.create_bucket(Bucket="docs")
    log = _Requests()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(log)
    werkzeug.setLevel(logging.INFO)
    try:
        yield endpoint, client, log
    finally:
        werkzeug.removeHandler(log)
        server.stop()


def bucket_store(endpoint: str, bucket: str) -> dict:
    """A config's store section with the tables and the run artifacts in a bucket of the local S3 server."""
    fs_options = {"endpoint_url": endpoint, "key": "test", "secret": "test",
                  "client_kwargs": {"region_name": "us-east-1"}}
    lance_options = {"aws_endpoint": endpoint, "aws_access_key_id": "test", "aws_secret_access_key": "test",
                     "aws_region": "us-east-1", "allow_http": "true"}
    return {"uri": f"s3://{bucket}/lancedb", "options": lance_options, "artifacts": f"s3://{bucket}/runs",
            "artifacts_options": fs_options}


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


def file_manifest(folder: Path) -> tuple[int, str]:
    """(files, sha256 over sorted "relative/path  sha256" lines) of a folder, bytecode caches aside: pins a package."""
    import hashlib

    files = sorted(f for f in folder.rglob("*") if f.is_file() and "__pycache__" not in f.relative_to(folder).parts)
    lines = "".join(f"{f.relative_to(folder).as_posix()}  {hashlib.sha256(f.read_bytes()).hexdigest()}\n"
                    for f in files)
    return len(files), hashlib.sha256(lines.encode()).hexdigest()


# The files that take longest (summed test time, longest first, measured with --durations on 2 cores). xdist's
# loadfile hands out whole files in collection order; one of these collected last would run alone at the end.
LONGEST_FIRST = ("test_watch.py", "test_cli.py", "test_runners.py", "test_isolation.py", "test_crash.py",
                 "test_real_server.py", "test_plan.py", "test_search_modes.py", "test_fuzz.py", "test_e5_onnx.py")


# Fixtures that start a Prefect server, an object store, a model server or a watcher: a test using any of them,
# directly or through another fixture, is a `flow` test, left out of `make test-fast` whether or not its file says so.
SERVER_FIXTURES = {"prefect_harness", "s3", "server", "watching"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Collect the longest test files first (a stable sort: the order within each file stays); mark server tests flow."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.flow)
