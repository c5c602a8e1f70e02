"""Which Prefect API a command's flow runs talk to: the configured one, the local server if it answers, or a temporary one.

Prefect's own rule comes first: a PREFECT_API_URL in the environment or the active profile is used as it is. Without
one, Prefect would start a temporary server for every process (seconds each, and no UI to look at), so Inlet first
looks for the local server that `inlet server` (or `make server`) keeps running where Prefect's own server settings
say (PREFECT_SERVER_API_HOST and PREFECT_SERVER_API_PORT; Inlet's default port is 4311), and uses it when its health
check answers within a moment. With none, the command starts a TemporaryServer of its own and still works.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

LOCAL_PORT = "4311"  # Inlet's local server, off Prefect's default 4200 so that it never meets another project's
# Long enough for a busy local server to answer its health check, short enough that a command with no server
# running is not held up (a refused connection answers at once; only a hung server waits this long).
HEALTH_TIMEOUT_S = 1.0
START_HINT = ("no Prefect server is running, so this command starts a temporary one (a few seconds more, and no UI). "
              "Keep one running in another terminal, `make server` (or `inlet server`): every command then uses it, "
              "and its UI at {ui} shows their runs")


@dataclass(frozen=True)
class PrefectApi:
    """The API a command uses: its URL (None for a temporary server), where it came from, and the UI's address."""

    url: str | None
    source: Literal["settings", "local", "temporary"]
    ui: str | None

    def flow_run_page(self, flow_run_id: object) -> str | None:
        """The UI page of one flow run, or None when its server does not outlive the command."""
        return f"{self.ui}/runs/flow-run/{flow_run_id}" if self.ui and self.source != "temporary" else None


def local_defaults() -> None:
    """Make Inlet's port the local server's, and the checkout's .prefect Prefect's home, unless set; before Prefect loads.

    The home is the Makefile's too: `make server` and a command typed by hand then share one Prefect database, one
    profile and one warm process (runtime/warm.py compares environments). Not where ~/.prefect's profiles name an
    API: that user's runs go where their profile says, as Prefect's own rule has it.
    """
    os.environ.setdefault("PREFECT_SERVER_API_PORT", LOCAL_PORT)
    try:  # a user whose own Prefect profile names an API (Prefect Cloud, a team server) keeps it
        theirs = "PREFECT_API_URL" in (Path.home() / ".prefect" / "profiles.toml").read_text(errors="replace")
    except OSError:
        theirs = False
    if not theirs:
        os.environ.setdefault("PREFECT_HOME", str(Path(__file__).resolve().parent.parent / ".prefect"))


def local_server_url() -> str:
    """The API URL of the local server: Prefect's server host and port settings (default 127.0.0.1:4311)."""
    from prefect.settings import get_current_settings

    api = get_current_settings().server.api
    host = "127.0.0.1" if api.host in ("0.0.0.0", "::", "") else api.host  # a wildcard bind answers on loopback
    return f"http://{host}:{api.port}/api"


