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
