"""`inlet server`'s warm process: commands handed to it, declined when it would not run them as they would, stopped."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from runtime.warm import Declined, WarmServer, differences, environment, hand_over, socket_path
from runtime.worker import WarmWorker
from schemas.errors import WorkerDiedError

ROOT = Path(__file__).resolve().parent.parent
INLET = [sys.executable, "-m", "inlet.cli"]


def test_what_a_terminal_sets_does_not_keep_a_command_from_the_warm_process_but_a_key_does():
    base = {"HOME": "/home/a", "GEMINI_API_KEY": "secret-1", "TERM": "xterm", "PWD": "/a", "SSH_TTY": "/dev/pts/1"}
    other_terminal = {**base, "TERM": "screen", "PWD": "/b", "SSH_TTY": "/dev/pts/2", "SHLVL": "3",
                      "PREFECT_SERVER_API_HOST": "127.0.0.1"}  # `make server` sets it; it names the socket instead
    assert differences(environment(base), environment(other_terminal)) == []
    assert differences(environment(base), environment({**base, "GEMINI_API_KEY": "secret-2"})) == ["GEMINI_API_KEY"]
    assert differences(environment(base), environment({**base, "INLET_X": "1"})) == ["INLET_X"]
    assert "secret-1" not in repr(environment(base)), "values cross the socket as digests only"


def test_the_socket_is_the_checkouts_and_its_local_servers_or_none_when_off(monkeypatch):
    monkeypatch.delenv("INLET_WARM_SOCKET")
    monkeypatch.setenv("PREFECT_SERVER_API_PORT", "4311")
    default = socket_path()
    monkeypatch.setenv("PREFECT_SERVER_API_PORT", "4312")
    assert socket_path() != default, "another local server, another warm process"
    monkeypatch.setenv("INLET_WARM_SOCKET", "off")
    assert socket_path() is None
    assert hand_over("query", {}, lambda event: None) == Declined(None)


@pytest.fixture
def warm(tmp_path, monkeypatch):
    """A WarmServer over tests/grow_worker.py on a socket of this test's; records what it marked Crashed."""
    path = tmp_path / "warm.sock"
    monkeypatch.setenv("INLET_WARM_SOCKET", str(path))
    worker = WarmWorker("tests.grow_worker", ["warm"])
    worker.start()
    crashed: list[tuple] = []
    server = WarmServer(path, worker, environment(), os.getcwd(),
                        crashed=lambda run_ids: crashed.append(run_ids) or run_ids)
    server.listen()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.crashed_calls = crashed
    yield server
    server.close()
    worker.close()


def test_a_command_runs_in_the_warm_process_and_its_events_arrive_in_order_before_its_answer(warm):
    events: list = []
    assert hand_over("pid", {}, events.append) == warm.worker.pid() != os.getpid()
    assert hand_over("events", 3, events.append) == warm.worker.pid()
    assert events == [("event", 0), ("event", 1), ("event", 2)]
    with pytest.raises(ValueError, match="bad request"):
        hand_over("raise", "bad request", events.append)
    assert warm.status()["served"] == 3


def test_the_warm_process_declines_another_folder_another_environment_new_code_or_a_second_command(warm, tmp_path,
                                                                                                  monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "not the server's")
    declined = hand_over("pid", {}, lambda event: None)
    assert isinstance(declined, Declined) and "GEMINI_API_KEY" in declined.why
    monkeypatch.delenv("GEMINI_API_KEY")
    monkeypatch.chdir(tmp_path)
    assert "this command in" in hand_over("pid", {}, lambda event: None).why
    monkeypatch.chdir(warm.cwd)
    busy = threading.Thread(target=hand_over, args=("sleep", 2.0, lambda event: None))
    busy.start()
    time.sleep(0.5)
    assert hand_over("pid", {}, lambda event: None) == Declined("it is running another command")
    busy.join()
    old = warm.worker.pid()
    warm.code = ()  # as after an edit of Inlet's code: the next command is declined and a new worker starts
    assert "code" in hand_over("pid", {}, lambda event: None).why
    warm.settle()
    assert hand_over("pid", {}, lambda event: None) == warm.worker.pid() != old


