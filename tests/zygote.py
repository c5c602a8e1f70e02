"""A process that imports the ingest flow once, then forks one child per run asked of it.

The crash tests kill many runs with SIGKILL; each killed run is still a process of its own (the forked
child), but the ~7 s of imports, and the great-expectations context, tokenizer and language model that a run
loads on first use (~5 s more), are paid once per zygote instead of once per run. The zygote itself never
touches a store before forking (LanceDB re-creates its event loop in a forked child; nothing is in flight).
Protocol: one JSON request a line on stdin ({"config", "env", "log"}), one exit code a line on stdout
(negative: killed by that signal).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import traceback
import warnings
from pathlib import Path
from typing import Self

ROOT = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT_S = 300


class Zygote:
    """A zygote process driven from a test: run(config, env, log) forks a run and returns its exit code."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.zygote"], cwd=ROOT, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            self.close()
            msg = f"the zygote did not start (said {ready!r}, exit {self.proc.returncode})"
            raise RuntimeError(msg)

    def run(self, config: Path, env: dict[str, str], log: Path) -> int:
        """Run the ingest flow on config in a forked child with env added; return its exit code."""
        self.proc.stdin.write(json.dumps({"config": str(config), "env": env, "log": str(log)}) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if not answer:
            msg = f"the zygote died (exit {self.proc.wait(timeout=30)})"
            raise RuntimeError(msg)
        return int(answer)

    def close(self) -> None:
        """End the zygote (its children have all been waited for)."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child(request: dict) -> None:
    """In the forked child: output to the log file, the request's environment, one flow run, then exit."""
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(request["env"])
    signal.alarm(CHILD_TIMEOUT_S)  # a run that hangs dies by SIGALRM, and the test says where it was not killed
    code = 0
    try:
        from prefect.settings import (
            PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
            temporary_settings,
        )

        from flows.ingest import ingest

        # No heartbeats, as in the test process (tests/conftest.py): a run that ends would wait up to 1 s for them.
        with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            ingest(config_path=request["config"])
    except BaseException:  # noqa: BLE001 - the log says what, the exit code says that it failed
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no atexit handlers or buffers of the zygote's run twice


def main() -> None:
    """Import the flow, say ready, then fork and wait for one child per request line."""
    import great_expectations  # noqa: F401

    import flows.ingest  # noqa: F401 - the point: imported once, before any fork
    from providers import tokenizer
    from providers.langid import language_identifier

    # What a run loads on first use, each child paid again (~5 s here, GX's import most of it): loaded once.
    tokenizer.warm()
    language_identifier()

    warnings.filterwarnings("ignore", message="lancedb fork support is experimental")
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(code, flush=True)


if __name__ == "__main__":
    main()
