"""The inlet command as a user runs it: in a subprocess, with its exit codes and output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

INLET = [sys.executable, "-m", "inlet.cli"]
# Validation off where a test reads a command's output, not its checks: each such inlet process then neither imports
# nor warms great-expectations (~5 s of CPU, taken from the tests beside it). The first test's ingest keeps it on.
NOT_THE_POINT = {"enabled": False}


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*INLET, *args], check=False, capture_output=True, text=True, timeout=300, env=env,
                          cwd=Path(__file__).resolve().parent.parent)


@pytest.fixture
def server_env(prefect_harness) -> dict[str, str]:
    """The environment of a user whose runs go to a Prefect server (the session's): no temporary server each run.

    The ingest of test_ingest_then_query_from_the_command_line keeps the plain environment: a temporary server is
    tested too.
    """
    from prefect.settings import PREFECT_API_URL

    return {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}


@pytest.fixture
def markdown_docs(markdown_corpus: Path) -> Path:
    """Three Markdown documents (the sample's guide and two more): read in the inlet process itself.

    For the commands' output, where the formats play no part: a PDF, DOCX or HTML file makes each inlet process start
    extraction workers (~10 s of CPU, taken from the tests beside it).
    """
    (markdown_corpus / "ferry.md").write_text("# Ferry\n\nThe ferry leaves the north pontoon at nine.\n",
                                              encoding="utf-8")
    (markdown_corpus / "tides.md").write_text("# Tides\n\nHigh water at the pontoon is an hour after the harbour's."
                                              "\n", encoding="utf-8")
    return markdown_corpus


def test_bad_config_exits_2_naming_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources:\n  - {name: a, path: docs}\nembeding: {kind: hashing}\n")
    out = _run("ingest", "--config", str(bad))
    assert out.returncode == 2
    assert f"{bad}: embeding: Extra inputs are not permitted" in out.stderr


def test_missing_source_folder_exits_2_naming_the_key(tmp_path, server_env):
    config = tmp_path / "inlet.yaml"
    config.write_text(f"sources:\n  - {{name: docs, path: {tmp_path / 'nowhere'}}}\n")
    out = _run("ingest", "--config", str(config), env=server_env)
    assert out.returncode == 2
    assert f"{config}: sources.0.path: source 'docs' folder" in out.stderr


def test_ingest_then_query_from_the_command_line(corpus, write_config, server_env):
    config = write_config(corpus)
    ingest = _run("ingest", "--config", str(config), "--json")
    assert ingest.returncode == 0, ingest.stderr[-2000:]
    # No PREFECT_API_URL and no local server: a temporary one, and the user is told once how to do without it.
    assert ingest.stderr.count("no Prefect server is running") == 1 and "`make server`" in ingest.stderr
    summary = json.loads(ingest.stdout[ingest.stdout.index("{"):])
    assert summary["docs_new"] == 5 and summary["texts_embedded"] > 0
    query = _run("query", "wind limits for laser dinghies", "-k", "1", "--where", "tags=sailing",
                 "--config", str(config))
    assert query.returncode == 0, query.stderr[-2000:]
    assert "Safety policy > Wind limits" in query.stdout and "Laser dinghies | 20 knots" in query.stdout
    hybrid = _run("query", "laser dinghies wind", "-k", "2", "--mode", "hybrid", "--neighbors", "1",
                  "--as-of", summary["run_id"], "--config", str(config))
    assert hybrid.returncode == 0, hybrid.stderr[-2000:]
    assert "[2]" in hybrid.stdout and "    ... " in hybrid.stdout
    listed = _run("versions", "--config", str(config))
    assert listed.returncode == 0 and summary["run_id"] in listed.stdout, listed.stderr[-2000:]
    same = _run("diff", summary["run_id"], summary["run_id"], "--config", str(config))
    assert same.returncode == 0 and "0 added, 0 removed" in same.stdout, same.stderr[-2000:]
    bad = _run("query", "x", "--mode", "semantic", "--config", str(config))
    assert bad.returncode == 2 and "mode 'semantic' is not one of" in bad.stderr
    kept = _run("maintain", "--config", str(config), env=server_env)  # the ingest above tried the temporary server
    assert kept.returncode == 0 and "0 integrity findings" in kept.stdout, kept.stderr[-2000:]
    assert "chunks" in kept.stdout and "documents" in kept.stdout


def test_ingest_uses_the_local_server_that_answers_and_links_its_run(markdown_corpus, write_config,
                                                                     prefect_harness):
    """With no PREFECT_API_URL, a run goes to the server at Prefect's server host and port, if one answers there."""
    import asyncio
    from urllib.parse import urlparse

    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    api = str(PREFECT_API_URL.value())
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_SERVER_API_PORT"] = str(urlparse(api).port)  # the session's server stands in for `inlet server`
    out = _run("ingest", "--config", str(write_config(markdown_corpus, quality=NOT_THE_POINT)), env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "no Prefect server is running" not in out.stderr
    page = re.search(r"this run in the Prefect UI: (\S+)/runs/flow-run/([0-9a-f-]{36})", out.stdout)
    assert page and page[1] == api.removesuffix("/api"), out.stdout[-1000:]

    async def _state() -> str:
        async with get_client() as client:
            return (await client.read_flow_run(page[2])).state.type.value

    assert asyncio.run(_state()) == "COMPLETED"  # the run the link names is in that server, finished


def test_server_status_says_where_the_local_server_is_or_how_to_start_it(prefect_harness):
    from urllib.parse import urlparse

    from prefect.settings import PREFECT_API_URL

    api = str(PREFECT_API_URL.value())
    env = {**{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"},
           "PREFECT_SERVER_API_PORT": str(urlparse(api).port)}
    up = _run("server", "--status", env=env)
    assert up.returncode == 0 and f"answers at {api}" in up.stdout, up.stdout + up.stderr
    down = _run("server", "--status")  # the tests' port, where nothing listens (tests/conftest.py)
    assert down.returncode == 1 and "`make server`" in down.stdout, down.stdout + down.stderr


def test_sweep_weights_are_parsed_or_refused_with_the_expected_form():
    from inlet.cli import _weights

    assert _weights("1:0.5") == (1.0, 0.5)
    for bad in ("1", "a:b", "1:2:3", "-1:1"):
        with pytest.raises(ValueError, match="--sweep"):
            _weights(bad)


def test_ingest_shows_a_bar_over_the_batches_and_a_summary_table_or_nothing_when_quiet(markdown_docs, write_config,
                                                                                        server_env):
    corpus = markdown_docs
    config = write_config(corpus, quality=NOT_THE_POINT)
    shown = _run("ingest", "--config", str(config), env=server_env)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert re.search(r"batches\s.*3/3", shown.stderr), "documents done, batch by batch"
    assert "docs new" in shown.stdout and "table versions" in shown.stdout
    # A Markdown edit: read in the run's own process, so the quiet run starts no extraction worker just for it.
    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text() + "\n## Crane\n\nThe crane stands beside the slipway.\n")
    quiet = _run("ingest", "--quiet", "--config", str(config), env=server_env)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stdout == "" and "| INFO" not in quiet.stderr and not re.search(r"batches\s.*\d+/\d+", quiet.stderr)


def test_plan_prints_the_model_work_and_cost_and_changes_nothing(markdown_docs, write_config, server_env):
    config = write_config(markdown_docs, quality=NOT_THE_POINT)
    out = _run("plan", "--config", str(config), env=server_env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "nothing written, no model called" in out.stdout and "new documents: 3 documents" in out.stdout
    assert "cost (est.)" in out.stdout and "time (est.)" in out.stdout
    stopped = _run("ingest", "--config", str(config), "--max-cost-usd", "0", env=server_env)
    assert stopped.returncode == 0, "a local model costs nothing: within any ceiling"
    listed = _run("versions", "--config", str(config))
    assert listed.returncode == 0 and listed.stdout.count("run-") == 1, "the plan is no run"
