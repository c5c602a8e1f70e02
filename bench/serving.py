"""Benchmark: what an agent waits for a search through `inlet api` and `inlet mcp --http`, alone and under load.

    .venv/bin/python bench/serving.py                 # ../shared/corpora/markdown (else data/sample), 200 queries
    .venv/bin/python bench/serving.py --queries 50 --embedder e5
    .venv/bin/python bench/serving.py --load          # 32 clients x 5 minutes per server, updates underneath

Ingests the corpus once, starts both servers as processes, then sends the same queries, round-robin so that a
noisy machine hits all three alike: query.search in this process, POST /search over one kept-alive httpx client,
and the MCP search tool over one streamable-HTTP session of the SDK's Client. Reports the median and p95 per path
and each server's median overhead over query.search. Each call is also written to the access log, as in use.

--load: ../shared/corpora/markdown is indexed with the shipped config (--embedder swaps only the embedder) and
`inlet watch` keeps it fresh while a writer changes a file every --every seconds (edits, new files, deletes), so
that a new version is published every few seconds. Both servers run with a keys file of one key per client (half
public, half internal clearance) and the shipped limits. Then --clients agents (each its own key, connection or
MCP session; 70% searches, 20% the context of a hit they got, 10% sources; a pause of 0.5-1.5 x --wait seconds
between calls) load `inlet api` for --seconds, then `inlet mcp --http` for as long. Reported per server: requests/s,
p50/p99 (overall and per operation), outcomes (ok; gone: the context of a chunk replaced since its search, the
correct answer; refused; error: 5xx, timeouts, transport errors), torn answers (checked every few seconds while
the load runs, before live maintenance prunes the version: each answer's chunks must be in the version it names,
with the text served, a context's in order in one document, none above the key's clearance), the versions
published and served meanwhile, the server's RSS growth after WARM_S, and the cores each process used (the
server, the watcher, the Prefect server, the clients).
Traffic goes to 127.0.0.1 only and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import multiprocessing as mp
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

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
    parser.add_argument("--load", action="store_true", help="many clients for minutes, with updates underneath")
    parser.add_argument("--clients", type=int, default=CLIENTS_DEFAULT, help="--load: concurrent clients")
    parser.add_argument("--seconds", type=float, default=300, help="--load: seconds of load per server")
    parser.add_argument("--wait", type=float, default=1.0, help="--load: mean pause between a client's calls (0: none)")
    parser.add_argument("--every", type=float, default=3.0, help="--load: seconds between changes to the corpus")
    parser.add_argument("--concurrency", type=int, help="--load: serving.concurrency (default: as shipped)")
    parser.add_argument("--work", help="--load: a folder to keep the indexed corpus in (reused when present)")
    args = parser.parse_args()
    if args.load:
        load_main(args)
        return
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
                          "serving: {rate_limit: null}\n"  # searches back to back: latency, not the limiter
                          # hybrid as over e5 (both sides), whatever the embedder: over hashing alone it is full-text's
                          "query: {vector_weight: 0.5, fulltext_weight: 0.5, agreement: 0.0}\n",
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


# --- --load: many clients for minutes, with the knowledge base updated underneath --------------------------------

CLIENTS_DEFAULT = 32
MIX = (("search", 0.7), ("context", 0.2), ("sources", 0.1))  # what an agent asks: mostly searches, some context


@dataclass
class Call:
    """One request of the load: what it was, how long it took, how it ended, and what it was answered from."""

    server: str
    op: str
    start: float  # seconds since the phase began
    seconds: float
    outcome: str  # ok, gone (a chunk replaced since its search: 404 / not available), refused, error
    detail: str = ""
    version: int | None = None
    rows: list[tuple[str, str, int | None]] = field(default_factory=list)  # (chunk_id, text sha256, chunk_index)
    clearance: str = "public"
    levels: list[str] = field(default_factory=list)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _rows(answer: dict, op: str) -> tuple[int | None, list[tuple[str, str, int | None]], list[str]]:
    """An answer's version, its chunks (id, text hash, index; a context's in order) and their access levels."""
    if op == "search":
        hits = answer["hits"]
        return answer.get("version"), [(h["chunk_id"], _sha(h["text"]), None) for h in hits], [
            h["metadata"]["access_level"] for h in hits]
    if op == "context":
        chunk = answer["chunk"]
        order = [*answer["before"], {"chunk_id": chunk["chunk_id"], "text": chunk["text"],
                                     "chunk_index": chunk["metadata"]["chunk_index"]}, *answer["after"]]
        return answer.get("version"), [(n["chunk_id"], _sha(n["text"]), n["chunk_index"]) for n in order], [
            chunk["metadata"]["access_level"]]
    return answer.get("published_version"), [], []


class _Api:
    """One client of `inlet api`: its own kept-alive connection and key."""

    def __init__(self, url: str, key: str) -> None:
        self.http = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)

    async def __aenter__(self) -> _Api:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def call(self, op: str, arg: str) -> tuple[str, str, dict | None]:
        if op == "search":
            response = await self.http.post("/search", json={"query": arg, "k": 5})
        elif op == "context":
            response = await self.http.get(f"/context/{arg}", params={"neighbors": 1})
        else:
            response = await self.http.get("/sources")
        if response.status_code == 200:
            return "ok", "", response.json()
        detail = f"{response.status_code}: {response.text[:200]}"
        if response.status_code == 404 and op == "context":
            return "gone", detail, None
        return ("refused" if response.status_code < 500 else "error"), detail, None


class _Mcp:
    """One client of `inlet mcp --http`: its own session of the SDK's client, with its key."""

    def __init__(self, url: str, key: str) -> None:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        self.client = Client(streamable_http_client(url, http_client=httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=60)))

    async def __aenter__(self) -> _Mcp:
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__(None, None, None)

    async def call(self, op: str, arg: str) -> tuple[str, str, dict | None]:
        if op == "search":
            result = await self.client.call_tool("search", {"query": arg, "k": 5})
        elif op == "context":
            result = await self.client.call_tool("get_context", {"chunk_id": arg, "neighbors": 1})
        else:
            result = await self.client.call_tool("list_sources", {})
        if not result.is_error:
            return "ok", "", result.structured_content
        text = " ".join(getattr(c, "text", "") for c in result.content)[:200]
        if op == "context" and "is available to this caller" in text:
            return "gone", text, None
        return "error" if "serving.timeout_s" in text else "refused", text, None


