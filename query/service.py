"""The knowledge base as agents and applications reach it (`inlet mcp`, `inlet api`): four operations, each at the
caller's clearance, each written to the access log.

The clearance is the Caller's, fixed when the server starts (or by the API key a request carries); no operation takes
one as an argument. Filters are values, never SQL. Every request reads the version published at that moment, so a
long-lived server moves to a newly published run without a restart.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread
import lancedb
import pyarrow as pa
import pyarrow.compute as pc

from query.history import RunsHistory
from query.history import versions as run_history
from query.search import (
    SELECTED,
    Mode,
    SearchResult,
    has_expiring_rows,
    in_published_version,
    modified_times,
    next_expiry,
    published_table,
    quote,
    result_of,
    search,
    store_connection,
    warm,
    version_fact,
    visible_clause,
)
from schemas.answers import (
    CitationOut,
    ContextAnswer,
    Filters,
    Hit,
    NeighborOut,
    SearchAnswer,
    SourceInfo,
    SourcesAnswer,
    VersionInfo,
    VersionsAnswer,
)
from schemas.config import ACCESS_LEVELS, ApiKeys, InletConfig
from schemas.errors import (
    AnswerTimeoutError,
    ConfigError,
    InletError,
    NotAvailableError,
    QueryError,
    StoreError,
)

MAX_NEIGHBORS = 10
T = TypeVar("T")


# The call a transport is handling: its operation marks it logged, so that the transport can log the calls that
# never reached one (arguments refused by the schema) and the access log still has one line per call.
_CALL: ContextVar[dict[str, bool] | None] = ContextVar("inlet_call", default=None)


@contextmanager
def watch_call() -> Iterator[dict[str, bool]]:
    """Mark the span of one call; its ["logged"] says whether an operation wrote its access-log line."""
    holder = {"logged": False}
    token = _CALL.set(holder)
    try:
        yield holder
    finally:
        _CALL.reset(token)


LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Caller:
    """Who is asking, and the clearance every answer to them is read at."""

    name: str
    clearance: str

    def __post_init__(self) -> None:
        if self.clearance not in ACCESS_LEVELS:
            msg = f"clearance '{self.clearance}' is not one of {', '.join(ACCESS_LEVELS)}"
            raise QueryError(msg)


@dataclass
class Served:
    """What one call served, for its access-log line."""

    doc_ids: set[str] = field(default_factory=set)
    chunks: int = 0
    denied: int = 0


UNKNOWN = Caller("unknown", "public")  # the access log's name for a request without a valid key


def key_digest(key: str) -> str:
    """An API key as the keys file knows it: its sha256, in hex."""
    return hashlib.sha256(key.encode()).hexdigest()


def callers_of(keys: ApiKeys | None) -> dict[str, Caller] | None:
    """A keys file's callers by their key's sha256; None for a server without keys."""
    return {k.sha256: Caller(k.caller, k.clearance) for k in keys.keys} if keys else None


class AccessLog:
    """One JSON line per call: time, caller, clearance, tool, the query's sha256, documents served, denials."""

    def __init__(self, path: Path, log_queries: bool = False) -> None:
        self.path = path
        self.log_queries = log_queries
        self._lock = threading.Lock()
        try:  # a log that cannot be written stops the server before it serves anything unlogged
            path.parent.mkdir(parents=True, exist_ok=True)
            path.open("a", encoding="utf-8").close()
        except OSError as exc:
            msg = f"serving.access_log: cannot write {path}: {exc.strerror or exc}"
            raise ConfigError(msg) from None

    def write(self, caller: Caller, tool: str, query: str, served: Served, error: str | None) -> None:
        """Append a call's line; the query's text only when log_queries is on."""
        line = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"), "caller": caller.name,
                "clearance": caller.clearance, "tool": tool,
                # surrogatepass: a request's JSON may carry a lone surrogate (\ud800), which is text, not UTF-8
                "query_sha256": hashlib.sha256(query.encode("utf-8", "surrogatepass")).hexdigest(),
                "doc_ids": sorted(served.doc_ids), "chunks": served.chunks, "denied": served.denied,
                "error": error}
        if self.log_queries:
            line["query"] = query
        with self._lock, self.path.open("a", encoding="utf-8", errors="backslashreplace") as out:
            out.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
        holder = _CALL.get()
        if holder is not None:
            holder["logged"] = True


