"""Benchmark: Inlet against LangChain and LlamaIndex in one run, as ratios against the issue's targets.

    .venv/bin/python bench/versus.py                           # 3 reps each side (~15-35 min here)
    .venv/bin/python bench/versus.py --reps 1 --scenarios c_1pct
    .venv/bin/python bench/versus.py --warm     # Inlet's runs handed to an `inlet server` (bench/ingest.py --warm)

Runs `bench/ingest.py` (hashing embedder, with its check against a cold build), then the peers'
harness, then `bench/ingest.py` again: this machine's speed drifts within the hour, so Inlet is
measured on both sides of the peers and each Inlet run gets its own ratio. The peers' harness
rewrites its results in place, so it runs from a copy in a temporary folder; its virtualenv is
kept in the system temporary folder (PEERS_VENV) and reused by later runs. A ratio is the peer's
median wall time over Inlet's median pipeline time; a target is met when every Inlet run meets it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType


def _load_bench_ingest() -> ModuleType:
    """bench/ingest.py as a module, loaded by path: bench/ on sys.path would shadow the project's query package."""
    spec = importlib.util.spec_from_file_location("inlet_bench_ingest", Path(__file__).resolve().parent / "ingest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The same corpus, peers and scenarios as Inlet's own benchmark.
_INGEST = _load_bench_ingest()
CORPUS, PEERS, ROOT, SCENARIOS = _INGEST.CORPUS, _INGEST.PEERS, _INGEST.ROOT, _INGEST.SCENARIOS

# The targets (restated in issue 36): how many times faster than each peer Inlet's pipeline must be. No-op and
# 1% runs only need to be ahead of LlamaIndex (above 1x) with every stage a visible task run.
TARGETS = {"a_cold": {"langchain": 2.0, "llamaindex": 4.0}, "b_noop": {"llamaindex": 1.0},
           "c_1pct": {"llamaindex": 1.0}, "d_10pct": {"llamaindex": 2.0}}
PEER_NAMES = {"langchain": "LangChain", "llamaindex": "LlamaIndex"}


def compare(inlet_runs: list[dict], peers: dict) -> list[dict]:
    """One row per scenario and targeted peer: medians, one ratio per Inlet run, and whether all meet the target.

    inlet_runs: bench/ingest.py's JSON outputs; peers: the peers' results.json. Pure.
    """
    rows = []
    for scenario, targets in TARGETS.items():
        inlet = [next((s for s in run["summary"] if s["scenario"] == scenario), None) for run in inlet_runs]
        if any(s is None for s in inlet):
            continue
        for peer, target in targets.items():
            measured = peers["scenarios"].get(peer, {}).get(scenario)
            if not measured or not measured.get("median"):
                continue
            peer_s = measured["median"]["wall_s"]
            ratios = [peer_s / s["pipeline_s"] for s in inlet]
            rows.append({"scenario": scenario, "peer": peer, "target": target, "peer_s": peer_s,
                         "peer_texts": measured["median"]["texts_embedded"],
                         "inlet_s": [s["pipeline_s"] for s in inlet], "inlet_texts": inlet[0]["texts_embedded"],
                         "ratios": ratios, "met": all(r > target if target == 1.0 else r >= target for r in ratios)})
    return rows


def markdown(rows: list[dict], times: list[str]) -> str:
    """Render compare()'s rows as a Markdown table; times: when each Inlet run and the peers' run started."""
    runs = " / ".join(times[i] for i in (0, 2))
    lines = [f"| scenario | Inlet s ({runs}) | peer s ({times[1]}) | ratio | target |",
             "|---|---:|---:|---:|---|"]
    for r in rows:
        inlet = " / ".join(f"{s:.2f}" for s in r["inlet_s"])
        ratios = " / ".join(f"{x:.2f}x" for x in r["ratios"])
        verdict = "met" if r["met"] else "not met"
        lines.append(f"| {r['scenario']} | {inlet} ({r['inlet_texts']} texts) | {PEER_NAMES[r['peer']]} "
                     f"{r['peer_s']:.2f} ({r['peer_texts']} texts) | {ratios} | {r['target']:g}x: {verdict} |")
    return "\n".join(lines)


def _inlet(args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "bench" / "ingest.py"), "--reps", str(args.reps), "--scenarios",
           ",".join(args.scenarios), "--out", str(out), *(["--no-check"] if args.no_check else []),
           *(["--warm"] if args.warm else [])]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads(out.read_text())


def _peers(args: argparse.Namespace, work: Path, out: Path) -> dict:
    copy = work / "bench-peers"
    shutil.copytree(PEERS, copy)
    tmp = work / "peers-tmp"
    tmp.mkdir()
    env = {**os.environ, "PEERS_CORPUS": str(CORPUS), "TMPDIR": str(tmp),
           "PEERS_VENV": os.environ.get("PEERS_VENV", str(Path(tempfile.gettempdir()) / "peers-venv"))}
    cmd = [str(copy / "run.sh"), "--reps", str(args.reps), "--scenarios", ",".join(args.scenarios),
           "--no-side-checks", "--no-readme", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=copy, env=env)
    return json.loads(out.read_text())


def main() -> None:
    """Parse arguments, run Inlet, the peers and Inlet again, and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--scenarios", type=lambda v: v.split(","), default=list(SCENARIOS))
    parser.add_argument("--no-check", action="store_true", help="skip Inlet's comparison with a cold build")
    parser.add_argument("--warm", action="store_true", help="Inlet's runs handed to the warm process of `inlet server`")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "versus.json")
    args = parser.parse_args()
    if not (PEERS / "run.sh").is_file() or not CORPUS.is_dir():
        sys.exit(f"needs {PEERS}/run.sh and {CORPUS} (the shared folder beside this checkout)")
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        sys.exit(f"--scenarios: unknown {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    work = Path(tempfile.mkdtemp(prefix="inlet-versus-"))
    try:
        times = [time.strftime("%H:%M")]
        before = _inlet(args, work / "inlet-before.json")
        times.append(time.strftime("%H:%M"))
        peers = _peers(args, work, work / "peers.json")
        times.append(time.strftime("%H:%M"))
        after = _inlet(args, work / "inlet-after.json")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = compare([before, after], peers)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"times": times, "rows": rows, "inlet": [before, after], "peers": peers},
                                   indent=1, default=str))
    print(markdown(rows, times))


if __name__ == "__main__":
    main()