def _leave(warm: WarmServer, command: str, kwargs: object, after_s: float = 1.0) -> None:
    """Send a request and close the connection after_s later, as a command stopped by Ctrl-C does."""
    import pickle

    from runtime.warm import PROTOCOL

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(warm.path))
    conn.sendall(pickle.dumps({"protocol": PROTOCOL, "command": command, "kwargs": kwargs, "cwd": os.getcwd(),
                               "env": environment(), "pid": os.getpid()}))
    time.sleep(after_s)
    conn.close()


def test_a_caller_that_goes_away_stops_its_run_which_is_marked_crashed_and_a_new_worker_takes_the_next(warm):
    old = warm.worker.pid()
    _leave(warm, "ingest", 60)
    deadline = time.monotonic() + 60
    while not warm.crashed_calls and time.monotonic() < deadline:
        time.sleep(0.1)
    assert warm.crashed_calls == [["run-1"]], "the flow run the stopped request named was marked Crashed"
    assert not _alive(old), "the busy worker was killed, not left running the request"
    warm.settle()
    assert hand_over("pid", {}, lambda event: None) not in (old, None)


def test_a_read_whose_caller_goes_away_is_let_finish_in_the_same_warm_worker(warm):
    old = warm.worker.pid()
    _leave(warm, "sleep", 2.0, after_s=0.5)
    time.sleep(2.5)
    assert warm.crashed_calls == [] and hand_over("pid", {}, lambda event: None) == old


def test_a_worker_that_dies_mid_command_reaches_the_caller_as_worker_died(warm):
    with pytest.raises(WorkerDiedError):
        hand_over("die", {}, lambda event: None)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_runs_a_stopped_request_named_are_marked_crashed_and_finished_ones_are_left_alone(prefect_harness):
    import asyncio

    from prefect import flow, get_client
    from prefect.states import Completed, Running

    from runtime.warm import crash_runs

    @flow(name="ingest")
    def stand_in() -> None:
        """Named as the ingest flow: its runs are made by hand, as a killed warm run leaves one."""

    async def make(state: object) -> str:
        async with get_client() as client:
            return str((await client.create_flow_run(stand_in, state=state)).id)

    async def state(run_id: str) -> str:
        async with get_client() as client:
            return (await client.read_flow_run(run_id)).state.type.value

    stopped, finished = asyncio.run(make(Running())), asyncio.run(make(Completed()))
    assert len(crash_runs([stopped, finished, stopped])) == 1
    assert asyncio.run(state(stopped)) == "CRASHED" and asyncio.run(state(finished)) == "COMPLETED"


