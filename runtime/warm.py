"""The warm process behind `inlet server`: `inlet ingest` and `inlet query` hand their work to it over a local socket.

A command run by hand pays seconds before it does anything: Prefect's and LanceDB's imports (~4 s), the models,
great-expectations, a Prefect client. `inlet server` keeps one process that has paid them (a WarmWorker child,
runtime/worker.py) and listens on a Unix socket; a command that finds it sends its arguments, prints the log lines
and progress that come back as they happen, and exits with the answer's code. The run is the same flow run, in the
same Prefect UI.

A command hands its work over only when the warm process would run it as the command itself would:
- the same checkout (the socket is keyed by this code's folder) and the same working folder;
- the same environment, but for what a terminal sets (TERM, PWD, SSH_*...) and the local server's own settings
  (PREFECT_SERVER_*: its host and port name the socket): an API key, a PREFECT_API_URL or an
  INLET_* setting of a different value means the command runs in its own process, and says why;
- the same code: after an edit of Inlet's code or an install into the environment, the warm process declines
  and restarts itself in the background;
- no other command running in it (one at a time; a second command runs in its own process meanwhile).
A declined command runs as it always did, in its own process, and so does one whose warm process died under it.
Ctrl-C in `inlet ingest` kills the warm process's run (the pipeline converges from a kill at any point; the flow
runs it named are marked Crashed) and a new warm process starts; a query is let finish.

The socket lives in a folder only this user can enter ($XDG_RUNTIME_DIR, else the temp folder's inlet-<uid>);
INLET_WARM_SOCKET names another path, or "off" to never hand over (the test suite's default).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.prefect_api import LOCAL_PORT

ROOT = Path(__file__).resolve().parent.parent
SOCKET_ENV = "INLET_WARM_SOCKET"
PROTOCOL = 1  # bumped whenever a request's or an answer's shape changes
CONNECT_TIMEOUT_S = 1.0
# What differs between two terminals of one user without changing what a run does.
_TERMINAL = {"PWD", "OLDPWD", "SHLVL", "_", "TERM", "COLORTERM", "COLUMNS", "LINES", "TMUX", "TMUX_PANE", "STY",
             "WINDOW", "WINDOWID", "DISPLAY", "XAUTHORITY", "GPG_TTY", "PS1", "PS2", "PROMPT_COMMAND", "LS_COLORS",
             "VTE_VERSION", "INVOCATION_ID", "JOURNAL_STREAM", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKE_TERMOUT",
             "MAKE_TERMERR", "COLORFGBG", "HISTFILE", "HISTSIZE", "HISTFILESIZE", "HISTCONTROL", "LESSOPEN",
             "LESSCLOSE", "MAIL", "OLDPWD", "LINENO", "SHELL_SESSION_ID"}
_TERMINAL_PREFIXES = ("SSH_", "TERM_", "KITTY_", "ITERM_", "LC_TERMINAL", "VSCODE_", "WT_", "BASH_FUNC_", "DBUS_",
                      "XDG_SESSION", "PYTEST_",
                      "PREFECT_SERVER_")  # where the local server listens: part of the socket's name instead
_CODE_FOLDERS = ("flows", "tasks", "providers", "store", "runtime", "schemas", "query", "inlet")


@dataclass(frozen=True)
class Declined:
    """The warm process would not take this command (why), or none runs (why is None): run it here."""

    why: str | None


def socket_path() -> Path | None:
    """Where this checkout's warm process listens, or None when hand-over is off."""
    named = os.environ.get(SOCKET_ENV)
    if named == "off":
        return None
    if named:
        return Path(named)
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(tempfile.gettempdir(), f"inlet-{os.getuid()}")
    # One per checkout and local Prefect server (the environment's, as runtime/prefect_api.py reads it).
    host = os.environ.get("PREFECT_SERVER_API_HOST", "127.0.0.1")
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "", "localhost") else host
    key = f"{ROOT}|{host}:{os.environ.get('PREFECT_SERVER_API_PORT', LOCAL_PORT)}"
    return Path(base) / f"inlet-warm-{hashlib.sha256(key.encode()).hexdigest()[:12]}.sock"