async def _client(client: Any, server: str, clearance: str, queries: list[str], seed: int, begin: float,
                  until: float, wait: tuple[float, float], calls: list[Call]) -> None:
    """One agent: a search, now and then the context of a hit it got or the sources, a pause between calls."""
    rng = random.Random(seed)
    seen: list[str] = []
    # Each agent starts somewhere in its first pause, as agents that were not started together would: 32 first
    # calls in the same millisecond queue behind serving.concurrency and time the herd, not the server.
    await asyncio.sleep(rng.uniform(0, wait[1]))
    while time.perf_counter() < until:
        op = rng.choices([m[0] for m in MIX], [m[1] for m in MIX])[0]
        if op == "context" and not seen:
            op = "search"
        arg = rng.choice(queries) if op == "search" else rng.choice(seen) if op == "context" else ""
        start = time.perf_counter()
        try:
            outcome, detail, answer = await client.call(op, arg)
        except Exception as exc:  # noqa: BLE001 - a transport error is a result of the load, counted
            outcome, detail, answer = "error", f"{type(exc).__name__}: {exc}"[:200], None
        took = time.perf_counter() - start
        call = Call(server, op, start - begin, took, outcome, detail, clearance=clearance)
        if answer is not None:
            call.version, call.rows, call.levels = _rows(answer, op)
            if op == "search":
                seen = [r[0] for r in call.rows] or seen
        calls.append(call)
        if wait[1] > 0:
            await asyncio.sleep(rng.uniform(*wait))