def answers(api_url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """Whether a Prefect server answers its health check at api_url (directly, never through a proxy).

    The standard library's client, not httpx: httpx builds an SSL context for every client (~60 ms of CPU), and
    TemporaryServer.wait_ready asks every 50 ms, on the core the booting server would otherwise have to itself.
    """
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(api_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        return False
    kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    connection = kind(url.hostname, url.port, timeout=timeout_s)
    try:
        connection.request("GET", f"{url.path.rstrip('/')}/health")
        response = connection.getresponse()
        return response.status == 200 and response.read().strip() == b"true"
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


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


class TemporaryServer:
    """A Prefect server for one command (`prefect server start --no-services --no-ui` on a free loopback port).

    Prefect's own ephemeral mode starts the same server at the first flow run, after the command's imports; started
    here, before them, it boots on the other core while they load (no-op ingest ~10 s instead of ~17). It stops at
    interpreter exit, after Prefect has sent the run's last events and logs (those are drained at thread shutdown,
    before atexit handlers run). Its output goes to a log file, quoted if it fails to start.
    """

    def __init__(self) -> None:
        import socket
        import subprocess
        import sys
        import tempfile

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/api"
        self._log = tempfile.NamedTemporaryFile(prefix="inlet-prefect-server-", suffix=".log", delete=False)  # noqa: SIM115 - lives as long as the server
        env = {**os.environ, "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(port),
               # Block types are registered by the lasting server (`inlet server`, full start); a temporary one
               # would first import every installed collection (prefect-dask brings dask: ~0.8 s of its start)
               # only to hash them, and no Inlet flow reads a block type. Prefect's own settings, off here only.
               "PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "false",
               "PREFECT_SERVER_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false"}
        env.pop("PREFECT_API_URL", None)
        self._proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--no-services", "--no-ui"],
                                      env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        atexit.register(self.stop)

    def wait_ready(self, timeout_s: float) -> None:
        """Return once the server answers its health check; raise PrefectServerError if it exits or times out."""
        import time

        from schemas.errors import PrefectServerError

        deadline = time.monotonic() + timeout_s
        while not answers(self.url, timeout_s=2.0):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                why = (f"exited with code {self._proc.returncode}" if self._proc.poll() is not None
                       else f"did not answer within {timeout_s:g} s (PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")
                self._log.flush()
                tail = Path(self._log.name).read_text(errors="replace")[-2000:]
                self.stop()
                msg = f"the temporary Prefect server {why}; its output ({self._log.name}):\n{tail}"
                raise PrefectServerError(msg)
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server and wait for it (its database is then closed); remove its log."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - a server that ignores SIGTERM for 30 s is killed
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)


def _api_maybe_configured() -> bool:
    """Whether a Prefect API URL may be configured outside the environment (a profile, prefect.toml, .env, pyproject).

    Only decides whether to start a temporary server early: choose_api() reads Prefect's own settings all the same.
    """
    home = Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()
    files = {home / "profiles.toml": "PREFECT_API_URL", Path("prefect.toml"): "", Path(".env"): "PREFECT_API",
             Path("pyproject.toml"): "tool.prefect"}
    for path, mark in files.items():
        try:
            if mark in path.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def early_server() -> TemporaryServer | None:
    """Start a temporary server now, before Prefect loads (~1.7 s), if no API is configured and no local server listens.

    A guess made without Prefect's settings, so that the server boots on the other core while they load; when the
    settings do name an API after all, use_prefect_api() stops it unused.
    """
    import socket

    if os.environ.get("PREFECT_API_URL") or _api_maybe_configured():
        return None
    host = os.environ.get("PREFECT_SERVER_API_HOST", "127.0.0.1")
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    try:
        with socket.create_connection((host, int(os.environ.get("PREFECT_SERVER_API_PORT", LOCAL_PORT))), timeout=0.2):
            return None  # something listens there: choose_api() asks whether it is a Prefect server
    except (OSError, ValueError):
        return TemporaryServer()


@contextlib.contextmanager
def use_prefect_api(meanwhile: Callable[[], object] | None = None,
                    early: TemporaryServer | None = None) -> Iterator[PrefectApi]:
    """Run the body against choose_api()'s API: this process through Prefect's settings, its children by environment.

    With neither a configured API nor a local server, a TemporaryServer is started at once (or early's, started before
    Prefect loaded) and used; meanwhile (the flow modules' imports, say) runs while it boots, and the body starts once
    it answers. An early server that is not needed is stopped.
    """
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    api = choose_api()
    if early is not None and api.source != "temporary":
        early.stop()
        early = None
    if api.source == "settings":
        if meanwhile:
            meanwhile()
        yield api
        return
    server = (early or TemporaryServer()) if api.source == "temporary" else None
    url = server.url if server else api.url
    before = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url  # worker processes (inlet watch's) read it at their own start
    updates: dict = {PREFECT_API_URL: url}
    if server:
        # A temporary server runs no services (--no-services): nothing stores its heartbeat events or marks a run
        # crashed for want of them, and a flow run ends by joining its heartbeat thread, which sleeps in whole
        # seconds (0-1 s a run). With a lasting server, heartbeats stay on: its services read them.
        updates[PREFECT_FLOWS_HEARTBEAT_FREQUENCY] = None
    try:
        with temporary_settings(updates=updates):
            if meanwhile:
                meanwhile()
            if server:
                server.wait_ready(float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()))
            yield api
    finally:
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before
