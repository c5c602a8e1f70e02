"""Which Prefect API a command uses, and the temporary server it starts when none answers (runtime/prefect_api.py)."""

from __future__ import annotations

import pytest

from runtime.prefect_api import PrefectApi, TemporaryServer, answers, choose_api
from schemas.errors import PrefectServerError

pytestmark = pytest.mark.flow


def test_a_temporary_server_answers_until_it_is_stopped():
    server = TemporaryServer()
    try:
        server.wait_ready(90)
        assert answers(server.url)
    finally:
        server.stop()
    assert not answers(server.url)


def test_a_temporary_server_that_cannot_start_is_an_error_quoting_its_output(tmp_path, monkeypatch):
    """A server that dies at start is said, with its own words, not waited for until the time-out."""
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/prefect.db")
    server = TemporaryServer()
    with pytest.raises(PrefectServerError, match="exited with code") as caught:
        server.wait_ready(90)
    assert "its output" in str(caught.value) and len(str(caught.value)) > 120


def test_the_configured_api_wins_and_no_server_is_probed(prefect_harness):
    from prefect.settings import PREFECT_API_URL

    api = choose_api()
    assert api == PrefectApi(str(PREFECT_API_URL.value()), "settings", api.ui)
    assert api.flow_run_page("x") == f"{api.ui}/runs/flow-run/x"


def test_without_a_configured_api_nor_a_local_server_a_temporary_one_is_chosen(prefect_harness):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # the tests' local port has no server
        api = choose_api()
    assert api.source == "temporary" and api.url is None and api.flow_run_page("x") is None


def test_an_early_server_starts_only_where_no_api_is_set_and_nothing_listens_on_the_local_port(monkeypatch, tmp_path):
    import socket

    from runtime.prefect_api import early_server

    monkeypatch.chdir(tmp_path)  # no prefect.toml, .env or pyproject.toml naming an API here
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert early_server() is None, "an API in the environment: no guess needed"
    monkeypatch.delenv("PREFECT_API_URL")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "profiles.toml").write_text('active = "x"\n[profiles.x]\nPREFECT_API_URL = "http://h/api"\n')
    assert early_server() is None, "a profile may name an API: Prefect's settings decide, later"
    (tmp_path / "home" / "profiles.toml").unlink()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        monkeypatch.setenv("PREFECT_SERVER_API_PORT", str(listening.getsockname()[1]))
        assert early_server() is None, "something listens on the local port: choose_api() probes it"
    server = early_server()  # the port is closed again
    assert server is not None
    try:
        server.wait_ready(90)
        assert answers(server.url)
    finally:
        server.stop()


def test_an_early_server_is_stopped_unused_when_the_settings_name_an_api(prefect_harness):
    from prefect.settings import PREFECT_API_URL

    from runtime.prefect_api import use_prefect_api

    early = TemporaryServer()
    early.wait_ready(90)
    with use_prefect_api(early=early) as api:
        assert api.source == "settings" and api.url == str(PREFECT_API_URL.value())
        assert not answers(early.url), "the early server was stopped, not left running beside the configured API"


def test_under_a_temporary_server_runs_send_no_heartbeats_and_the_server_registers_no_block_types(monkeypatch, tmp_path):
    """Its server runs no services, so heartbeats would go unread; block types are the lasting server's to register."""
    import httpx
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from runtime.prefect_api import use_prefect_api

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))  # the server's own database, new: nothing registered
    # As a command with no API configured, and heartbeats on (the session's own test server has them off).
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}, restore_defaults={PREFECT_API_URL}):
        with use_prefect_api() as api:
            assert api.source == "temporary"
            assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is None
            url = str(PREFECT_API_URL.value())
            response = httpx.post(f"{url}/block_types/filter", json={}, trust_env=False, timeout=30)
        assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() == 30
    assert response.status_code == 200 and response.json() == []
    assert not (tmp_path / "home" / "memo_store.toml").exists(), "no collection was loaded to hash the block types"