def _private(folder: Path) -> bool:
    """Whether only this user can reach sockets in folder (another user's folder of that name is never trusted)."""
    try:
        info = folder.stat()
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that decides what a run does, each value as its sha256 (no secret crosses the socket)."""
    env = os.environ if env is None else env

    def canonical(name: str, value: str) -> str:
        if name.lower() == "no_proxy":  # a set of hosts: the Makefile and providers/offline.py order them apart
            return ",".join(sorted({h.strip() for h in value.split(",") if h.strip()}))
        return value

    return {name: hashlib.sha256(canonical(name, value).encode(errors="surrogateescape")).hexdigest()
            for name, value in env.items() if name not in _TERMINAL and not name.startswith(_TERMINAL_PREFIXES)}


def differences(ours: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The names of the variables set, unset or valued differently between two environment() maps."""
    return sorted(name for name in ours.keys() | theirs.keys() if ours.get(name) != theirs.get(name))


def code_state() -> tuple:
    """What the warm process's code and libraries were at its start: Inlet's modules and the installed packages."""
    import sysconfig

    files = []
    for folder in _CODE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            info = path.stat()
            files.append((str(path.relative_to(ROOT)), info.st_mtime_ns, info.st_size))
    # An install or uninstall adds or removes entries of site-packages, which moves its modification time.
    libraries = tuple(os.stat(sysconfig.get_paths()[key]).st_mtime_ns for key in ("purelib", "platlib"))
    return tuple(files), libraries


# ---- the command's side ----------------------------------------------------------------------------------------


def hand_over(command: str, kwargs: dict[str, Any], on_event: Callable[[Any], None]) -> Any:
    """Run command in the warm process: return its answer, or Declined (run it here).

    Events (log lines, progress) reach on_event as they happen. A KeyboardInterrupt while waiting closes the
    connection, which stops the run in the warm process; it is raised again here.
    """
    path = socket_path()
    if path is None or not path.exists() or not _private(path.parent):
        return Declined(None)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CONNECT_TIMEOUT_S)
    try:
        conn.connect(str(path))
    except OSError:  # a socket left by a killed server: nobody listens
        conn.close()
        return Declined(None)
    conn.settimeout(None)  # a run takes as long as it takes
    stream = conn.makefile("rwb")
    try:
        request = {"protocol": PROTOCOL, "command": command, "kwargs": kwargs, "cwd": os.getcwd(),
                   "env": environment(), "pid": os.getpid()}
        pickle.dump(request, stream, protocol=pickle.HIGHEST_PROTOCOL)
        stream.flush()
        while True:
            try:
                kind, value = pickle.load(stream)
            except (EOFError, OSError, pickle.UnpicklingError):
                # Gone mid-command (killed, out of memory): the command does the work itself; a run that was
                # stopped anywhere converges when run again, and the model cache keeps what it had paid for.
                return Declined("it closed the connection before answering (its terminal says why)")
            if kind == "event":
                on_event(value)
            elif kind == "declined":
                return Declined(value)
            elif kind == "raise":
                raise value
            else:
                return value
    finally:
        stream.close()
        conn.close()


# ---- the warm process's side -----------------------------------------------------------------------------------


