"""Benchmark: edit-to-searchable under `inlet watch`, as a user waits for it.

    .venv/bin/python bench/freshness.py --embedder hashing --rate 1 --seconds 300
    .venv/bin/python bench/freshness.py --embedder hashing --rate 10 --seconds 300
    .venv/bin/python bench/freshness.py --embedder e5 --rate 1 --seconds 300 --files 100 --pdfs 6
    .venv/bin/python bench/freshness.py --embedder hashing --rate 1 --seconds 3600 --soak
    .venv/bin/python bench/freshness.py --embedder hashing --rate 0.05 --seconds 300 --emit-only

A copy of ../shared/corpora/markdown (or its first --files files) is indexed once with the shipped config
(configs/inlet.yaml; --embedder hashing swaps only the embedder), kept under the work folder so that later
rounds reuse it. Then, against a Prefect server started here, `inlet watch --json` runs as a user runs it, a
writer process changes the folder at --rate changes/s for --seconds (edits that insert a unique sentence into
a random document readers are served (indexed, not expired), new files, deletes of files it made earlier; written in place, not renamed), and this
process polls query.search (full-text, k=5) until each change is searchable, or each deleted file gone.
Latencies are from the writer's write to the reader's first search that shows it. Reported: p50 / p95 / max
per kind, the backlog (changes written, not yet seen) and the p95 per minute, the watcher's RSS over time
and its CPU share when idle afterwards, the chunks table's versions and fragments, and query p50 at the start (a copy taken then)
and the end. --pdfs N then replaces one PDF N times with other PDFs of ../shared/corpora/pdf. --reader api
polls POST /search of an `inlet api` process instead of query.search; --reader mcp calls the search tool of an
`inlet mcp` process over stdio, through one session of the MCP SDK's client. --emit-only measures the
other way: `inlet watch --emit-only` emits an event per settled change, and prefect.yaml's ingest deployment,
served here as `inlet serve` serves it, is run by its trigger in a process of its own.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "corpora"
_HEADING = re.compile(r"^#{1,6} ")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prefect(home: Path) -> tuple[dict[str, str], subprocess.Popen]:
    """A Prefect server (API and UI) with its own database, as `make server` starts it; its client environment."""
    import httpx

    port = _port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_SERVER_API_PORT": str(port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start"], env=env, cwd=ROOT,
                            stdout=(home / "server.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the Prefect server did not start: " + (home / "server.log").read_text()[-2000:])
        time.sleep(0.5)
    client = {k: v for k, v in env.items() if not k.startswith("PREFECT_SERVER_API_")}
    return {**client, "PREFECT_API_URL": url}, proc


def build_store(work: Path, embedder: str, files: int | None, env: dict[str, str]) -> Path:
    """Copy the corpus (or its first files) and index it once with the shipped config; reused when present.

    A build stopped part-way (a cold e5 index of the whole corpus takes hours) resumes where it stopped: the copy
    is kept once its config is written, and the ingest run pays no model call twice (the store's model cache).
    """
    corpus, config = work / "corpus", work / "inlet.yaml"
    if not (work / ".built").exists():
        copied = config.exists()  # written after the last file was copied
        if not copied:
            shutil.rmtree(work, ignore_errors=True)
        names = sorted(p for p in (SHARED / "markdown").rglob("*.md"))[:files]
        for path in names if not copied else []:
            target = corpus / path.relative_to(SHARED / "markdown")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        shipped = yaml.safe_load((ROOT / "configs" / "inlet.yaml").read_text())
        shipped["sources"] = [{"name": "docs", "path": "corpus", "include": ["**/*.md", "**/*.pdf"],
                               "metadata": {"doc_type": "docs"}, "max_delete_share": 0.5}]
        shipped["store"] = {**shipped.get("store", {}), "uri": "store/lancedb", "artifacts": "store/runs"}
        if embedder != "e5":
            shipped["embedding"] = {**shipped.get("embedding", {}), "kind": embedder}
        # The reader polls `inlet api` every 10-20 ms to see a change the moment it is searchable: no rate limit.
        shipped["serving"] = {**shipped.get("serving", {}), "rate_limit": None}
        config.write_text(yaml.safe_dump(shipped), encoding="utf-8")
        begin = time.perf_counter()
        subprocess.run([sys.executable, "-m", "inlet.cli", "ingest", "--quiet", "--config", str(config)], env=env,
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        (work / ".built").write_text(json.dumps({"files": len(names), "seconds": time.perf_counter() - begin,
                                                 "resumed": copied}))  # resumed: seconds of the last part only
    return config


_COMMENT_OPEN = re.compile(r"<!--|\{\{[<%]\s*comment\s*[>%]\}\}")  # HTML comments, Hugo's comment shortcode
_COMMENT_CLOSE = re.compile(r"-->|\{\{[<%]\s*/comment\s*[>%]\}\}")


def _insert(path: Path, sentence: str, rng: random.Random) -> None:
    """Insert a paragraph before a random heading that readers see: not in a code fence or a comment.

    Text in a comment is dropped by Inlet's Markdown cleaning, as a reader of the rendered page never sees it.
    Without such a heading, the paragraph goes at the end (unless the file ends inside a comment: then first).
    """
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    fenced = hidden = False
    spots = []
    body = 0  # past the YAML front matter, whose '# comment' lines look like headings
    if lines and lines[0].strip() == "---":
        body = next((i + 1 for i in range(1, len(lines)) if lines[i].strip() == "---"), len(lines))
    for i, line in enumerate(lines):
        if i < body:
            continue
        if not hidden and line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and not hidden and _COMMENT_OPEN.search(line) and not _COMMENT_CLOSE.search(line):
            hidden = True
        elif hidden and _COMMENT_CLOSE.search(line):
            hidden = False
        elif not fenced and not hidden and i > body and _HEADING.match(line):
            spots.append(i)
    at = rng.choice(spots) if spots else (len(lines) if not (fenced or hidden) else body)
    lines[at:at] = ["", sentence, ""]  # a paragraph of its own, whatever the line before it was
    with path.open("w", encoding="utf-8") as fh:  # in place, as an editor saving over the file does
        fh.write("\n".join(lines) + "\n")


def served_files(config: Path) -> list[str]:
    """The Markdown files whose documents readers are served: indexed, public, not expired (Hugo's expiryDate)."""
    from datetime import UTC, datetime

    import lancedb

    from schemas.config import load_config

    cfg = load_config(config)
    rows = lancedb.connect(cfg.store.uri).open_table(cfg.store.documents_table).to_arrow().to_pylist()
    now = datetime.now(UTC)
    return sorted(r["path"] for r in rows if r["status"] == "ok" and r["total_chunks"] and r["path"].endswith(".md")
                  and r["access_level"] == "public" and (r["expires_at"] is None or r["expires_at"] > now)
                  and "/live/" not in r["path"])


def writer(folder: str, docs: list[str], rate: float, seconds: float, out: mp.Queue, seed: int) -> None:
    """Change the folder at rate changes/s for seconds: 60% edits of docs, 20% new files, 20% deletes of its own."""
    rng = random.Random(seed)
    nonce = os.urandom(3).hex()  # tokens new to this round: earlier rounds' edits stay in the kept corpus
    root = Path(folder)
    made: list[tuple[float, Path, str]] = []
    (root / "live").mkdir(exist_ok=True)
    begin = time.monotonic()
    n = 0
    while time.monotonic() - begin < seconds:
        due = begin + n / rate
        time.sleep(max(0.0, due - time.monotonic()))
        token = f"zq{nonce}x{n}k"
        roll = rng.random()
        old = [m for m in made if time.monotonic() - m[0] > 5]
        if roll < 0.2 and old:
            item = old[0]
            made.remove(item)
            item[1].unlink()
            out.put(("delete", item[2], str(item[1]), time.time()))
        elif roll < 0.4:
            path = root / "live" / f"{token}.md"
            path.write_text(f"# Live note {n}\n\nThe {token} marker names a note made while watching.\n",
                            encoding="utf-8")
            made.append((time.monotonic(), path, token))
            out.put(("create", token, str(path), time.time()))
        else:
            path = Path(rng.choice(docs))
            _insert(path, f"The {token} marker was inserted by the live edit benchmark.", rng)
            out.put(("edit", token, str(path), time.time()))
        n += 1
    out.put(None)


GROUP = 15  # tokens per search: k = 3 x GROUP stays within serving.max_k (50)


def serve_ingest(config: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """prefect.yaml's ingest deployment (its trigger and limit, no schedule) served as `inlet serve` serves it,
    with this store's config as its parameter: what `inlet watch --emit-only`'s events run."""
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text(encoding="utf-8"))
    for deployment in spec["deployments"]:
        deployment.setdefault("parameters", {})["config_path"] = str(config)
        deployment["schedules"] = []  # only the trigger's runs: an hourly run's Scheduled state would never drain
    path = config.parent / "prefect-bench.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path; from prefect import serve; " \
           f"from flows.serve import runner_deployments; serve(*runner_deployments(Path({str(path)!r}), ['ingest']))"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    from prefect import get_client

    deadline = time.monotonic() + 120
    while True:  # its trigger exists once the deployment does
        with get_client(sync_client=True) as client:
            try:
                client.read_deployment_by_name("ingest/ingest")
                return proc
            except Exception:  # noqa: BLE001 - not registered yet
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("serving the ingest deployment failed: " + log.read_text()[-2000:]) from None
        time.sleep(0.5)


def ingest_runs() -> dict[str, int]:
    """Flow runs of the ingest deployment by state type: a triggered run is Scheduled until the runner takes it."""
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("ingest/ingest")
        counts: dict[str, int] = {}
        for run in client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(
                any_=[deployment.id]))):
            if run.state_type is not None:
                counts[run.state_type.value] = counts.get(run.state_type.value, 0) + 1
        return counts