@pytest.mark.slow
def test_inlet_server_runs_ingest_and_query_for_the_commands_and_declines_another_environment(
        markdown_corpus, write_config, prefect_harness, tmp_path):
    """The user's loop: `inlet server` in one terminal; `inlet ingest` and `inlet query` in another are taken by it."""
    from prefect.settings import PREFECT_API_URL

    api = str(PREFECT_API_URL.value())
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    # The session's Prefect server stands in for the one `inlet server` would start; the warm process is its own.
    env.update(PREFECT_SERVER_API_PORT=str(urlparse(api).port), INLET_WARM_SOCKET=str(tmp_path / "warm.sock"))
    config = write_config(markdown_corpus)
    server = subprocess.Popen([*INLET, "server", "--config", str(config)], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        ready = _wait_for(server, "ready in")
        assert f"from {ROOT} run in the warm process" in ready

        def run(*args: str, **extra: str) -> subprocess.CompletedProcess:
            return subprocess.run([*INLET, *args, "--config", str(config)], cwd=ROOT, env={**env, **extra},
                                  capture_output=True, text=True, timeout=300, check=False)

        ingest = run("ingest")
        assert ingest.returncode == 0, ingest.stderr[-2000:]
        assert "note:" not in ingest.stderr and "no Prefect server is running" not in ingest.stderr
        assert "Finished in state Completed()" in ingest.stderr, "the run's log lines reach the command's terminal"
        page = re.search(r"this run in the Prefect UI: (\S+)/runs/flow-run/[0-9a-f-]{36}", ingest.stdout)
        assert page and page[1] == api.removesuffix("/api"), ingest.stdout[-1000:]
        assert re.search(r"docs new\s+│ 1", ingest.stdout), ingest.stdout[-2000:]
        query = subprocess.run([sys.executable, "-X", "importtime", "-m", "inlet.cli", "query", "engine winterization",
                                "-k", "1", "--config", str(config)], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=300, check=False)
        assert query.returncode == 0 and "Engine winterization" in query.stdout, query.stderr[-2000:]
        assert not re.search(r"\| +(lancedb|pyarrow|prefect)$", query.stderr, re.M), "the command loads none of it"
        status = subprocess.run([*INLET, "server", "--status"], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=60, check=False)
        assert "2 commands run" in status.stdout, status.stdout + status.stderr
        other = run("query", "engine winterization", "-k", "1", GEMINI_API_KEY="another key")
        assert other.returncode == 0 and "Engine winterization" in other.stdout, other.stderr[-2000:]
        assert "did not take this command (its environment differs in GEMINI_API_KEY); running it here" in other.stderr
        broken = tmp_path / "broken.yaml"
        broken.write_text("sources:\n  - {name: a, path: docs}\nembeding: {kind: hashing}\n")
        refused = subprocess.run([*INLET, "ingest", "--config", str(broken)], cwd=ROOT, env=env, capture_output=True,
                                 text=True, timeout=300, check=False)
        assert refused.returncode == 2 and f"{broken}: embeding: Extra inputs are not permitted" in refused.stderr
        assert "Beginning flow run" not in refused.stderr, "a bad config fails before any flow run"
        bad = run("query", "x", "--mode", "semantic")
        assert bad.returncode == 2 and "mode 'semantic' is not one of" in bad.stderr, "errors keep their exit code"
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=120)
    assert server.returncode == 0, out[-2000:]
    assert not (tmp_path / "warm.sock").exists(), "a stopped server leaves no socket behind"


def _wait_for(proc: subprocess.Popen, text: str, timeout_s: float = 240) -> str:
    """Read proc's output until a line holds text; return that line (fail with the output if it exits first)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            pytest.fail("inlet server exited: " + "".join(seen)[-3000:])
        seen.append(line)
        if text in line:
            return line
    pytest.fail("inlet server was not ready in time: " + "".join(seen)[-3000:])


def test_make_server_takes_the_commands_a_user_types_by_hand_outside_make(tmp_path):
    """`make server` runs with the Makefile's exports; `.venv/bin/inlet ingest` typed in a shell has none of them."""
    probe = "import inlet.cli, json, runtime.warm; print(json.dumps(runtime.warm.environment()))"
    extra = tmp_path / "probe.mk"
    extra.write_text(f"probe:\n\t@{sys.executable} -c '{probe}'\n")
    plain = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MAKE")) and k not in
             ("NO_PROXY", "no_proxy", "HF_HUB_OFFLINE", "DO_NOT_TRACK", "SCARF_NO_ANALYTICS",
              "UNSTRUCTURED_DISABLE_NOTICE", "MFLAGS")}
    import json

    by_make = subprocess.run(["make", "-s", "-f", "Makefile", "-f", str(extra), "probe"], cwd=ROOT, env=plain,
                             capture_output=True, text=True, check=True, timeout=120)
    by_hand = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=plain, capture_output=True, text=True,
                             check=True, timeout=120)
    assert differences(json.loads(by_make.stdout), json.loads(by_hand.stdout)) == []