async def _load(make: Callable[[int], Any], server: str, keys: list[tuple[str, str]], queries: list[str],
                seconds: float, wait: tuple[float, float], calls: list[Call]) -> list[Call]:
    """Every agent connected first (its own connection or MCP session), then all of them calling for seconds.

    Connecting is not timed: building 32 clients in this one event loop (each httpx client loads the CA bundle,
    ~25 ms) held up the first calls' answers, so that they read 0.7-1.2 s whatever the server did.
    """
    async with contextlib.AsyncExitStack() as stack:
        clients: list[tuple[int, Any]] = []
        for i in range(len(keys)):
            try:
                clients.append((i, await stack.enter_async_context(make(i))))
            except Exception as exc:  # noqa: BLE001 - a session that could not open is an error of the load too
                calls.append(Call(server, "connect", 0.0, 0.0, "error", f"{type(exc).__name__}: {exc}"))
        begin = time.perf_counter()
        await asyncio.gather(*(_client(client, server, keys[i][1], queries, i, begin, begin + seconds, wait, calls)
                               for i, client in clients))
    return calls


def torn(calls: list[Call], config: Path) -> tuple[list[str], int]:
    """Answers not wholly from the version they name: a chunk missing from it or with other text there, a context's
    chunks not consecutive in one document, or a chunk above the caller's clearance; and how many answers could not
    be checked because their version was pruned meanwhile (live maintenance keeps watch.keep_versions_s)."""
    import lancedb

    from schemas.config import ACCESS_LEVELS, load_config

    cfg = load_config(config)
    table = lancedb.connect(str(cfg.store.uri)).open_table(cfg.store.chunks_table)
    problems: list[str] = []
    pruned = 0
    by_version: dict[int, list[Call]] = {}
    for call in calls:
        if call.outcome == "ok":
            if call.version is None:
                problems.append(f"{call.server} {call.op}: no version named")
            elif call.rows:
                by_version.setdefault(call.version, []).append(call)
            if any(ACCESS_LEVELS.index(level) > ACCESS_LEVELS.index(call.clearance) for level in call.levels):
                problems.append(f"{call.server} {call.op}: a chunk above clearance {call.clearance}")
    for version, group in sorted(by_version.items()):
        try:
            table.checkout(version)
        except (OSError, RuntimeError, ValueError):  # pruned since it was served
            pruned += len(group)
            continue
        ids = sorted({r[0] for call in group for r in call.rows})
        found: dict[str, dict] = {}
        for i in range(0, len(ids), 500):
            quoted = ", ".join("'" + c.replace("'", "''") + "'" for c in ids[i:i + 500])
            for row in (table.search().where(f"chunk_id IN ({quoted})").select(["chunk_id", "text", "doc_id",
                        "chunk_index"]).limit(None).to_arrow().to_pylist()):
                found[row["chunk_id"]] = row
        for call in group:
            rows = [found.get(r[0]) for r in call.rows]
            if any(row is None or _sha(row["text"]) != r[1] for row, r in zip(rows, call.rows, strict=True)):
                problems.append(f"{call.server} {call.op} at version {version}: a chunk not in it as served")
            elif call.op == "context":
                docs = {row["doc_id"] for row in rows}
                index = [row["chunk_index"] for row in rows]
                if len(docs) != 1 or index != list(range(index[0], index[0] + len(index))):
                    problems.append(f"{call.server} context at version {version}: neighbours not in order")
    table.checkout_latest()
    return problems, pruned


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summary(calls: list[Call], seconds: float, rss: list[tuple[float, float]], versions: tuple[int, int],
            problems: list[str], unchecked: int = 0) -> dict:
    """A phase's table row: requests/s, p50/p99 overall and per operation, outcomes, RSS growth, versions seen."""
    done = [c for c in calls if c.op != "connect"]
    ok = [c.seconds for c in done if c.outcome in ("ok", "gone")]
    settled = [m for t, m in rss if t >= WARM_S]
    return {
        "requests": len(done), "requests_per_s": round(len(done) / seconds, 1),
        "p50_ms": round(_pct(ok, 0.5) * 1000, 1), "p99_ms": round(_pct(ok, 0.99) * 1000, 1),
        "per_op": {op: {"n": len(t), "p50_ms": round(_pct(t, 0.5) * 1000, 1), "p99_ms": round(_pct(t, 0.99) * 1000, 1)}
                   for op in ("search", "context", "sources")
                   if (t := [c.seconds for c in done if c.op == op and c.outcome in ("ok", "gone")])},
        "outcomes": {o: sum(c.outcome == o for c in calls) for o in ("ok", "gone", "refused", "error")},
        "first_problems": sorted({c.detail for c in calls if c.outcome in ("refused", "error")})[:5],
        "torn": len(problems), "first_torn": problems[:5], "unchecked": unchecked,
        "versions_served": len({c.version for c in done if c.version is not None}),
        "published_moved": versions[1] - versions[0],  # table versions the published tag moved by
        "rss_mb": {"after_warm_up": round(settled[0], 1) if settled else None, "max": round(max(m for _, m in rss), 1),
                   "end": round(rss[-1][1], 1),
                   "growth": round(rss[-1][1] - settled[0], 1) if settled else None},
    }


