"""Which Prefect API a command's flow runs talk to: the configured one, the local server if it answers, or a temporary one.

Prefect's own rule comes first: a PREFECT_API_URL in the environment or the active profile is used as it is. Without
one, Prefect would start a temporary server for every process (~8 s, and its runs vanish with it), so Inlet first
looks for the local server that `inlet server` (or `make server`) keeps running where Prefect's own server settings
say (PREFECT_SERVER_API_HOST and PREFECT_SERVER_API_PORT; Inlet's default port is 4311), and uses it when its health
check answers within a moment. Nothing else changes: a command still works with no server running.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

LOCAL_PORT = "4311"  # Inlet's local server, off Prefect's default 4200 so that it never meets another project's
# Long enough for a busy local server to answer its health check, short enough that a command with no server
# running is not held up (a refused connection answers at once; only a hung server waits this long).
HEALTH_TIMEOUT_S = 1.0
START_HINT = ("no Prefect server is running, so this command starts a temporary one (~10 s) and its runs are "
              "gone when it ends. Start one that stays, in another terminal: `make server` (or `inlet server`); "
              "every command then uses it and shows its runs in the UI at {ui}")


@dataclass(frozen=True)
class PrefectApi:
    """The API a command uses: its URL (None for a temporary server), where it came from, and the UI's address."""

    url: str | None
    source: Literal["settings", "local", "temporary"]
    ui: str | None

    def flow_run_page(self, flow_run_id: object) -> str | None:
        """The UI page of one flow run, or None when its server does not outlive the command."""
        return f"{self.ui}/runs/flow-run/{flow_run_id}" if self.ui and self.source != "temporary" else None


def default_local_port() -> None:
    """Make Inlet's port the local server's unless PREFECT_SERVER_API_PORT is set; call before Prefect loads."""
    os.environ.setdefault("PREFECT_SERVER_API_PORT", LOCAL_PORT)


def local_server_url() -> str:
    """The API URL of the local server: Prefect's server host and port settings (default 127.0.0.1:4311)."""
    from prefect.settings import get_current_settings

    api = get_current_settings().server.api
    host = "127.0.0.1" if api.host in ("0.0.0.0", "::", "") else api.host  # a wildcard bind answers on loopback
    return f"http://{host}:{api.port}/api"


def answers(api_url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """Whether a Prefect server answers its health check at api_url."""
    import httpx

    try:
        response = httpx.get(f"{api_url}/health", timeout=timeout_s, trust_env=False)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and response.text.strip() == "true"


def choose_api() -> PrefectApi:
    """The configured API if any, else the local server if it answers, else a temporary server."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url:
        return PrefectApi(settings.api.url, "settings", settings.ui_url)
    local = local_server_url()
    ui = local.removesuffix("/api")
    if answers(local):
        return PrefectApi(local, "local", ui)
    return PrefectApi(None, "temporary", ui)


@contextlib.contextmanager
def use_prefect_api() -> Iterator[PrefectApi]:
    """Run the body against choose_api()'s API: this process through Prefect's settings, its children by environment."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api = choose_api()
    if api.source != "local":
        yield api
        return
    before = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = api.url  # worker processes (inlet watch's) read it at their own start
    try:
        with temporary_settings(updates={PREFECT_API_URL: api.url}):
            yield api
    finally:
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before