def _hit(result: SearchResult, score: float | None) -> Hit:
    cite = result.citation
    return Hit(chunk_id=result.chunk_id, doc_id=result.doc_id, text=result.text, score=score,
               citation=CitationOut(title=cite.title, uri=cite.uri, heading_path=list(cite.heading_path),
                                    pages=cite.pages, text=str(cite)),
               metadata=result.metadata,
               before=[NeighborOut(chunk_id=n.chunk_id, chunk_index=n.chunk_index, text=n.text) for n in result.before],
               after=[NeighborOut(chunk_id=n.chunk_id, chunk_index=n.chunk_index, text=n.text) for n in result.after])


def _check_filters(filters: Filters | None) -> Filters | None:
    """Refuse filters that are not {field: value or [values]} (a string would be read as SQL)."""
    if filters is None:
        return None
    if not isinstance(filters, dict):
        msg = "filters: expected {field: value or [values]}"
        raise QueryError(msg)
    for key, value in filters.items():
        values = value if isinstance(value, list) else [value]
        if not isinstance(key, str) or not all(isinstance(v, str | int | float | bool) for v in values):
            msg = f"filters: '{key}' must map to a value or a list of values"
            raise QueryError(msg)
    return filters


class KnowledgeBase:
    """search, get_context, list_sources and versions over one config's store, logged per call."""

    def __init__(self, cfg: InletConfig, log: AccessLog) -> None:
        self.cfg = cfg
        self.log = log
        self._limiter: anyio.CapacityLimiter | None = None  # made in the server's event loop, on its first read
        self._runs_table: lancedb.table.Table | None = None
        self._history: tuple[tuple[int, int | None], list[VersionInfo]] | None = None  # (mark, runs)
        self._history_lock = threading.Lock()
        self._history_rows = RunsHistory()  # the runs rows read so far, by row id
        self._infos: dict[tuple[int, int | None, bool], VersionInfo] = {}  # (row id, chunks version, published)

    def _reads(self) -> anyio.CapacityLimiter:
        """The server's limit on reads at once (serving.concurrency): beyond it they queue, not share the cores."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.cfg.serving.concurrency or 2 * (os.cpu_count() or 1))
        return self._limiter

    async def in_time(self, caller: Caller, operation: Callable[..., T], *args: object) -> T:
        """Run one of these operations for caller in a worker thread; past serving.timeout_s, AnswerTimeoutError.

        The time spent waiting for a turn (serving.concurrency) counts. A thread cannot be stopped: the read goes
        on, is logged when it ends, and its answer is dropped; it gives its turn back at once (anyio releases the
        limiter when it abandons a thread), so for a while more reads than serving.concurrency may run. The
        servers' rate limit bounds how many such reads one caller can leave behind.
        """
        limit = self.cfg.serving.timeout_s
        with anyio.move_on_after(limit):
            return await anyio.to_thread.run_sync(functools.partial(operation, caller, *args), abandon_on_cancel=True,
                                                  limiter=self._reads())
        self.log.write(caller, operation.__name__, "", Served(),
                       f"503: no answer within serving.timeout_s ({limit:g} s)")
        msg = f"no answer within {limit:g} s (serving.timeout_s): the server is busy, retry later"
        raise AnswerTimeoutError(msg)

    @contextmanager
    def _call(self, caller: Caller, tool: str, query: str) -> Iterator[Served]:
        served = Served()
        try:
            yield served
        except Exception as exc:
            self.log.write(caller, tool, query, served, f"{type(exc).__name__}: {exc}")
            raise
        self.log.write(caller, tool, query, served, None)

    def warm(self) -> str:
        """Load what searches need before the first caller waits for it; say what was loaded, or why nothing was.

        Otherwise a new server's first searches load it as they meet it: index parts, the local query model (e5's
        takes ~1.3 s to load), the language profiles. The chunks table's indexes are read whole (query.search.warm),
        then one search per mode is made at public clearance, unlogged (no caller made it). A Gemini-embedded store
        gets no vector probe: there is no model to load, and a probe would be a paid API call at every start. A store
        without a chunks table yet has nothing to load: said, not raised, and the server starts. On a 19k-chunk
        store in the page cache it took 0.1 s; its share of bench/README.md's "Under load" gain is not separated
        from the live worker's lower priority, measured with it.
        """
        start = time.perf_counter()
        probe = "how do I get started with this"  # words enough for the query's language to be detected
        try:
            warm(self.cfg)
        except InletError as exc:
            return f"nothing loaded ahead ({exc}); the first searches load what they need"
        remote = self.cfg.embedding.kind == "gemini"
        loaded, skipped = [], []
        for mode in ("fulltext",) if remote else ("vector", "fulltext", "hybrid"):
            try:
                search(probe, k=1, mode=mode, config=self.cfg, clearance="public")
                loaded.append(mode)
            except InletError as exc:  # e.g. no full-text index: that mode's searches will say so themselves
                skipped.append(f"{mode}: {exc}")
        said = f"; not loaded: {'; '.join(skipped)}" if skipped else ""
        return (f"indexes, {'' if remote else 'query embedder and '}{', '.join(loaded) or 'no'} search loaded in "
                f"{time.perf_counter() - start:.1f} s{said}")

    def search(self, caller: Caller, query: str, k: int = 5, filters: Filters | None = None,
               mode: Mode | None = None, as_of: str | int | None = None) -> SearchAnswer:
        """The k best chunks the caller may read, with citations; as_of: a run id, version or ISO time."""
        args = json.dumps({"query": query, "k": k, "filters": filters, "mode": mode, "as_of": as_of}, sort_keys=True)
        with self._call(caller, "search", args) as served:
            if not 1 <= k <= self.cfg.serving.max_k:
                msg = f"k must be between 1 and {self.cfg.serving.max_k}"
                raise QueryError(msg)
            if len(query) > self.cfg.serving.max_query_chars:
                msg = f"the query is {len(query)} characters long: at most {self.cfg.serving.max_query_chars}"
                raise QueryError(msg)
            filters = _check_filters(filters)
            if filters and "access_level" in filters:  # asking for more than the clearance is counted, not served
                wanted = filters["access_level"] if isinstance(filters["access_level"], list) else [
                    filters["access_level"]]
                served.denied += sum(str(w) not in ACCESS_LEVELS[: ACCESS_LEVELS.index(caller.clearance) + 1]
                                     for w in wanted)
            version = int(as_of) if isinstance(as_of, str) and as_of.isdigit() else as_of
            results = search(query, k=k, where=filters or None, mode=mode, clearance=caller.clearance,
                             as_of=version, config=self.cfg)
            hits = list(results)
            if as_of is not None:  # an old version holds access levels as they were: serve none raised since
                now = self._levels([h.doc_id for h in hits])
                allowed = set(ACCESS_LEVELS[: ACCESS_LEVELS.index(caller.clearance) + 1])
                kept = [h for h in hits if now.get(h.doc_id, h.metadata["access_level"]) in allowed]
                served.denied += len(hits) - len(kept)
                hits = kept
            served.doc_ids |= {h.doc_id for h in hits}
            served.chunks = len(hits)
            return SearchAnswer(hits=[_hit(h, h.score) for h in hits], notices=results.notices,
                                version=results.version)

    def _levels(self, doc_ids: list[str]) -> dict[str, str]:
        """Each document's access level in the published version now (documents gone since are absent)."""
        if not doc_ids:
            return {}
        table, _ = published_table(self.cfg)
        rows = (table.search().where(f"doc_id IN ({', '.join(quote(d) for d in sorted(set(doc_ids)))})")
                .select(["doc_id", "access_level"]).limit(None).to_arrow().to_pylist())
        order = {level: i for i, level in enumerate(ACCESS_LEVELS)}
        levels: dict[str, str] = {}
        for row in rows:  # a document's chunks share a level; the highest wins if they ever differ
            old = levels.get(row["doc_id"])
            if old is None or order[row["access_level"]] > order[old]:
                levels[row["doc_id"]] = row["access_level"]
        return levels

    def get_context(self, caller: Caller, chunk_id: str, neighbors: int = 1) -> ContextAnswer:
        """A chunk the caller may read, with up to `neighbors` chunks before and after it, in order."""
        with self._call(caller, "get_context", json.dumps({"chunk_id": chunk_id, "neighbors": neighbors})) as served:
            if not 0 <= neighbors <= MAX_NEIGHBORS:
                msg = f"neighbors must be between 0 and {MAX_NEIGHBORS}"
                raise QueryError(msg)

            def read(table: lancedb.table.Table, version: int) -> tuple[ContextAnswer | None, bool]:
                """The chunk with its neighbours from one version (else None, and whether it exists but is hidden)."""
                guard = visible_clause(table, str(self.cfg.store.uri), version, caller.clearance)
                rows = self._rows(table, f"({guard}) AND chunk_id = {quote(chunk_id)}", 1)
                if not rows:
                    return None, bool(self._rows(table, f"chunk_id = {quote(chunk_id)}", 1))
                chunk = result_of(rows[0], 0.0)
                index = chunk.metadata["chunk_index"]
                near = self._rows(table, f"({guard}) AND doc_id = {quote(chunk.doc_id)} AND chunk_index BETWEEN "
                                         f"{index - neighbors} AND {index + neighbors} AND chunk_id != "
                                         f"{quote(chunk_id)}", None)
                near.sort(key=lambda r: r["chunk_index"])
                return ContextAnswer(chunk=_hit(chunk, None),
                                     before=[_neighbor(r) for r in near if r["chunk_index"] < index],
                                     after=[_neighbor(r) for r in near if r["chunk_index"] > index],
                                     version=version), False

            # Read again from a table pinned to the version begun with if a run committed meanwhile: one version.
            answer, hidden = in_published_version(self.cfg, read)
            if answer is None:
                # The same answer whether the chunk is missing, expired or above the clearance: nothing leaks.
                served.denied += hidden
                msg = f"no chunk '{chunk_id}' is available to this caller"
                raise NotAvailableError(msg)
            served.doc_ids.add(answer.chunk.doc_id)
            served.chunks = 1 + len(answer.before) + len(answer.after)
            return answer

    @staticmethod
    def _rows(table: lancedb.table.Table, where: str, limit: int | None) -> list[dict]:
        return table.search().where(where).select(SELECTED).limit(limit).to_arrow().to_pylist()

    def list_sources(self, caller: Caller) -> SourcesAnswer:
        """The configured sources with the documents and chunks the caller may read, and the store's freshness."""
        with self._call(caller, "list_sources", ""):
            runs = self._runs()
            try:
                version, (chunks, docs) = in_published_version(self.cfg, functools.partial(self._tally,
                                                                                           caller.clearance))
            except StoreError:  # nothing ingested yet: every source is empty
                return SourcesAnswer(sources=[_source(s.name, s.kind, 0, set(), {}) for s in self.cfg.sources],
                                     published_version=None, published_run=None, published_at=None,
                                     last_run=runs[-1].run_id if runs else None,
                                     last_run_at=runs[-1].finished_at if runs else None)
            mtimes = modified_times(self.cfg)
            sources = [_source(s.name, s.kind, chunks.get(s.name, 0), docs.get(s.name, set()), mtimes)
                       for s in self.cfg.sources]
            published = next((r for r in runs if r.published), None)
            return SourcesAnswer(sources=sources, published_version=version,
                                 published_run=published.run_id if published else None,
                                 published_at=published.finished_at if published else None,
                                 last_run=runs[-1].run_id if runs else None,
                                 last_run_at=runs[-1].finished_at if runs else None)

    def _tally(self, clearance: str, table: lancedb.table.Table, version: int
               ) -> tuple[int, tuple[dict[str, int], dict[str, set[str]]]]:
        """Chunks and documents per source that a clearance may read in one version: counted once per version.

        The version is read once for every clearance (its chunks per source, document, access level and expiry:
        ~14 ms at 19.2k chunks), and each clearance's tally is cut from those groups. Read once per clearance, the
        first sources calls after each publish paid a scan per clearance asked (load: median 172 ms in the half
        second after a publish, 16 ms otherwise). In a version whose rows expire, what a clearance may read
        changes only when the next of them expires: its tally is kept until then.
        """
        store = str(self.cfg.store.uri)
        now = datetime.now(UTC).replace(microsecond=0)  # the expiry clause compares whole seconds
        expiring = has_expiring_rows(table, store, version)
        groups = version_fact(table, store, version, "sources:groups", functools.partial(_chunk_groups, expiring))
        fact = f"sources:{clearance}"
        if expiring:
            until = next_expiry(table, store, version, now)
            fact += f":until:{until.isoformat() if until else 'never'}"
        return version, version_fact(table, store, version, fact,
                                     lambda _: _tally_of(groups, clearance, now if expiring else None))

    def published_version(self) -> int | None:
        """The chunks-table version readers are served now, None before the first run: what change notices follow."""
        try:
            return published_table(self.cfg)[1]
        except StoreError:  # nothing ingested yet
            return None

    def versions(self, caller: Caller) -> VersionsAnswer:
        """The runs, oldest first: times, status, the publish gate's verdict, and which one readers are served."""
        with self._call(caller, "versions", ""):
            return VersionsAnswer(versions=self._runs())

    def _runs(self) -> list[VersionInfo]:
        """The runs, read again only once a run has written its row or the published tag has moved.

        Sources and versions ask at every call, and a live watcher adds a run every few seconds: a new mark reads
        the runs' row ids and only the rows new since (query.history.RunsHistory). Both marks are read first, so
        a run that lands while the history is read is seen at the next call.
        """
        mark = self._history_mark()
        kept = self._history
        if mark is not None and kept is not None and kept[0] == mark:
            return kept[1]
        with self._history_lock:  # calls that meet a new mark together wait for one read, not each make their own
            kept = self._history
            if mark is not None and kept is not None and kept[0] == mark:
                return kept[1]
            return self._read_runs(mark)

    def _read_runs(self, mark: tuple[int, int | None] | None) -> list[VersionInfo]:
        """Read the runs history at mark's runs-table version and keep it under mark (none kept without one)."""
        if mark is None:  # no runs table to pin: read as `inlet versions` does (nothing, or a table made meanwhile)
            return [_version_info(r) for r in run_history(self.cfg)]
        db = store_connection(self.cfg)
        try:
            runs = db.open_table(self.cfg.store.runs_table)
            runs.checkout(mark[0])  # the row ids listed and the rows fetched by them: one version
        except (OSError, RuntimeError, ValueError):  # dropped and made anew since the mark was read
            return [_version_info(r) for r in run_history(self.cfg)]
        try:
            chunks = db.open_table(self.cfg.store.chunks_table)
        except (FileNotFoundError, ValueError):
            chunks = None
        infos: dict[tuple[int, int | None, bool], VersionInfo] = {}
        for entry in self._history_rows.read(runs, chunks, self.cfg.store.chunks_table):
            key = (entry["row_id"], entry["chunks_version"], entry["published"])
            infos[key] = self._infos.get(key) or _version_info(entry)  # 1.6k models made anew cost ~5 ms
        self._infos = infos
        runs_now = list(infos.values())
        self._history = (mark, runs_now)
        return runs_now

    def _history_mark(self) -> tuple[int, int | None] | None:
        """The runs table's version and the published version now; None when there is no runs table to read."""
        try:
            if self._runs_table is None:
                self._runs_table = store_connection(self.cfg).open_table(self.cfg.store.runs_table)
            return self._runs_table.version, self.published_version()
        except (OSError, RuntimeError, ValueError):  # no runs table yet, or one dropped and made anew
            self._runs_table = None
            return None


