"""Benchmark: what an agent waits for a search through `inlet api` and `inlet mcp --http`, against query.search.

    .venv/bin/python bench/serving.py                 # ../shared/corpora/markdown (else data/sample), 200 queries
    .venv/bin/python bench/serving.py --queries 50 --embedder e5

Ingests the corpus once, starts both servers as processes, then sends the same queries, round-robin so that a
noisy machine hits all three alike: query.search in this process, POST /search over one kept-alive httpx client,
and the MCP search tool over one streamable-HTTP session of the SDK's Client. Reports the median and p95 per path
and each server's median overhead over query.search. Each call is also written to the access log, as in use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # before bench/, whose query.py would shadow the query package
SHARED = ROOT.parent / "shared" / "corpora" / "markdown"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], config: Path, env: dict[str, str], ready: str, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "inlet.cli", *args, "--config", str(config)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    deadline = time.monotonic() + 120
    while True:
        try:
            httpx.get(ready, timeout=2)
            return proc
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"inlet {args[0]} did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)


def _queries(corpus: Path, n: int) -> list[str]:
    """Headings of the corpus's documents as queries: what a reader would ask about."""
    found: list[str] = []
    for path in sorted(corpus.rglob("*.md")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("## ") and 2 < len(line) < 90:
                found.append(line[3:].strip())
    return [found[i * len(found) // n] for i in range(n)] if len(found) >= n else (found * n)[:n]


async def _measure(queries: list[str], config: Path, api: str, mcp_url: str, mode: str) -> dict[str, list[float]]:
    from mcp import Client

    from query import search

    times: dict[str, list[float]] = {"query.search": [], "inlet api": [], "inlet mcp --http": []}
    async with Client(mcp_url) as client, httpx.AsyncClient(base_url=api) as http:
        for text in queries:
            start = time.perf_counter()
            local = search(text, k=5, mode=mode, config=config)
            times["query.search"].append(time.perf_counter() - start)
            start = time.perf_counter()
            answer = (await http.post("/search", json={"query": text, "k": 5, "mode": mode})).json()
            times["inlet api"].append(time.perf_counter() - start)
            start = time.perf_counter()
            result = await client.call_tool("search", {"query": text, "k": 5, "mode": mode})
            times["inlet mcp --http"].append(time.perf_counter() - start)
            ids = [r.chunk_id for r in local]
            if [h["chunk_id"] for h in answer["hits"]] != ids or [
                    h["chunk_id"] for h in result.structured_content["hits"]] != ids:
                raise AssertionError(f"the servers' hits differ from query.search's for {text!r}")
    return times


def main() -> None:
    """Parse arguments, build the store, start the servers and time the three paths."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--embedder", default="hashing", help="hashing (server overhead alone) or e5 (as shipped)")
    parser.add_argument("--mode", default="hybrid")
    args = parser.parse_args()
    corpus_src = SHARED if SHARED.is_dir() else ROOT / "data" / "sample"
    work = Path(tempfile.mkdtemp(prefix="inlet-serving-"))
    procs: list[subprocess.Popen] = []
    try:
        corpus = work / "corpus"
        shutil.copytree(corpus_src, corpus)
        embedding = "{kind: hashing, dim: 384}" if args.embedder == "hashing" else f"{{kind: {args.embedder}}}"
        config = work / "inlet.yaml"
        config.write_text(f"sources:\n  - {{name: docs, path: '{corpus}'}}\nembedding: {embedding}\n"
                          f"store: {{uri: '{work / 'lancedb'}', artifacts: '{work / 'runs'}'}}\n"
                          "serving: {rate_limit: null}\n",  # searches back to back: latency, not the limiter
                          encoding="utf-8")
        env = {**os.environ, "PREFECT_HOME": str(work / "prefect")}
        subprocess.run([sys.executable, "-m", "inlet.cli", "ingest", "--quiet", "--config", str(config)], cwd=ROOT,
                       env=env, check=True)
        api_port, mcp_port = _port(), _port()
        api = f"http://127.0.0.1:{api_port}"
        procs.append(_start(["api", "--port", str(api_port)], config, env, f"{api}/openapi.json", work / "api.log"))
        mcp_url = f"http://127.0.0.1:{mcp_port}/mcp"
        procs.append(_start(["mcp", "--http", f"127.0.0.1:{mcp_port}"], config, env, mcp_url, work / "mcp.log"))
        queries = _queries(corpus, args.queries)
        asyncio.run(_measure(queries[:10], config, api, mcp_url, args.mode))  # warm: models, indexes, sessions
        times = asyncio.run(_measure(queries, config, api, mcp_url, args.mode))
        base = statistics.median(times["query.search"])
        result = {"corpus": str(corpus_src), "queries": len(queries), "mode": args.mode, "embedder": args.embedder,
                  "paths": {name: {"median_ms": round(statistics.median(t) * 1000, 2),
                                   "p95_ms": round(statistics.quantiles(t, n=20)[-1] * 1000, 2),
                                   "overhead_ms": round((statistics.median(t) - base) * 1000, 2)}
                            for name, t in times.items()}}
        print(json.dumps(result, indent=2))
        out = ROOT / "bench" / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "serving.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