WARM_S = 30.0  # RSS growth is counted from here: the first searches load indexes, caches and sessions


async def _sampled(proc: subprocess.Popen, seconds: float, every: float = 2.0) -> list[tuple[float, float]]:
    import psutil

    ps, begin, out = psutil.Process(proc.pid), time.perf_counter(), []
    while (now := time.perf_counter() - begin) <= seconds + every:
        out.append((now, ps.memory_info().rss / 2**20))
        await asyncio.sleep(every)
    return out


async def _checking(calls: list[Call], config: Path, done: asyncio.Event, every: float = 5.0,
                    ) -> tuple[list[str], int]:
    """Check the answers as they come (torn), every few seconds: a version is pruned a while after it was served."""
    problems: list[str] = []
    pruned, checked = 0, 0
    while True:
        last = done.is_set()  # the load has ended: this pass checks the last answers
        if not last:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), every)
        batch, checked = calls[checked:], len(calls)
        found, gone = await asyncio.to_thread(torn, batch, config)
        problems += found
        pruned += gone
        if last:
            return problems, pruned


async def _phase(make: Callable[[int], Any], server: str, proc: subprocess.Popen, keys: list[tuple[str, str]],
                 queries: list[str], seconds: float, wait: tuple[float, float], config: Path,
                 ) -> tuple[list[Call], list, tuple[list[str], int]]:
    calls: list[Call] = []
    done = asyncio.Event()

    async def load() -> list[Call]:
        try:
            return await _load(make, server, keys, queries, seconds, wait, calls)
        finally:
            done.set()

    _, rss, checked = await asyncio.gather(load(), _sampled(proc, seconds), _checking(calls, config, done))
    return calls, rss, checked


