"""Benchmark: what a person waits for at the terminal, each command a whole process timed from the shell.

    .venv/bin/python bench/startup.py                        # shipped config (e5), 5 reps, cold and warm
    .venv/bin/python bench/startup.py --reps 3 --no-cold     # without dropping the page cache
    git worktree add /tmp/old <commit>
    .venv/bin/python bench/startup.py --compare /tmp/old     # alternating with another checkout

The shipped configs/inlet.yaml with its store and runs moved to a temporary folder (the sample corpus, e5,
keyword enrichment). Timed, each as `python -m inlet.cli ...` started in the checkout's folder:

- inlet server until ready: started once (cold: after dropping the page cache), until its warm process is ready;
- first ingest: a new store, with `inlet server` running (its warm process runs the command);
- no-op ingest: the same store again, with the server, and without one (Prefect's temporary server, in-process);
- query: `inlet query "..." -k 1` with the server (e5 loaded in its warm process; a checkout without one loads it).

Cold: the kernel's page cache is dropped before the run (needs root; said when it cannot), so files are read from
disk as after a reboot; warm: the same command run again. Medians of --reps; the first ingest is one run per rep,
each with a new store. Then the top imports of each command by time (`python -X importtime`, one run, warm).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "How do I winterize the outboard engine?"
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shipped_config(work: Path, name: str) -> Path:
    """configs/inlet.yaml with its sample source kept and its store and runs under work/name."""
    import yaml

    data = yaml.safe_load((ROOT / "configs" / "inlet.yaml").read_text(encoding="utf-8"))
    data["sources"][0]["path"] = str(ROOT / "data" / "sample")
    data["store"].update(uri=str(work / name / "lancedb"), artifacts=str(work / name / "runs"))
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def drop_page_cache() -> bool:
    """Write dirty pages and drop the page cache; False when this process may not."""
    try:
        os.sync()
        DROP_CACHES.write_text("3\n")
    except OSError:
        return False
    return True


def run(checkout: Path, args: list[str], env: dict[str, str], *, cold: bool = False,
        importtime: bool = False) -> tuple[float, str]:
    """Run one inlet command from a checkout; return its wall seconds and its stderr."""
    if cold and not drop_page_cache():
        raise RuntimeError("cannot drop the page cache (needs root): run with --no-cold")
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "inlet.cli", *args]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{checkout}: inlet {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return took, out.stderr


def top_imports(stderr: str, n: int = 8) -> list[tuple[str, float]]:
    """The n top-level imports (as Python's -X importtime prints them) that took longest, in seconds."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _self, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith(" ") or name.startswith("  "):  # depth 0 only: one name, one line
            continue
        rows.append((name.strip(), int(cumulative) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:n]


def start_server(env: dict[str, str]) -> tuple[subprocess.Popen, float]:
    """Start `inlet server` with env; return it and its seconds until ready (warm process included, if it has one).

    Ready: its warm process says so, or (a checkout without one) the Prefect server's health check answers.
    """
    import threading

    begin = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "inlet.cli", "server"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines: list[str] = []
    ready = threading.Event()

    def drain() -> None:  # read all along: a full pipe would stall the server's run logs
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "ready in" in line or "no warm process" in line:
                ready.set()

    threading.Thread(target=drain, daemon=True).start()
    url = f"http://127.0.0.1:{env['PREFECT_SERVER_API_PORT']}/api/health"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if ready.wait(0.2):
            return proc, time.perf_counter() - begin
        if not (ROOT / "runtime" / "warm.py").exists() and _answers(url):
            return proc, time.perf_counter() - begin
    proc.kill()
    raise RuntimeError("inlet server was not ready in 240 s:\n" + "".join(lines)[-3000:])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().strip() == b"true"
    except OSError:
        return False


def measure(checkouts: list[Path], work: Path, reps: int, cold: bool) -> dict[tuple[str, str, str], list[float]]:
    """Time every command on every checkout, alternating checkouts so that a noisy machine hits each alike."""
    base = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    server_env = {**base, "PREFECT_HOME": str(work / "prefect-home"), "PREFECT_SERVER_API_PORT": str(_free_port())}
    # No server: a port nothing listens on, so the command falls back to Prefect's temporary server.
    alone_env = {**server_env, "PREFECT_SERVER_API_PORT": str(_free_port())}
    times: dict[tuple[str, str, str], list[float]] = {}
    if cold and not drop_page_cache():
        raise RuntimeError("cannot drop the page cache (needs root): run with --no-cold")
    server, ready_s = start_server(server_env)
    times[(str(ROOT), "inlet server until ready", "cold" if cold else "warm")] = [ready_s]
    try:
        for rep in range(reps):
            for i, checkout in enumerate(checkouts):
                config = shipped_config(work, f"store-{i}-{rep}")
                key = str(checkout)
                first = ["ingest", "--quiet", "--config", str(config)]
                noop = ["ingest", "--quiet", "--config", str(config)]
                query = ["query", QUESTION, "-k", "1", "--config", str(config)]
                for name, args, env in (("first ingest (server)", first, server_env),
                                        ("no-op ingest (server)", noop, server_env),
                                        ("no-op ingest (no server)", noop, alone_env),
                                        ("query (e5)", query, server_env)):
                    if cold and name != "first ingest (server)":  # the first ingest is its own cold run
                        times.setdefault((key, name, "cold"), []).append(run(checkout, args, env, cold=True)[0])
                    kind = "cold" if cold and name == "first ingest (server)" else "warm"
                    times.setdefault((key, name, kind), []).append(run(checkout, args, env,
                                                                       cold=cold and kind == "cold")[0])
                print(f"rep {rep + 1}/{reps} {checkout}: " + ", ".join(
                    f"{n} {kind} {v[-1]:.2f}s" for (c, n, kind), v in times.items() if c == key), flush=True)
        print("\nTop imports (one warm run each, cumulative seconds):")
        config = shipped_config(work, "store-0-0")
        for name, args, env in (("no-op ingest", ["ingest", "--quiet", "--config", str(config)], server_env),
                                ("query", ["query", QUESTION, "-k", "1", "--config", str(config)], server_env)):
            _took, stderr = run(checkouts[0], args, env, importtime=True)
            print(f"- {name}: " + ", ".join(f"{m} {s:.2f}" for m, s in top_imports(stderr)))
        status = subprocess.run([sys.executable, "-m", "inlet.cli", "server", "--status"], cwd=ROOT, env=server_env,
                                capture_output=True, text=True, check=False)
        print("\n" + status.stdout.strip())  # how many commands the warm process ran: were they handed over?
    finally:
        server.terminate()
        server.wait(timeout=30)
    return times


def main() -> None:
    """Parse arguments, time the commands and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-cold", action="store_true", help="do not drop the page cache (warm runs only)")
    parser.add_argument("--compare", type=Path, help="another checkout of Inlet to time against this one")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="inlet-startup-"))
    checkouts = [ROOT, *([args.compare.resolve()] if args.compare else [])]
    try:
        times = measure(checkouts, work, args.reps, cold=not args.no_cold)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| checkout | command | cache | median s | min-max s | runs |\n|---|---|---|---:|---:|---:|")
    for (checkout, name, kind), values in times.items():
        print(f"| {Path(checkout).name} | {name} | {kind} | {statistics.median(values):.2f} | "
              f"{min(values):.2f}-{max(values):.2f} | {len(values)} |")
    if args.compare:
        for (checkout, name, kind), values in times.items():
            theirs = times.get((str(checkouts[1]), name, kind))
            if checkout == str(ROOT) and theirs:
                print(f"{name} ({kind}): {statistics.median(theirs) / statistics.median(values):.2f}x faster "
                      f"than {args.compare}")


if __name__ == "__main__":
    main()