class WarmServer:
    """Listen on socket_path() and run each request in a WarmWorker (flows/cli_worker.py), one at a time."""

    def __init__(self, path: Path, worker: Any, env: dict[str, str], cwd: str,
                 crashed: Callable[[list[str]], list[str]] = lambda run_ids: []) -> None:
        """worker: a started runtime.worker.WarmWorker; env, cwd: what `inlet server` was started with.

        crashed(run_ids): mark the flow runs a stopped or dead worker left Running as Crashed; return their names.
        """
        self.path, self.worker, self.env, self.cwd, self._crashed = path, worker, env, cwd, crashed
        self.code = code_state()
        self.started = time.time()
        self.served = 0
        self._busy = threading.Lock()  # held by the request running, and by a restart
        self._restarting: threading.Thread | None = None
        self._restart_lock = threading.Lock()  # a restart thread is seen by others only once it has started
        self._sock: socket.socket | None = None
        self._closed = threading.Event()

    def listen(self) -> None:
        """Bind the socket (in a folder only this user can enter), replacing one a killed server left."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(self.path.parent):
            raise PermissionError(f"{self.path.parent} is not this user's alone; set {SOCKET_ENV} to another path")
        if self.path.exists() and not stat.S_ISSOCK(self.path.stat().st_mode):
            raise FileExistsError(f"{self.path} is not a socket; set {SOCKET_ENV} to another path")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(self.path))
        except OSError:
            self.path.unlink(missing_ok=True)  # a socket nobody listens on
        else:
            probe.close()
            raise RuntimeError(f"another warm Inlet process listens on {self.path}")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self._sock.listen(8)

    def serve_forever(self) -> None:
        """Answer connections until close(); each in a thread of its own (a busy server declines at once)."""
        assert self._sock is not None
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed, or out of descriptors for a moment: only close() ends the loop
                time.sleep(0.1)
                continue
            threading.Thread(target=self._answer, args=(conn,), name="inlet-warm-request", daemon=True).start()

    def close(self) -> None:
        """Stop listening and remove the socket; a run in progress is stopped (marked Crashed) first."""
        self._closed.set()
        if self._sock is not None:
            self._sock.close()
        self.path.unlink(missing_ok=True)
        if self._busy.locked() and (self._restarting is None or not self._restarting.is_alive()):
            self.worker.abort()
            self._busy.acquire(timeout=60)  # its thread marks the run Crashed while the Prefect server still runs

    def status(self) -> dict:
        """What --status shows."""
        return {"pid": os.getpid(), "worker_pid": self.worker.pid(), "up_s": round(time.time() - self.started),
                "served": self.served, "busy": self._busy.locked(), "worker_replaced": self.worker.replaced}

    def settle(self, timeout_s: float = 120.0) -> None:
        """Wait for a restart in progress to end (tests; a command is declined meanwhile)."""
        with self._restart_lock:
            restarting = self._restarting
        if restarting is not None:
            restarting.join(timeout_s)

    def why_not(self, request: dict) -> str | None:
        """Why this request must run in its caller's process instead, or None (called holding the busy lock)."""
        if request.get("cwd") != self.cwd:
            return f"it runs in {self.cwd}, this command in {request.get('cwd')}"
        if names := differences(self.env, request.get("env", {})):
            return "its environment differs in " + ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
        if code_state() != self.code:
            self._restart("Inlet's code or its installed packages changed")
            return "Inlet's code or its installed packages changed since it started; it restarts meanwhile"
        if self.worker.pid() is None:  # it died between commands, or its last start failed
            self._restart("it was not running")
            return "it is starting"
        return None

    def _restart(self, why: str) -> None:
        """Start a new worker in the background, once the request running (if any) has ended."""
        with self._restart_lock:  # two callers at once start one restart; settle() never joins an unstarted one
            if self._closed.is_set() or (self._restarting is not None and self._restarting.is_alive()):
                return
            self._restarting = threading.Thread(target=self._restart_worker, args=(why,), name="inlet-warm-restart",
                                                daemon=True)
            self._restarting.start()

    def _restart_worker(self, why: str) -> None:
        """A restart's thread: a new worker, once the request running (if any) has ended."""
        with self._busy:  # never under a running request: it ends first (the caller declined meanwhile)
            if self._closed.is_set():
                return
            print(f"inlet server: restarting the warm process ({why})", file=sys.stderr, flush=True)
            self.worker.close()
            self.code = code_state()  # before the start: an edit during it restarts again
            try:
                self.worker.start()
                print(f"inlet server: the warm process (pid {self.worker.pid()}) is ready again",
                      file=sys.stderr, flush=True)
            except Exception as exc:  # noqa: BLE001 - commands run in their own processes until it works
                self.worker.close()
                print(f"inlet server: the warm process did not start ({type(exc).__name__}: {exc}); commands "
                      "run in their own processes until the next try", file=sys.stderr, flush=True)

    def _answer(self, conn: socket.socket) -> None:
        stream = conn.makefile("rwb")
        try:
            self._answer_on(conn, stream)
        except (OSError, EOFError, pickle.UnpicklingError):
            pass  # the caller went away; a stopped run was already handled
        finally:
            for closing in (stream, conn):
                try:
                    closing.close()
                except OSError:
                    pass

    def _answer_on(self, conn: socket.socket, stream: Any) -> None:
        request = pickle.load(stream)

        def send(kind: str, value: Any) -> None:
            pickle.dump((kind, value), stream, protocol=pickle.HIGHEST_PROTOCOL)
            stream.flush()

        if request.get("protocol") != PROTOCOL:
            send("declined", "the warm process runs another version of Inlet's protocol")
            return
        if request.get("command") == "status":
            send("ok", self.status())
            return
        if self._restarting is not None and self._restarting.is_alive():
            send("declined", "it is restarting")
            return
        if not self._busy.acquire(blocking=False):
            send("declined", "it is running another command")
            return
        try:
            why = self.why_not(request)
            answer = ("declined", why) if why is not None else self._run(conn, request, send)
        finally:
            self._busy.release()  # before the answer: a caller that has it finds the warm process free
        if answer is not None:
            send(*answer)

    def _run(self, conn: socket.socket, request: dict, send: Callable[[str, Any], None]) -> tuple[str, Any] | None:
        """Run the request, sending its events as they come; return its answer (None when its caller is gone)."""
        from schemas.errors import WorkerDiedError

        # A query is let finish when its caller goes: nothing to stop, and a restart costs more.
        caller = _Caller(conn, send, self.worker, stops=request["command"] == "ingest")
        try:
            answer = self.worker.call((request["command"], request["kwargs"]), on_event=caller.forward)
        except WorkerDiedError as exc:
            caller.finish()
            names = self._crashed(caller.run_ids) if caller.run_ids else []
            why = "its caller went away" if caller.gone.is_set() else "it died"
            print(f"inlet server: the run of `inlet {request['command']}` was stopped ({why})"
                  + (f"; marked Crashed: {', '.join(names)}" if names else ""), file=sys.stderr, flush=True)
            self._restart("its last run was stopped")
            return None if caller.gone.is_set() else ("raise", exc)
        except Exception as exc:  # noqa: BLE001 - the command's own error, for its caller to report
            answer, kind = exc, "raise"
        else:
            kind = "ok"
        caller.finish()
        self.served += 1
        return None if caller.gone.is_set() else (kind, answer)