def drained(limit: float = 900) -> dict[str, int]:
    """Wait until the ingest deployment has run at least once and no run of it is waiting or running."""
    deadline = time.monotonic() + limit
    while True:
        counts = ingest_runs()
        if counts.get("COMPLETED") and not any(counts.get(s) for s in ("SCHEDULED", "PENDING", "RUNNING")):
            return counts
        if time.monotonic() > deadline:
            raise RuntimeError(f"the ingest deployment's runs did not drain: {counts}")
        time.sleep(1)


class Reader:
    """What the reader polls: query.search in this process, POST /search of `inlet api`, or `inlet mcp`'s search."""

    def __init__(self, config: Path, kind: str, env: dict[str, str], log: Path) -> None:
        self.config, self.kind, self.proc = config, kind, None
        if kind == "api":
            import httpx

            port = _port()
            self.proc = subprocess.Popen([sys.executable, "-m", "inlet.cli", "api", "--port", str(port), "--config",
                                          str(config)], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                         stderr=log.open("w"))
            self.url, self.http = f"http://127.0.0.1:{port}", httpx.Client(timeout=30)
            deadline = time.monotonic() + 120
            while True:
                try:
                    self.http.get(f"{self.url}/sources")
                    break
                except httpx.TransportError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("inlet api did not start: " + log.read_text()[-2000:]) from None
                    time.sleep(0.2)

        elif kind == "mcp":
            self._start_mcp(env)

    def _start_mcp(self, env: dict[str, str]) -> None:
        """`inlet mcp` over stdio, one session held open by the MCP SDK's client on an event loop of its own."""
        import asyncio

        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        params = StdioServerParameters(command=sys.executable, args=["-m", "inlet.cli", "mcp", "--config",
                                                                     str(self.config)], env=env, cwd=str(ROOT))
        self.loop = asyncio.new_event_loop()
        ready, self.stop = threading.Event(), None

        async def hold() -> None:
            async with Client(params) as client:
                self.client, self.stop = client, asyncio.Event()
                ready.set()
                await self.stop.wait()

        self.session = threading.Thread(target=self.loop.run_until_complete, args=(hold(),), daemon=True)
        self.session.start()
        if not ready.wait(120):
            raise RuntimeError("inlet mcp did not start")

    def texts(self, query: str, k: int) -> list[str]:
        """The texts of a full-text search's hits in the published version."""
        if self.kind == "mcp":
            import asyncio

            call = self.client.call_tool("search", {"query": query, "k": k, "mode": "fulltext"})
            result = asyncio.run_coroutine_threadsafe(call, self.loop).result(60)
            if result.is_error:
                raise RuntimeError(f"inlet mcp: {result.content}")
            return [hit["text"] for hit in result.structured_content["hits"]]
        if self.kind == "api":
            answer = self.http.post(f"{self.url}/search", json={"query": query, "k": k, "mode": "fulltext"})
            answer.raise_for_status()
            return [hit["text"] for hit in answer.json()["hits"]]
        from query import search

        return [hit.text for hit in search(query, k=k, mode="fulltext", config=self.config)]

    def visible(self, tokens: list[str]) -> set[str]:
        """The tokens a full-text search finds: one search per GROUP tokens (any term matches)."""
        found: set[str] = set()
        for i in range(0, len(tokens), GROUP):
            group = tokens[i:i + GROUP]
            texts = self.texts(" ".join(group), max(10, 3 * len(group)))
            found |= {t for t in group if any(t.lower() in text.lower() for text in texts)}  # full-text search ignores case
        return found

    def close(self) -> None:
        if self.kind == "mcp":
            self.loop.call_soon_threadsafe(self.stop.set)
            self.session.join(60)
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(60)


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p95 and max, in seconds (None when there are none)."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    ordered = sorted(values)
    return {"n": len(values), "p50": round(statistics.median(ordered), 3),
            "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3), "max": round(ordered[-1], 3)}


class Watcher:
    """`inlet watch --json` as a process; its lines kept, its RSS and CPU sampled."""

    def __init__(self, config: Path, env: dict[str, str], log: Path, emit_only: bool = False) -> None:
        import psutil

        self.proc = subprocess.Popen([sys.executable, "-m", "inlet.cli", "watch", "--json", "--config", str(config),
                                      *(["--emit-only"] if emit_only else [])],
                                     env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
        self.ps = psutil.Process(self.proc.pid)
        self.lines: queue.Queue[dict] = queue.Queue()
        self.batches: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout or []:
            if line.startswith("{"):
                item = json.loads(line)
                self.lines.put(item)
                if item["kind"] != "ready":
                    self.batches.append(item)

    def wait_for(self, kind: str, timeout: float = 3600) -> dict:
        """The next line of this kind."""
        deadline = time.monotonic() + timeout
        while True:
            item = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if item["kind"] == kind:
                return item

    def settle(self, quiet: float, limit: float = 600) -> None:
        """Wait until the watcher has reported nothing for quiet seconds."""
        deadline = time.monotonic() + limit
        seen, since = len(self.batches), time.monotonic()
        while time.monotonic() - since < quiet and time.monotonic() < deadline:
            time.sleep(0.5)
            if len(self.batches) != seen:
                seen, since = len(self.batches), time.monotonic()

    def _tree(self) -> list:
        """The watcher and every process under it (its worker, a spare being warmed, extraction workers)."""
        return [self.ps, *self.ps.children(recursive=True)]

    def rss_mb(self) -> float:
        """Resident memory of the watcher and every process under it."""
        return self.memory_mb()["rss"]

    def memory_mb(self) -> dict[str, float]:
        """Resident memory of the watcher's process tree: all of it, and its private (anon) and file-backed parts.

        File-backed pages are mapped code and data (a shared library's pages count once touched), which the
        kernel can drop and reread; anonymous pages are what the processes allocated. Linux's /proc only.
        """
        import psutil

        total = {"rss": 0.0, "anon": 0.0, "file": 0.0}
        for proc in self._tree():
            try:
                total["rss"] += proc.memory_info().rss / 2**20
                status = Path(f"/proc/{proc.pid}/status").read_text()
            except (psutil.Error, OSError):  # exited meanwhile (a worker handing over to its spare)
                continue
            for line in status.splitlines():
                if line.startswith(("RssAnon:", "RssFile:")):
                    total[line[3:7].lower()] += int(line.split()[1]) / 1024
        return total

    def cpu_share(self, seconds: float) -> float:
        """Share of one core the watcher and its processes used over the next seconds."""
        import psutil

        def times() -> dict[int, float]:
            out = {}
            for proc in self._tree():
                try:
                    t = proc.cpu_times()
                    out[proc.pid] = t.user + t.system
                except psutil.Error:
                    pass
            return out

        before = times()
        time.sleep(seconds)
        after = times()
        return sum(after[pid] - before.get(pid, 0.0) for pid in after) / seconds

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)


QUERY_WORDS = ["collector", "exporter", "sampling", "metrics", "tracing", "context propagation", "instrumentation",
               "semantic conventions", "resource attributes", "batch processor"]


def _query_p50_here(configs: list[Path], rounds: int = 6) -> list[float]:
    """Median wall time of a default-mode search (k=5) per store, in ms: each warmed with 40 queries, then
    rounds x 80 queries per store, the stores taking turns round by round."""
    from query import search

    queries = [w + s for w in QUERY_WORDS for s in ("", " setup", " example", " config")]
    for config in configs:
        for q in queries:
            search(q, k=5, config=config)
    times: list[list[float]] = [[] for _ in configs]
    for _ in range(rounds):
        for config, kept in zip(configs, times, strict=True):
            for q in queries * 2:
                begin = time.perf_counter()
                search(q, k=5, config=config)
                kept.append((time.perf_counter() - begin) * 1000)
    return [round(statistics.median(t), 2) for t in times]


def query_p50(*configs: Path) -> list[float]:
    """_query_p50_here in a fresh process. Stores are compared in one process, taking turns: from one process
    to the next the same store's p50 varied 26-46 ms on this machine, within one the two of a pair agreed."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path; " \
           f"from bench.freshness import _query_p50_here; " \
           f"print(*_query_p50_here([Path(p) for p in {[str(c) for c in configs]!r}]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return [float(x) for x in out.stdout.strip().splitlines()[-1].split()]


def snapshot(config: Path, to: Path) -> Path:
    """A copy of the store as it is now, with a config that reads it: the start the end is compared with."""
    from schemas.config import load_config

    cfg = load_config(config)
    shutil.rmtree(to, ignore_errors=True)
    shutil.copytree(cfg.store.uri, to / "lancedb")
    text = config.read_text(encoding="utf-8").replace(str(Path(cfg.store.uri).relative_to(config.parent)),
                                                      str(to / "lancedb"))
    (to / "corpus").mkdir()
    (to / "inlet.yaml").write_text(text.replace("path: corpus", f"path: {to / 'corpus'}"), encoding="utf-8")
    return to / "inlet.yaml"


def table_shape(config: Path) -> dict[str, int]:
    """Versions, fragments and rows of the chunks table; run tags kept."""
    import lancedb

    from schemas.config import load_config

    cfg = load_config(config)
    table = lancedb.connect(cfg.store.uri).open_table(cfg.store.chunks_table)
    return {"versions": len(table.list_versions()), "fragments": table.stats()["fragment_stats"]["num_fragments"],
            "rows": table.count_rows(), "run_tags": sum(1 for t in table.tags.list() if t.startswith("run-"))}


def load(config: Path, watcher: Watcher, reader: Reader, rate: float, seconds: float, seed: int) -> dict:
    """Run the writer process against the watched folder and measure each change until it is searchable."""
    folder = str(config.parent / "corpus")
    changes: mp.Queue = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=writer, args=(folder, served_files(config), rate, seconds, changes,
                                                                seed))
    begin = time.time()
    proc.start()
    waiting: list[tuple[str, str, str, float]] = []
    created_seen: set[str] = set()
    done: dict[str, list[tuple[float, float]]] = {"edit": [], "create": [], "delete": []}  # (written at, latency)
    backlog, rss = [], []
    writing, last_sample = True, 0.0
    while writing or waiting:
        while True:
            try:
                item = changes.get_nowait()
            except queue.Empty:
                break
            if item is None:
                writing = False
            else:
                waiting.append(item)
        now = time.time()
        found = reader.visible([c[1] for c in waiting]) if waiting else set()
        for change in list(waiting):
            kind, token, _, written = change
            seen = token in found
            if (kind != "delete" and seen) or (kind == "delete" and not seen):
                waiting.remove(change)
                if kind == "delete" and token not in created_seen:
                    continue  # its creation was never seen: nothing to measure
                if kind == "create":
                    created_seen.add(token)
                done[kind].append((written - begin, time.time() - written))
        if now - last_sample >= 1:
            last_sample = now
            backlog.append((round(now - begin, 1), len(waiting)))
            memory = watcher.memory_mb()
            rss.append((round(now - begin, 1), *(round(memory[k], 1) for k in ("rss", "anon", "file"))))
        if not writing and waiting and now - waiting[0][3] > 300:
            raise RuntimeError(f"changes not searchable after 300 s: {waiting[:3]}")
        time.sleep(0.01)
    proc.join()
    minutes: dict[int, list[float]] = {}
    for kind in ("edit", "create"):
        for at, latency in done[kind]:
            minutes.setdefault(int(at // 60), []).append(latency)
    per_minute = {m: percentiles(v)["p95"] for m, v in sorted(minutes.items())}
    return {"edit": percentiles([x for _, x in done["edit"]]), "create": percentiles([x for _, x in done["create"]]),
            "delete": percentiles([x for _, x in done["delete"]]), "p95_per_minute": per_minute,
            "backlog_max": max((b for _, b in backlog), default=0), "backlog": backlog[::10],
            "rss_mb": [sample[:2] for sample in rss[::30]], **memory_growth(rss)}


def memory_growth(samples: list[tuple[float, float, float, float]]) -> dict[str, float | None]:
    """RSS growth from (seconds, rss, anon, file) samples: from the first second and from the first minute on.

    Both are reported: what the first micro-batches bring in (code pages of libraries on first use, such as
    Lance's index folding; caches filling to their bounds) is a warm-up, not growth; the split says which it is.
    """
    if not samples:
        return {"rss_growth_mb": None, "rss_growth_after_1min_mb": None, "rss_max_mb": None}
    first, last = samples[0], samples[-1]
    minute = next((s for s in samples if s[0] >= 60), None) if last[0] >= 60 else None
    return {"rss_growth_mb": round(last[1] - first[1], 1),
            "anon_growth_mb": round(last[2] - first[2], 1), "file_growth_mb": round(last[3] - first[3], 1),
            "rss_growth_after_1min_mb": round(last[1] - minute[1], 1) if minute else None,
            "anon_growth_after_1min_mb": round(last[2] - minute[2], 1) if minute else None,
            "rss_max_mb": max(s[1] for s in samples)}


def _pdf_words(path: Path) -> set[str]:
    """The long words of a PDF as Inlet extracts it (the shipped extraction settings); none if it cannot."""
    from schemas.config import ExtractionConfig
    from tasks.extract import extract_document

    try:
        extracted = extract_document("bench", str(path), ExtractionConfig())
    except Exception:  # noqa: BLE001 - a PDF Inlet cannot read offers no word
        return set()
    # Words of one element only: a running header or footer repeats on every page, and Inlet strips it.
    seen: dict[str, int] = {}
    for element in extracted.elements:
        for word in {w.lower() for w in re.findall(r"[A-Za-z]{9,}", element.get("text") or "")}:
            seen[word] = seen.get(word, 0) + 1
    return {w for w, n in seen.items() if n == 1}


def replaced_pdfs(config: Path, reader: Reader, n: int, seed: int) -> dict:
    """Replace one PDF n times with other PDFs; time each until a word only the new one has is found.

    The word comes from Inlet's own extraction of that PDF, so that "searchable" means what a reader gets. It is
    one no other chosen PDF has and no search of the store finds before the first replacement.
    """
    rng = random.Random(seed)
    pool = [p for p in sorted((SHARED / "pdf").rglob("*.pdf")) if 20_000 < p.stat().st_size < 2_000_000]
    rng.shuffle(pool)
    words = {}
    for p in pool:
        if len(words) > n:
            break
        found = _pdf_words(p)
        if found:
            words[p] = found
    unique = {p: sorted(w - set().union(*(o for q, o in words.items() if q != p))) for p, w in words.items()}
    # A word the store already matches is no sign of the new PDF: full-text search stems ("reconfiguring" finds
    # "reconfigure"), and in a large corpus its ten best hits need not include the PDF's chunk.
    tokens = {p: [next((t for t in ws if not reader.texts(t, 1)), None)] for p, ws in unique.items()}
    chosen = [p for p, t in tokens.items() if t[0]]
    target = config.parent / "corpus" / "live" / "replaced.pdf"
    target.parent.mkdir(exist_ok=True)
    latencies, missed = [], []
    for i, pdf in enumerate(chosen):
        tmp = target.with_suffix(".tmp")
        shutil.copyfile(pdf, tmp)
        os.replace(tmp, target)  # a replaced file: the new bytes appear at once
        written = time.time()
        token = tokens[pdf][0]
        while token not in reader.visible([token]):
            if time.time() - written > 120:
                missed.append(pdf.name)
                break
            time.sleep(0.02)
        else:
            if i:  # the first is a new file (and starts the extraction workers); the rest replace it
                latencies.append(time.time() - written)
    return {"replaced": percentiles(latencies), "pdfs": [f"{p.name} ({p.stat().st_size // 1024} KB)" for p in chosen],
            "not_searchable_in_120_s": missed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedder", default="hashing", choices=["e5", "hashing", "minilm", "static"])
    parser.add_argument("--rate", type=float, default=1.0, help="changes per second")
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--files", type=int, default=None, help="index only the first N Markdown files")
    parser.add_argument("--pdfs", type=int, default=0, help="then replace a PDF this many times")
    parser.add_argument("--idle", type=float, default=30, help="seconds of idle CPU measured after the load")
    parser.add_argument("--work", type=Path, default=Path("/tmp/inlet-bench-freshness"))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--soak", action="store_true", help="also report table shape and query p50 at start/end")
    parser.add_argument("--emit-only", action="store_true", help="run `inlet watch --emit-only` and serve the "
                        "ingest deployment, whose trigger runs each emitted change (use a low --rate)")
    parser.add_argument("--reader", default="query", choices=["query", "api", "mcp"],
                        help="poll query.search in this process, POST /search of `inlet api`, or the search tool "
                        "of `inlet mcp`")
    args = parser.parse_args()
    if not (SHARED / "markdown").is_dir():
        sys.exit("../shared/corpora/markdown is not present")
    import providers  # noqa: F401 - offline switches

    work = args.work / f"{args.embedder}-{args.files or 'all'}"
    env, server = start_prefect(args.work / "prefect")
    watcher = reader = served = None
    try:
        config = build_store(work, args.embedder, args.files, env)
        shutil.rmtree(config.parent / "corpus" / "live", ignore_errors=True)  # a previous round's notes
        # What this process reads: the same server, the same offline switches.
        os.environ.update({k: v for k, v in env.items() if k.startswith("PREFECT_")})
        if args.emit_only:
            served = serve_ingest(config, env, work / "serve.log")
        watcher = Watcher(config, env, work / "watch.log", emit_only=args.emit_only)
        ready = watcher.wait_for("ready", 600)
        first = watcher.wait_for("emit" if args.emit_only else "ingest", 3600)
        if args.emit_only:
            drained()  # the start's reconciliation, run by the deployment's trigger
        reader = Reader(config, args.reader, env, work / "api.log")
        result: dict = {"embedder": args.embedder, "rate": args.rate, "seconds": args.seconds, "reader": args.reader,
                        "files": json.loads((work / ".built").read_text())["files"], "warm_up": ready["warmed"],
                        "first_reconcile_s": first["seconds"]}
        if args.soak:
            watcher.settle(15)  # the start's own maintenance done: the snapshot is of a store at rest
            result["start"] = table_shape(config)
            start_copy = snapshot(config, work.parent / f"{work.name}-start")
        result["load"] = load(config, watcher, reader, args.rate, args.seconds, args.seed)
        if args.emit_only:
            result["ingest_runs"] = drained()
            result["emitted"] = sum(1 for b in watcher.batches if b["kind"] == "emit")
        batches = [b for b in watcher.batches if b["kind"] == "ingest" and b["error"] is None]
        result["micro_batches"] = len(batches)
        result["batch_seconds"] = percentiles([b["seconds"] for b in batches])
        with (work / "batches.jsonl").open("w") as fh:  # every micro-batch's line, for a closer look
            fh.writelines(json.dumps(b) + "\n" for b in watcher.batches)
        result["maintenance_runs"] = sum(1 for b in watcher.batches if b["kind"] == "maintenance")
        result["errors"] = [b["error"] for b in watcher.batches if b["error"]][:5]
        watcher.settle(15)  # maintenance due after the load runs at its first idle moment: not idle CPU
        result["maintenance_runs"] = sum(1 for b in watcher.batches if b["kind"] == "maintenance")
        result["workers_replaced"] = [b.get("detail") for b in watcher.batches if b["kind"] == "worker"]
        result["idle_cpu_share"] = round(watcher.cpu_share(args.idle), 4)
        result["rss_mb_end"] = round(watcher.rss_mb(), 1)
        if args.pdfs:
            result["pdf"] = replaced_pdfs(config, reader, args.pdfs, args.seed)
        if args.soak:
            result["end"] = table_shape(config)
            before, after = query_p50(start_copy, config)
            result["query_p50_ms"] = {"start": before, "end": after, "ratio": round(after / before, 3)}
    finally:  # whatever failed, nothing of this round is left running
        for proc in (watcher, reader):
            if proc is not None:
                proc.stop() if isinstance(proc, Watcher) else proc.close()
        if served is not None:
            os.killpg(served.pid, 15)
            served.wait(60)
        os.killpg(server.pid, 15)
        server.wait(60)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