def _chunk_groups(expiring: bool, table: lancedb.table.Table) -> pa.Table:
    """A version's chunk counts per source, document, access level (and expiry): what each clearance sees, grouped.

    Grouped by Arrow: a loop over 19.2k chunks held the GIL ~8 ms while the server's other reads waited.
    """
    columns = ["source", "doc_id", "access_level", *(["expires_at"] if expiring else [])]
    rows = table.search().select(columns).limit(None).to_arrow()
    return rows.group_by(columns).aggregate([([], "count_all")])


def _tally_of(groups: pa.Table, clearance: str, now: datetime | None
              ) -> tuple[dict[str, int], dict[str, set[str]]]:
    """Chunks and documents per source in groups that clearance may read (and, given now, not expired by then)."""
    allowed = pa.array(ACCESS_LEVELS[: ACCESS_LEVELS.index(clearance) + 1], pa.string())
    keep = pc.is_in(groups["access_level"], value_set=allowed)
    if now is not None:  # as visible_clause: no expiry, or one after now
        expires = groups["expires_at"]
        later = pc.greater(expires, pa.scalar(now, expires.type))
        keep = pc.and_(keep, pc.or_kleene(pc.is_null(expires), later))
    kept = groups.filter(keep)
    chunks: dict[str, int] = {}
    docs: dict[str, set[str]] = {}
    for src, doc, n in zip(kept["source"].to_pylist(), kept["doc_id"].to_pylist(), kept["count_all"].to_pylist(),
                           strict=True):
        chunks[src] = chunks.get(src, 0) + n
        docs.setdefault(src, set()).add(doc)
    return chunks, docs