class _Caller:
    """One request's caller, watched while its request runs: events go to it; if it goes, the run may be stopped."""

    def __init__(self, conn: socket.socket, send: Callable[[str, Any], None], worker: Any, stops: bool) -> None:
        self._send, self._worker, self._stops = send, worker, stops
        self._pid = worker.pid()  # the process this request runs in: a late abort must never reach the next one's
        self._state = threading.Lock()
        self._done = threading.Event()
        self.gone = threading.Event()
        self.run_ids: list[str] = []  # the flow runs the request named: what to mark Crashed if it is stopped
        threading.Thread(target=self._watch, args=(conn,), name="inlet-warm-caller", daemon=True).start()

    def _watch(self, conn: socket.socket) -> None:
        # The caller sends nothing after its request: end of file means it is gone (Ctrl-C, a kill).
        try:
            data = conn.recv(1)
        except OSError:
            data = b""
        if not data:
            self._left()

    def _left(self) -> None:
        with self._state:
            if self._done.is_set() or self.gone.is_set():
                return
            self.gone.set()
            if self._stops:
                self._worker.abort(self._pid)

    def forward(self, event: Any) -> None:
        """Pass one of the worker's events on (a ("run", id) is kept here instead)."""
        if event[0] == "run":
            self.run_ids.append(event[1])
            return
        if self.gone.is_set():
            return
        try:
            self._send("event", event)
        except OSError:
            self._left()

    def finish(self) -> None:
        """The request has ended: its caller leaving now stops nothing."""
        with self._state:
            self._done.set()


def ask_status() -> dict | None:
    """What the running warm process says of itself, or None when none answers."""
    answer = hand_over("status", {}, lambda event: None)
    return None if isinstance(answer, Declined) else answer



def crash_runs(run_ids: list[str]) -> list[str]:
    """Mark these flow runs Crashed where they are still Running or Pending (their process was killed); their names."""
    from prefect import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    crashed = []
    with get_client(sync_client=True) as client:
        for run_id in dict.fromkeys(run_ids):
            run = client.read_flow_run(run_id)
            if run.state is None or run.state.type not in (StateType.RUNNING, StateType.PENDING):
                continue
            client.set_flow_run_state(run.id, Crashed(message="its `inlet` command was interrupted, or the warm "
                                                      "process running it died; the next run converges from "
                                                      "where it stopped"), force=True)
            crashed.append(run.name)
    return crashed


