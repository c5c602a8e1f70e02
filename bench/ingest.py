"""Benchmark: Inlet's ingest flow on ../shared/corpora/markdown in the peers' four scenarios.

    .venv/bin/python bench/ingest.py                      # hashing embedder, 3 reps, all scenarios
    .venv/bin/python bench/ingest.py --embedder minilm --reps 1

Scenarios and file choices are those of ../shared/bench-peers (its common.py is imported, so
both see exactly the same edits): a) cold, b) no-op re-run, c) 1% changed (14 edited, 2
deleted, 2 added), d) 10% changed (138 edited). Each measured run is its own process against a
Prefect server this script starts once. Reported apart: interpreter + import start-up, the import
of great-expectations that a run with work pays when it first validates (~2 s), Prefect
orchestration (flow wall minus the flow body) and pipeline time (the flow body without that import).

--warm: each measured run is `inlet ingest --json` from the shell, handed over to the warm process of an
`inlet server` started once for the benchmark's config (runtime/warm.py), as a person with a server running
runs it: no interpreter start-up, imports, tokenizer or great-expectations load per run. A run the warm process
declines fails the benchmark rather than being measured in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

_T0 = time.perf_counter()
ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
PEERS = Path(os.environ.get("PEERS_DIR", SHARED / "bench-peers"))
CORPUS = Path(os.environ.get("PEERS_CORPUS", SHARED / "corpora" / "markdown"))
SCENARIOS = ("a_cold", "b_noop", "c_1pct", "d_10pct")
EXECUTION: dict = {}  # the config's execution section (--runner, --workers, --batch-docs)
WARM = False  # --warm: runs handed over to `inlet server`'s warm process
INLET = Path(sys.executable).with_name("inlet")  # the console script of the environment running this benchmark


# --- worker: one measured run in its own process -------------------------------------------------


def worker(config: str, out: str) -> None:
    """Run the flow once and write timings, counts and peak RSS as JSON."""
    import_start = time.perf_counter()
    from flows.ingest import ingest
    from schemas.config import load_config
    from store.tables import connect, open_table

    imported = time.perf_counter()
    summary = ingest(config_path=config)
    done = time.perf_counter()
    cfg = load_config(config)
    table = open_table(connect(cfg.store.uri), cfg.store.chunks_table)
    # GX is imported by the flow when a run first has a batch to validate: an import, so it is reported with
    # start-up, apart from the pipeline (the peers' imports are outside their timed region too).
    gx_import_s = summary["stage_seconds"].get("import gx", 0.0)
    stage_s = summary["pipeline_seconds"] - gx_import_s
    result = {
        "interpreter_s": import_start - _T0, "import_s": imported - import_start, "flow_s": done - imported,
        "pipeline_s": stage_s, "gx_import_s": gx_import_s, "prefect_overhead_s": (done - imported) - stage_s - gx_import_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        # Worker processes of the process/dask runners (the largest one, once it has ended).
        "peak_rss_children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "rows": table.count_rows() if table is not None else 0,
        **{k: v for k, v in summary.items() if k not in ("quarantined",)},
    }
    Path(out).write_text(json.dumps(result, default=str))


# --- driver -------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prefect_server(home: Path) -> tuple[subprocess.Popen, str, float]:
    """Start a local Prefect server; return it, its API URL and its start-up seconds."""
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_SERVER_API_PORT": str(port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/api"
    for _ in range(240):
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url, time.perf_counter() - start
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("Prefect server did not answer /api/health within 120 s")


def write_config(state: Path, embedder: str) -> Path:
    """Write the benchmark config: the peers' chunk settings, enrichment off."""
    import yaml

    embedding = {"kind": "hashing", "dim": 384} if embedder == "hashing" else {"kind": "minilm"}
    data = {
        "sources": [{"name": "md", "path": str(state / "corpus"), "include": ["**/*.md"]}],
        "chunking": {"max_tokens": 512, "overlap_tokens": 64},
        "enrichment": {"enabled": False},
        "embedding": embedding,
        "store": {"uri": str(state / "store" / "lancedb"), "artifacts": str(state / "store" / "runs")},
        **({"execution": EXECUTION} if EXECUTION else {}),
    }
    state.mkdir(parents=True, exist_ok=True)
    path = state / "inlet.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def start_warm(config: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start `inlet server` for config against the benchmark's Prefect server; return once its warm process answers."""
    proc = subprocess.Popen([str(INLET), "server", "--config", str(config)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        if _warm_served(env) is not None:
            return proc
        if proc.poll() is not None:
            raise RuntimeError(f"inlet server exited with code {proc.returncode}")
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError("the warm process of inlet server did not answer within 300 s")


def _warm_served(env: dict[str, str]) -> int | None:
    """How many commands the warm process has run, or None while none answers (`inlet server --status`)."""
    status = subprocess.run([str(INLET), "server", "--status"], env=env, cwd=ROOT, capture_output=True, text=True)
    for line in status.stdout.splitlines():
        if line.startswith("a warm Inlet process"):
            try:  # "a warm Inlet process (pid P, up S s, N commands run) takes ..."
                return int(line.split(" commands run")[0].rsplit(", ", 1)[1])
            except (IndexError, ValueError):
                raise RuntimeError(f"inlet server --status printed a line this benchmark cannot read: {line!r}") from None
    return None


def measure_warm(config: Path, env: dict[str, str]) -> dict:
    """Run `inlet ingest --json` as a shell would; its summary, wall time and stage split, checked to be handed over."""
    before = _warm_served(env)
    start = time.perf_counter()
    proc = subprocess.run([str(INLET), "ingest", "--config", str(config), "--json"], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"inlet ingest failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    if before is None or _warm_served(env) != before + 1:
        raise RuntimeError(f"inlet ingest was not run by the warm process:\n{proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout)
    gx_import_s = summary["stage_seconds"].get("import gx", 0.0)
    stage_s = summary["pipeline_seconds"] - gx_import_s
    table = _open_chunks(config)
    # No process of its own to split: start-up reads 0, and "Prefect overhead" is all of the command's wall time
    # outside the pipeline (its client's start, Prefect's run set-up and teardown, the answer's way back).
    return {"interpreter_s": 0.0, "import_s": 0.0, "flow_s": wall, "pipeline_s": stage_s, "gx_import_s": gx_import_s,
            "prefect_overhead_s": wall - summary["pipeline_seconds"], "peak_rss_mb": 0.0, "peak_rss_children_mb": 0.0,
            "rows": table, "process_wall_s": wall, **{k: v for k, v in summary.items() if k not in ("quarantined",)}}


def _open_chunks(config: Path) -> int:
    """The chunk rows of the store config names (0 before its first run)."""
    import lancedb
    import yaml

    uri = yaml.safe_load(config.read_text())["store"]["uri"]
    db = lancedb.connect(uri)
    return db.open_table("chunks").count_rows() if "chunks" in db.list_tables().tables else 0


def measure(config: Path, env: dict[str, str], work: Path) -> dict:
    """Run one worker process (or, with --warm, one handed-over `inlet ingest`) and return its JSON and wall time."""
    if WARM:
        return measure_warm(config, env)
    out = work / "result.json"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--worker", str(config), str(out)], env=env,
                          capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed:\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result["process_wall_s"] = wall
    return result


def chunk_identity(store: Path) -> set[tuple[str, str, str]]:
    """Return (doc_id, text_hash, chunk_id) of every chunk row."""
    import lancedb

    rows = lancedb.connect(str(store / "lancedb")).open_table("chunks").to_arrow()
    return set(zip(rows["doc_id"].to_pylist(), rows["text_hash"].to_pylist(), rows["chunk_id"].to_pylist()))


def _copy(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)  # copy2 keeps mtimes, so unchanged files stay unchanged by stat


def run_embedder(embedder: str, scenarios: list[str], reps: int, env: dict[str, str], work: Path,
                 check: bool = True) -> list[dict]:
    """Measure every scenario reps times; check each against a cold build of the same final corpus."""
    sys.path.insert(0, str(PEERS))
    from common import apply_changes  # the peers' own change plan, so both sides see the same edits

    state, snap = work / "state", work / f"snapshot-{embedder}"
    config = write_config(state, embedder)
    rows: list[dict] = []
    for scenario in scenarios:
        for rep in range(reps):
            if scenario == "a_cold" or not snap.exists():
                shutil.rmtree(state / "store", ignore_errors=True)
                _copy(CORPUS, state / "corpus")
                if scenario != "a_cold":  # untimed cold ingest to change from
                    measure(config, env, work)
                    _copy(state / "corpus", snap / "corpus")
                    _copy(state / "store", snap / "store")
            if scenario != "a_cold":
                _copy(snap / "corpus", state / "corpus")
                _copy(snap / "store", state / "store")
                apply_changes(state / "corpus", scenario)
            result = measure(config, env, work)
            if scenario == "a_cold" and not snap.exists():
                _copy(state / "corpus", snap / "corpus")
                _copy(state / "store", snap / "store")
            if check and rep == 0 and scenario != "a_cold":  # a cold run is its own reference
                got = chunk_identity(state / "store")
                ref_state = work / "reference"
                _copy(state / "corpus", ref_state / "corpus")
                shutil.rmtree(ref_state / "store", ignore_errors=True)
                measure(write_config(ref_state, embedder), env, work)
                ref = chunk_identity(ref_state / "store")
                result["leftover_rows"], result["missing_rows"] = len(got - ref), len(ref - got)
            rows.append({"embedder": embedder, "scenario": scenario, "rep": rep, **result})
            print(f"{embedder} {scenario} rep {rep}: flow {result['flow_s']:.2f}s pipeline "
                  f"{result['pipeline_s']:.2f}s embedded {result['texts_embedded']} rows {result['rows']}",
                  flush=True)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Medians per (embedder, scenario)."""
    out = []
    keys = sorted({(r["embedder"], r["scenario"]) for r in rows}, key=lambda k: (k[0], SCENARIOS.index(k[1])))
    for embedder, scenario in keys:
        group = [r for r in rows if (r["embedder"], r["scenario"]) == (embedder, scenario)]
        med = lambda k: statistics.median(r[k] for r in group)  # noqa: E731
        docs = group[0]["docs_new"] + group[0]["docs_changed"] + group[0]["docs_unchanged"]
        out.append({
            "embedder": embedder, "scenario": scenario, "reps": len(group),
            "flow_s": med("flow_s"), "pipeline_s": med("pipeline_s"), "prefect_overhead_s": med("prefect_overhead_s"),
            "startup_s": statistics.median(r["process_wall_s"] - r["flow_s"] for r in group),
            "import_s": med("import_s"), "gx_import_s": statistics.median(r.get("gx_import_s", 0.0) for r in group),
            "min_s": min(r["pipeline_s"] for r in group), "max_s": max(r["pipeline_s"] for r in group),
            "docs_per_s": docs / med("pipeline_s"), "texts_embedded": group[0]["texts_embedded"],
            "rows": group[0]["rows"], "peak_rss_mb": med("peak_rss_mb"),
            "leftover_rows": group[0].get("leftover_rows", "-"), "missing_rows": group[0].get("missing_rows", "-"),
            "texts_truncated": group[0]["texts_truncated"],
            "stage_seconds": group[0]["stage_seconds"],
        })
    return out


def markdown_table(summary: list[dict], server_s: float) -> str:
    """Render the medians as a Markdown table."""
    lines = [
        f"Prefect server start-up (once): {server_s:.1f} s",
        "",
        "| embedder | scenario | pipeline s (median) | min-max | + Prefect run overhead s | start-up s "
        "| + GX import s | docs/s | texts embedded | rows | peak RSS MB | leftover / missing vs cold |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['embedder']} | {s['scenario']} | {s['pipeline_s']:.2f} | {s['min_s']:.2f}-{s['max_s']:.2f} "
            f"| {s['prefect_overhead_s']:.2f} | {s['startup_s']:.2f} | {s['gx_import_s']:.2f} | {s['docs_per_s']:.0f} "
            f"| {s['texts_embedded']} | {s['rows']} | {s['peak_rss_mb']:.0f} | {s['leftover_rows']} / {s['missing_rows']} |")
    return "\n".join(lines)


def main() -> None:
    """Parse arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedder", choices=["hashing", "minilm", "both"], default="hashing")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--out", default=None, help="JSON results (default bench/results/ingest-<embedder>.json)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the comparison with a cold build (it costs a full cold run per scenario)")
    parser.add_argument("--runner", choices=["thread", "process", "dask"], help="execution.task_runner")
    parser.add_argument("--workers", type=int, help="execution.workers")
    parser.add_argument("--batch-docs", type=int, help="execution.batch_docs")
    parser.add_argument("--warm", action="store_true",
                        help="hand each run to the warm process of an `inlet server` (runs timed from the shell)")
    parser.add_argument("--worker", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    EXECUTION.update({k: v for k, v in (("task_runner", args.runner), ("workers", args.workers),
                                        ("batch_docs", args.batch_docs)) if v is not None})
    if not CORPUS.is_dir() or not (PEERS / "common.py").is_file():
        sys.exit(f"needs {CORPUS} and {PEERS}/common.py (the shared folder beside this checkout)")
    work = Path(tempfile.mkdtemp(prefix="inlet-bench-"))
    server, url, server_s = start_prefect_server(work / "prefect-home")
    env = {**os.environ, "PREFECT_API_URL": url, "PYTHONPATH": str(ROOT)}
    warm = None
    if args.warm:
        global WARM
        WARM = True
        # No PREFECT_API_URL: `inlet server` and the commands find the benchmark's server as the local one.
        env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
        env.update(PREFECT_HOME=str(work / "prefect-home"), PREFECT_SERVER_API_HOST="127.0.0.1",
                   PREFECT_SERVER_API_PORT=url.rsplit(":", 1)[1].removesuffix("/api"),
                   INLET_WARM_SOCKET=str(work / "warm.sock"))
        warm = start_warm(write_config(work / "state", args.embedder if args.embedder != "both" else "hashing"), env)
    try:
        embedders = ["hashing", "minilm"] if args.embedder == "both" else [args.embedder]
        rows = [r for e in embedders
                for r in run_embedder(e, args.scenarios.split(","), args.reps, env, work, check=not args.no_check)]
    finally:
        if warm is not None:
            warm.terminate()  # SIGTERM: inlet server stops its warm process in order
            warm.wait(timeout=60)
        server.terminate()
        server.wait(timeout=30)
    summary = summarize(rows)
    out = Path(args.out or ROOT / "bench" / "results" / f"ingest-{args.embedder}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "summary": summary, "server_start_s": server_s}, indent=1,
                                         default=str))
    print(markdown_table(summary, server_s))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