def _version_info(entry: dict) -> VersionInfo:
    return VersionInfo(run_id=entry["run_id"], started_at=entry["started_at"], finished_at=entry["finished_at"],
                       status=entry["status"], published=entry["published"], gate=entry["gate"],
                       chunks_version=entry["chunks_version"])


def _neighbor(row: dict) -> NeighborOut:
    return NeighborOut(chunk_id=row["chunk_id"], chunk_index=row["chunk_index"], text=row["text"])


def _source(name: str, kind: str, chunks: int, ids: set[str], mtimes: dict[str, float]) -> SourceInfo:
    times = [mtimes[d] for d in ids if d in mtimes]
    return SourceInfo(name=name, kind=kind, documents=len(ids), chunks=chunks,
                      last_modified=datetime.fromtimestamp(max(times), UTC) if times else None)


def open_knowledge_base(cfg: InletConfig, access_log: Path | None = None,
                        log_queries: bool | None = None) -> KnowledgeBase:
    """A KnowledgeBase over cfg's store, logging to access_log (default: serving.access_log)."""
    store_connection(cfg)  # the store's options, for a store on object storage
    serving = cfg.serving
    if access_log is None and serving.access_log is None:
        msg = "serving.access_log: the run artifacts are on object storage; name a local file for the access log"
        raise ConfigError(msg)
    return KnowledgeBase(cfg, AccessLog(access_log or serving.access_log,
                                        serving.log_queries if log_queries is None else log_queries))


def check_exposure(host: str, keys: ApiKeys | None, insecure: bool, server: str) -> str | None:
    """Refuse a server on a non-loopback address without keys (ConfigError); return the warning to log when allowed.

    Without keys every request is answered at the server's clearance: on 127.0.0.1 that is the local user's, on any
    other address it is anyone's who can reach the port.
    """
    if keys is not None or host in LOOPBACK:
        return None
    if not insecure:
        msg = (f"{server} on {host} without a keys file would answer anyone who can reach it at the server's "
               "clearance: give --keys FILE (or serving.api_keys), bind 127.0.0.1, or pass --insecure-no-auth to "
               "accept that")
        raise ConfigError(msg)
    return (f"{server} serves {host} WITHOUT AUTHENTICATION (--insecure-no-auth): anyone who can reach this port is "
            "answered at the server's clearance")