def _say(message: str) -> None:
    print(f"inlet server: {message}", file=sys.stderr, flush=True)


def _stop_on_sigterm() -> None:
    """A service manager's SIGTERM stops `inlet server` as Ctrl-C does."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def supervise(url: str, *, server_env: dict[str, str] | None, warm_config: str | None, caller_env: dict[str, str],
              worker_module: str) -> int:
    """Run `inlet server` until Ctrl-C or its Prefect server exits; return the exit code.

    server_env: start the Prefect server with this environment (None: one already answers at url).
    warm_config: the config the warm process warms up for (None: no warm process).
    caller_env: environment() as `inlet server` was started, which a command's must match to be taken.
    worker_module: the warm process's module (its worker_main), flows/cli_worker.py.
    Stopping goes in order: no new command, the run in progress stopped and marked Crashed, the warm process,
    then the Prefect server (in a session of its own, so that the terminal's Ctrl-C reaches it only through here).
    """
    import signal
    import subprocess

    from runtime.prefect_api import answers

    _stop_on_sigterm()
    ui = url.removesuffix("/api")
    proc: subprocess.Popen | None = None
    started: list[tuple[Any, WarmServer | None]] = []

    def start_warm(path: Path) -> None:
        try:
            started.append(_start_warm(url, path, warm_config, caller_env, worker_module))
        except Exception as exc:  # noqa: BLE001 - the Prefect server goes on; commands run in their own processes
            _say(f"no warm process ({type(exc).__name__}: {exc}); inlet commands run in their own processes")

    try:
        if server_env is not None:
            _say(f"starting the Prefect server: API {url}, UI {ui} (Ctrl-C stops it)")
            proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start"], env=server_env,
                                    start_new_session=True)
        path = socket_path()
        if warm_config is not None and path is not None:  # warms up while the Prefect server starts, and waits for it
            threading.Thread(target=start_warm, args=(path,), name="inlet-warm-start", daemon=True).start()
        while proc is not None and not answers(url, timeout_s=2.0):
            if proc.poll() is not None:
                return proc.returncode or 1
            time.sleep(0.2)
        while proc is None or proc.poll() is None:
            time.sleep(0.5)
        _say(f"the Prefect server exited (code {proc.returncode})")
        return proc.returncode or 1
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stopping short
        for worker, warm in started:
            if warm is not None:
                warm.close()
            if worker is not None:
                worker.close()
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _start_warm(url: str, path: Path, config: str, caller_env: dict[str, str],
                worker_module: str) -> tuple[Any, WarmServer | None]:
    """Start the warm process and listen for commands; if it cannot start, say why (commands then run alone)."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    from runtime.worker import WarmWorker

    api = get_current_settings().api.url or url  # a configured API wins, for the warm runs as for any command
    worker = WarmWorker(worker_module, [config], env={"PREFECT_API_URL": api})

    def crashed(run_ids: list[str]) -> list[str]:
        with temporary_settings(updates={PREFECT_API_URL: api}):
            return crash_runs(run_ids)

    _say("warming up Inlet (Prefect, LanceDB, the models, great-expectations) ...")
    begin = time.monotonic()
    try:
        ready = worker.start()
        warm = WarmServer(path, worker, caller_env, os.getcwd(), crashed=crashed)
        warm.listen()
    except Exception as exc:  # noqa: BLE001 - the Prefect server goes on; commands run in their own processes
        worker.close()
        _say(f"no warm process ({type(exc).__name__}: {exc}); inlet commands run in their own processes")
        return None, None
    threading.Thread(target=warm.serve_forever, name="inlet-warm-accept", daemon=True).start()
    loaded = ", ".join(f"{name} {s:.1f} s" for name, s in ready.get("warmed", {}).items() if s is not None)
    _say(f"ready in {time.monotonic() - begin:.1f} s ({loaded}): `inlet ingest` and `inlet query` from {os.getcwd()} "
         f"run in the warm process (pid {worker.pid()}); the UI is at {url.removesuffix('/api')}")
    return worker, warm