def cpu_seconds(groups: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds (user + system) so far of each group's processes and their children, by group (a negative pid:
    that process alone)."""
    import psutil

    out: dict[str, float] = {}
    for group, pids in groups.items():
        total = 0.0
        for pid in pids:
            try:
                root = psutil.Process(abs(pid))
                for proc in (root, *(root.children(recursive=True) if pid > 0 else ())):
                    times = proc.cpu_times()
                    total += times.user + times.system
            except psutil.Error:  # exited meanwhile
                continue
        out[group] = total
    return out


def machine_speed() -> float:
    """Seconds this machine takes for 3M additions in a Python loop: to compare tables taken on other days."""
    begin, total = time.perf_counter(), 0
    for i in range(3_000_000):
        total += i
    return round(time.perf_counter() - begin, 3)


def load_main(args: argparse.Namespace) -> None:
    """Build the store, start Prefect, the watcher, an edit writer and both servers; load each server in turn."""
    from bench.freshness import Watcher, build_store, served_files, start_prefect, writer

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="inlet-load-"))
    work.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    watcher = None
    edits = None
    try:
        env, server = start_prefect(work / "prefect")
        procs.append(server)
        config = build_store(work / "kb", args.embedder, None, env)
        # 32 agents, each with its own key (half public, half internal), at the shipped rate limit.
        keys = [(f"load-key-{i:02d}-{os.urandom(8).hex()}", "public" if i % 2 == 0 else "internal")
                for i in range(args.clients)]
        (config.parent / "keys.yaml").write_text(yaml.safe_dump({"keys": [
            {"caller": f"agent-{i:02d}", "sha256": hashlib.sha256(k.encode()).hexdigest(), "clearance": c}
            for i, (k, c) in enumerate(keys)]}), encoding="utf-8")
        spec = yaml.safe_load(config.read_text(encoding="utf-8"))
        # Every other serving setting as shipped (600/minute a key), unless --concurrency says otherwise.
        spec["serving"] = {"api_keys": "keys.yaml", **({"concurrency": args.concurrency} if args.concurrency else {})}
        # Hybrid as over e5 (both sides), whatever the embedder: over the hashing embedder alone it is full-text's.
        from schemas.config import EMBEDDER_FUSION

        spec["query"] = {**spec.get("query", {}), **dataclasses.asdict(EMBEDDER_FUSION["e5"])}
        config.write_text(yaml.safe_dump(spec), encoding="utf-8")
        queries = _queries(config.parent / "corpus", 400)
        watcher = Watcher(config, env, work / "watch.log")
        watcher.wait_for("ready", timeout=600)
        docs = served_files(config)
        spawn = mp.get_context("spawn")  # not fork: this process has LanceDB's runtime loaded
        out: mp.Queue = spawn.Queue()
        total = 2 * (args.seconds + 120)
        edits = spawn.Process(target=writer, args=(str(config.parent / "corpus"), docs, 1 / args.every, total, out, 7),
                           daemon=True)
        edits.start()
        api_port, mcp_port = _port(), _port()
        api, mcp_url = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{mcp_port}/mcp"
        api_proc = _start(["api", "--port", str(api_port)], config, env, f"{api}/openapi.json", work / "api.log")
        mcp_proc = _start(["mcp", "--http", f"127.0.0.1:{mcp_port}"], config, env, mcp_url, work / "mcp.log")
        procs += [api_proc, mcp_proc]
        from query.service import open_knowledge_base
        from schemas.config import load_config

        kb = open_knowledge_base(load_config(config), work / "probe.jsonl")
        wait = (args.wait * 0.5, args.wait * 1.5)
        result: dict[str, Any] = {"machine_speed": machine_speed(), "corpus": str(SHARED),
                                  "embedder": args.embedder, "clients": args.clients,
                                  "concurrency": args.concurrency,
                                  "seconds": args.seconds, "wait_s": list(wait), "edit_every_s": args.every,
                                  "servers": {}}
        for name, make, proc in (("inlet api", lambda i: _Api(api, keys[i][0]), api_proc),
                                 ("inlet mcp --http", lambda i: _Mcp(mcp_url, keys[i][0]), mcp_proc)):
            before = kb.published_version()
            groups = {"server": [proc.pid], "watcher": [watcher.proc.pid], "prefect server": [server.pid],
                      "clients and checker": [-os.getpid()]}  # negative: this process alone, not its children
            cpu_before = cpu_seconds(groups)
            calls, rss, (problems, unchecked) = asyncio.run(_phase(make, name, proc, keys, queries, args.seconds,
                                                                   wait, config))
            cpu_after = cpu_seconds(groups)
            after = kb.published_version()
            result["servers"][name] = summary(calls, args.seconds, rss, (before, after), problems, unchecked)
            # Where the two cores went: each part's CPU seconds per second of load (1.0 = one core).
            result["servers"][name]["cores_used"] = {g: round((cpu_after[g] - cpu_before[g]) / args.seconds, 2)
                                                     for g in groups}
            print(json.dumps({name: result["servers"][name]}, indent=2), flush=True)
        result["watcher_batches"] = len(watcher.batches)
        out_dir = ROOT / "bench" / "results"
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "serving_load.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
        errors = sum(s["outcomes"]["error"] + s["outcomes"]["refused"] + s["torn"] for s in result["servers"].values())
        print(f"errors (5xx, transport, refusals, torn answers): {errors}")
    finally:
        if edits is not None:
            edits.terminate()
        if watcher is not None:
            watcher.stop()
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
