"""Search over the chunks table: vector, full-text or hybrid; filters, clearance, time travel, neighbours."""

from __future__ import annotations

import bisect
import functools
import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal, TypeVar

import lancedb

from providers.embedders import Embedder, query_embedder
from providers.keys import use_secret_block
from query.fusion import AGREEMENT_WINDOW, fuse_sides
from schemas.arrow import PUBLISHED_TAG
from schemas.config import ACCESS_LEVELS, InletConfig, QueryConfig, load_config
from schemas.errors import EmbedderMismatchError, QueryError, StoreError
from schemas.results import Citation, Neighbor, SearchResult, SearchResults
from store.tables import tag_versions

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "inlet.yaml"
_COLUMNS = ("source", "doc_type", "access_level", "language", "title", "uri", "doc_id")
# Every column a result needs. Each costs a random read per hit, so hybrid sides read row ids and scores only.
_SELECT = ["chunk_id", "doc_id", "text", "title", "uri", "heading_path", "page_start", "page_end", "source",
           "doc_type", "tags", "access_level", "expires_at", "language", "extra", "chunk_index", "total_chunks"]


Mode = Literal["vector", "fulltext", "hybrid"]
T = TypeVar("T")


def _quote(value: object) -> str:
    if isinstance(value, bool | int | float):
        return str(value).lower() if isinstance(value, bool) else str(value)
    return "'" + str(value).replace("'", "''") + "'"


def where_clause(where: dict[str, object] | str | None) -> str | None:
    """Turn {field: value} filters into SQL; tags match any listed tag; other keys are free metadata fields."""
    if where is None or isinstance(where, str):
        return where
    clauses = []
    for key, value in where.items():
        values = value if isinstance(value, list | tuple | set) else [value]
        if key == "tags":
            clauses.append("(" + " OR ".join(f"array_has(tags, {_quote(v)})" for v in values) + ")")
        elif key in _COLUMNS:
            clauses.append(f"{key} IN ({', '.join(_quote(v) for v in values)})")
        else:  # free fields live in the extra JSON column, written with sorted keys and ", " / ": " separators
            likes = [f"extra LIKE {_quote('%' + json.dumps({key: v})[1:-1] + '%')}" for v in values]
            clauses.append("(" + " OR ".join(likes) + ")")
    return " AND ".join(clauses) or None


def select_variant(cfg: InletConfig, variant: str | None) -> InletConfig:
    if variant is None:
        return cfg
    if variant not in cfg.variants:
        msg = f"variant '{variant}' is not in the config's variants ({', '.join(cfg.variants) or 'none'})"
        raise QueryError(msg)
    return cfg.variant(variant)


def _load_config(path: Path) -> InletConfig:
    """Load a config once per version of the file (queries come many to a config)."""
    stat = path.stat() if path.exists() else None
    return _load_config_at(path, stat.st_mtime_ns if stat else 0, stat.st_size if stat else 0)


@functools.lru_cache(maxsize=16)
def _load_config_at(path: Path, _mtime_ns: int, _size: int) -> InletConfig:
    return load_config(path)


_STORE_OPTIONS: dict[str, dict[str, str]] = {}  # store URI -> LanceDB storage options (object storage)


def _connect(uri: str) -> lancedb.DBConnection:
    """One connection per store and process: it holds the index caches (a new one costs ~100 ms a query).

    Reads are checked against the latest version every time, so cached tables see each new run.
    """
    key = (uri, json.dumps(_STORE_OPTIONS.get(uri, {}), sort_keys=True))
    with _CONNECTING:
        db = _CONNECTIONS.get(key)
        if db is None:
            bounds = _CACHE_BOUNDS.get(uri)
            session = (lancedb.Session(index_cache_size_bytes=bounds[0], metadata_cache_size_bytes=bounds[1])
                       if bounds else lancedb.Session())
            db = lancedb.connect(uri, read_consistency_interval=timedelta(0),
                                 storage_options=json.loads(key[1]) or None, session=session)
            _CONNECTIONS[key] = db
        return db


# The read side's connections, by (store, options), and the bounds warm() gave their caches, by store. LanceDB's own
# bounds (6 GB of index, 1 GB of metadata) are never reached by a one-shot query, but a server under a live watcher
# keeps what it read of every version it met: each publish adds index delta segments and manifests, and a merge
# gives an index new segments. At 19k chunks that grew a server's caches ~7 MB a minute, without end.
_CONNECTIONS: dict[tuple[str, str], lancedb.DBConnection] = {}
_CACHE_BOUNDS: dict[str, tuple[int, int]] = {}
_CONNECTING = threading.Lock()


def cache_bounds(loaded: int) -> tuple[int, int]:
    """Index and metadata cache bounds (bytes) for a server whose served version took `loaded` bytes to read whole.

    The served version's index parts with a quarter more and 8 MB (the delta segments later runs add, a merged
    segment read while the old one still serves), and an eighth of it with 8 MB for metadata (manifests, fragment
    lists). What is not asked for again goes first: old versions' segments and manifests. At 19k chunks (27 MB
    loaded) that is 42 + 11 MB. With 1.5x + 16 MB and 1/4 + 16 MB (56 + 23 MB) they grew 22 MB in 3.5 minutes
    under a live watcher (Session.size_bytes), on the way to a bound 52 MB above where they began.
    """
    return loaded + loaded // 4 + (8 << 20), loaded // 8 + (8 << 20)


def store_connection(cfg: InletConfig) -> lancedb.DBConnection:
    """The read side's connection to cfg's store, with its storage options."""
    if cfg.store.options:
        _STORE_OPTIONS[str(cfg.store.uri)] = dict(cfg.store.options)
    return _connect(str(cfg.store.uri))


_TABLES: dict[tuple[str, str], lancedb.table.Table] = {}


def _open_chunks(cfg: InletConfig, as_of: int | str | datetime | None = None) -> lancedb.table.Table:
    uri, name = str(cfg.store.uri), cfg.store.chunks_table
    if as_of is None and (uri, name) in _TABLES:
        return _TABLES[(uri, name)]
    try:
        table = store_connection(cfg).open_table(name)
    except (FileNotFoundError, ValueError):
        msg = f"no '{name}' table in {uri}: run `inlet ingest` first"
        raise StoreError(msg) from None
    if as_of is None:
        _TABLES[(uri, name)] = table
    else:  # a table object of its own: checkout pins it to that version
        table.checkout(resolve_version(table, as_of))
    return table


def resolve_version(table: lancedb.table.Table, as_of: int | str | datetime) -> int:
    """Turn a version number, a run tag or a timestamp (the table as it was then) into a table version."""
    versions = table.list_versions()
    if isinstance(as_of, int):
        if as_of not in {v["version"] for v in versions}:
            msg = f"as_of: table '{table.name}' has no version {as_of}"
            raise QueryError(msg)
        return as_of
    if isinstance(as_of, str):
        tags = tag_versions(table)  # listed, not read by name: most strings (ISO times) are not valid tag names
        if as_of in tags:
            return tags[as_of]
        try:
            as_of = datetime.fromisoformat(as_of)
        except ValueError:
            msg = f"as_of: '{as_of}' is neither a run tag of table '{table.name}' nor an ISO timestamp"
            raise QueryError(msg) from None
    moment = as_of if as_of.tzinfo else as_of.replace(tzinfo=UTC)
    before = [v for v in versions if _aware(v["timestamp"]) <= moment]
    if not before:
        msg = f"as_of: table '{table.name}' did not exist yet at {moment.isoformat()}"
        raise QueryError(msg)
    return max(before, key=lambda v: v["version"])["version"]


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.astimezone(UTC)


# (store, table, version, fact) -> value, least recently asked first. A server meets a new version every few
# seconds under a live watcher and asks only the newest few again: keeping every version's facts (a sources tally
# is ~60 KB at 19k chunks, a documents table's modification times ~50 KB) grew a server ~30 MB in 100 s of load.
_VERSION_FACTS: OrderedDict[tuple[str, str, int, str], object] = OrderedDict()
FACTS_KEPT = 64  # ~8 versions' facts: the published version, one pinned while a run commits, a few `as_of` ones
_FACT_LOCKS: dict[tuple[str, str, int, str], threading.Lock] = {}  # one per fact being computed
_FACTS_LOCK = threading.Lock()
_MISSING = object()


def _known_fact(key: tuple[str, str, int, str]) -> object:
    with _FACTS_LOCK:
        found = _VERSION_FACTS.get(key, _MISSING)
        if found is not _MISSING:
            _VERSION_FACTS.move_to_end(key)
        return found


def version_fact(table: lancedb.table.Table, store: str, version: int, fact: str,
                 compute: Callable[[lancedb.table.Table], T]) -> T:
    """Compute a fact about a table version once: versions never change, so neither do their facts.

    Once per process, not once per caller: a server's reads that meet a new version together wait for the one
    computing it (a sources tally is ~90 ms of CPU at 19k chunks) instead of each computing it too. The FACTS_KEPT
    facts asked for last are kept; an older one is computed again if asked for again.
    """
    key = (store, table.name, version, fact)
    found = _known_fact(key)
    if found is _MISSING:
        with _FACTS_LOCK:
            lock = _FACT_LOCKS.setdefault(key, threading.Lock())
        with lock:
            found = _known_fact(key)  # computed while this thread waited
            if found is _MISSING:
                try:
                    found = compute(table)
                    with _FACTS_LOCK:
                        _VERSION_FACTS[key] = found
                        while len(_VERSION_FACTS) > FACTS_KEPT:
                            _VERSION_FACTS.popitem(last=False)
                finally:  # stored first: a caller arriving now finds the value, not a new lock
                    with _FACTS_LOCK:
                        _FACT_LOCKS.pop(key, None)
    return found  # type: ignore[return-value]


def _table_embedder(table: lancedb.table.Table, store: str, version: int) -> str:
    return version_fact(table, store, version, "embedder", _read_embedder)


def has_expiring_rows(table: lancedb.table.Table, store: str, version: int) -> bool:
    """Tell whether any row of this table version can expire (tables from before the column cannot)."""
    return version_fact(table, store, version, "expiring", lambda t: "expires_at" in t.schema.names
                         and t.count_rows("expires_at IS NOT NULL") > 0)


def _has_fulltext_index(table: lancedb.table.Table, store: str, version: int) -> bool:
    return version_fact(table, store, version, "fts", lambda t: any(i.index_type == "FTS" for i in t.list_indices()))


def _read_embedder(table: lancedb.table.Table) -> str:
    # One row is enough: a run replaces every vector in one commit when the embedder changes.
    rows = table.search().select(["embedder"]).limit(1).to_arrow()["embedder"].to_pylist()
    if not rows:
        msg = f"table '{table.name}' is empty"
        raise StoreError(msg)
    return rows[0]


def vector_space(fingerprint: str) -> str:
    """Return the part of an embedder fingerprint that decides its vector space (not its task type)."""
    return fingerprint.split(":task=", 1)[0]


def check_embedder(table_fingerprint: str, embedder: Embedder) -> None:
    """Refuse an embedder whose vectors do not live in the table's vector space."""
    if vector_space(embedder.fingerprint) != vector_space(table_fingerprint):
        msg = (f"the chunks table was embedded with '{table_fingerprint}' but this query embeds with "
               f"'{embedder.fingerprint}': distances between them mean nothing. Leave the embedder out to use "
               "the table's own, or re-ingest into a table built with this one")
        raise EmbedderMismatchError(msg)


def clearance_clause(clearance: str) -> str:
    """Return the SQL that keeps rows at or below a caller's clearance (public < internal < ...)."""
    if clearance not in ACCESS_LEVELS:
        msg = f"clearance '{clearance}' is not one of {', '.join(ACCESS_LEVELS)}"
        raise QueryError(msg)
    allowed = ACCESS_LEVELS[: ACCESS_LEVELS.index(clearance) + 1]
    return f"access_level IN ({', '.join(_quote(a) for a in allowed)})"


def visible_clause(table: lancedb.table.Table, store: str, version: int, clearance: str,
                   now: datetime | None = None) -> str:
    """The SQL that keeps what a caller may be served at now (default: the clock): its clearance, not expired."""
    guard = clearance_clause(clearance)
    if has_expiring_rows(table, store, version):  # most stores have none: spare every query the clause
        guard += f" AND (expires_at IS NULL OR expires_at > TIMESTAMP '{now or datetime.now(UTC):%Y-%m-%dT%H:%M:%S}')"
    return guard


def next_expiry(table: lancedb.table.Table, store: str, version: int, now: datetime) -> datetime | None:
    """The first moment after now at which a row of this version expires (None: none will).

    What a clearance may read in a version changes only at these moments, so a count of it holds until then.
    """
    def expiries(t: lancedb.table.Table) -> list[datetime]:
        rows = t.search().where("expires_at IS NOT NULL").select(["expires_at"]).limit(None).to_arrow()
        return sorted({_aware(moment) for moment in rows["expires_at"].to_pylist()})

    moments = version_fact(table, store, version, "expiries", expiries)
    later = bisect.bisect_right(moments, now)
    return moments[later] if later < len(moments) else None


def published_table(cfg: InletConfig) -> tuple[lancedb.table.Table, int]:
    """The chunks table pinned to the version readers are served now (the latest, if none was published)."""
    table, version, pinned = _published_table(cfg, None)
    return (table if pinned else _pinned(str(cfg.store.uri), cfg.store.chunks_table, version)), version


def quote(value: object) -> str:
    """A value as a SQL literal (strings quoted, quotes doubled)."""
    return _quote(value)


def result_of(row: dict, score: float) -> SearchResult:
    """A search result from a chunks-table row (with the columns of SELECTED)."""
    return _result(row, score)


SELECTED = _SELECT  # the chunks-table columns a result is made of


def _result(row: dict, score: float) -> SearchResult:
    pages = (row["page_start"], row["page_end"]) if row["page_start"] is not None else None
    citation = Citation(row["title"], row["uri"], tuple(row["heading_path"] or ()), pages)
    meta = {k: row[k] for k in ("source", "doc_type", "tags", "access_level", "language", "chunk_index",
                                 "total_chunks")}
    # The effective expiry (the earlier of the source's and the document's own), as ISO 8601; None: never.
    meta["expires_at"] = row["expires_at"].isoformat() if row["expires_at"] is not None else None
    meta |= json.loads(row["extra"] or "{}")
    return SearchResult(row["text"], round(score, 6), citation, row["doc_id"], row["chunk_id"], meta)


def _vector_rows(table: lancedb.table.Table, vector: list[float], clause: str, limit: int,
                 qcfg: QueryConfig, columns: list[str] = _SELECT) -> list[dict]:
    # The graph search must look at least as wide as the candidates it returns (the refine step's included): else
    # LanceDB refuses the query (ef must be >= k), as a hybrid search of k 50 (200 a side) was.
    ef = max(qcfg.ef, limit * max(qcfg.refine_factor, 1))
    query = (table.search(vector, vector_column_name="vector").distance_type("cosine").nprobes(qcfg.nprobes)
             .ef(ef).where(clause, prefilter=True))
    if qcfg.refine_factor > 1:
        query = query.refine_factor(qcfg.refine_factor)
    return query.select([*columns, "_distance"]).with_row_id(True).limit(limit).to_arrow().to_pylist()


def _fulltext_rows(table: lancedb.table.Table, text: str, clause: str, limit: int,
                   columns: list[str] = _SELECT) -> list[dict]:
    query = table.search(text, query_type="fts", fts_columns="text").where(clause, prefilter=True)
    return query.select([*columns, "_score"]).with_row_id(True).limit(limit).to_arrow().to_pylist()


class _RowsMoved(Exception):
    """Rows found by id in one version were gone when fetched: a run committed in between."""


def _fetch(table: lancedb.table.Table, row_ids: list[int]) -> dict[int, dict]:
    """Fetch the full rows of the final hits by row id (one random read per column and hit)."""
    if not row_ids:
        return {}
    try:
        rows = table.take_row_ids(row_ids).select(_SELECT).with_row_id().to_arrow().to_pylist()
    except (OSError, RuntimeError, ValueError) as exc:  # their data file compacted away meanwhile
        raise _RowsMoved from exc
    found = {r["_rowid"]: r for r in rows}
    if len(found) != len(set(row_ids)):
        raise _RowsMoved
    return found


def query_language(text: str) -> str | None:
    """Return the query's language when langdetect is sure of it (0.9), else None; short queries stay unknown."""
    if len(text.split()) < 3:
        return None
    from langdetect import DetectorFactory, LangDetectException, detect_langs

    DetectorFactory.seed = 0  # the same answer for the same text
    try:
        best = detect_langs(text)[0]
    except LangDetectException:
        return None
    return best.lang.split("-")[0] if best.prob >= 0.9 else None


# In the notice of a search whose embedder does not read the query's language, and in every notice of a hybrid
# search that skipped or down-weighted its vector side for language (flows/eval.py looks for them).
UNREAD_LANGUAGE = "not the query's language"
VECTOR_SIDE_FOR_LANGUAGE = "the vector side was"


def vector_share(languages: frozenset[str] | None, query_lang: str | None,
                 doc_langs: list[str | None]) -> tuple[float, str | None]:
    """How much of its weight the vector side keeps, given what the embedder covers; and why, when less than all.

    Nothing when the query is in a language the embedder does not read; otherwise the share of the
    full-text candidates (of known language) that it reads.
    """
    if languages is None:
        return 1.0, None
    if query_lang is not None and query_lang not in languages:
        return 0.0, (f"the embedder reads {', '.join(sorted(languages))}, {UNREAD_LANGUAGE} ({query_lang}): "
                     f"{VECTOR_SIDE_FOR_LANGUAGE} skipped")
    known = [lang for lang in doc_langs if lang]
    if not known:
        return 1.0, None
    share = sum(lang in languages for lang in known) / len(known)
    if share == 1.0:
        return 1.0, None
    return share, (f"{1 - share:.0%} of the full-text candidates are in languages the embedder does not read "
                   f"({', '.join(sorted(set(known) - languages))}): {VECTOR_SIDE_FOR_LANGUAGE} weighted {share:.2f}")


_SIDES = ThreadPoolExecutor(max_workers=4, thread_name_prefix="inlet-hybrid")


def _ranked(table: lancedb.table.Table, text: str, mode: Mode, clause: str, k: int, qcfg: QueryConfig,
            embed: Callable[[], list[float]], languages: frozenset[str] | None = None, keep: int | None = None,
            ) -> tuple[list[SearchResult], list[str]]:
    """The hits of one mode, best first: k of them, or keep (more, for a re-ranking such as freshness)."""
    n = keep or k
    if mode == "vector":
        # Cosine distance on unit vectors: 1 - distance is the cosine similarity.
        hits = [_result(r, 1.0 - float(r["_distance"])) for r in _vector_rows(table, embed(), clause, n, qcfg)]
        lang = query_language(text) if languages is not None else None
        uncovered = lang is not None and lang not in languages
        return hits, ([f"the embedder reads {', '.join(sorted(languages))}, {UNREAD_LANGUAGE} ({lang}): "
                       "try mode fulltext or hybrid"] if uncovered else [])
    if mode == "fulltext":
        return [_result(r, float(r["_score"])) for r in _fulltext_rows(table, text, clause, n)], []
    # Agreement between the sides is judged on their first AGREEMENT_WINDOW candidates, whatever k is.
    depth = max(k * qcfg.candidates, AGREEMENT_WINDOW if qcfg.agreement > 0 else 0)
    # Both sides at once (LanceDB works outside the GIL), row ids and scores only: reading any column costs each
    # side a materialising step (~1.5 ms at 1M chunks); the languages of the full-text candidates are read only
    # for an embedder that does not read every language. The vector side is dropped below if its weight is 0.
    # Only the k fused winners are then fetched whole: 2 x depth full rows cost ~40% more.
    # The query is embedded before the sides start: overlapping e5 with the full-text side made hybrid slower at 1M
    # chunks on two cores (p50 37.6 vs 26.4 ms): the model's threads and LanceDB's then fight for the cores.
    dense_future = (_SIDES.submit(_vector_rows, table, embed(), clause, depth, qcfg, [])
                    if qcfg.vector_weight > 0 else None)
    sparse = (_fulltext_rows(table, text, clause, depth, ["language"] if languages is not None else [])
              if qcfg.fulltext_weight > 0 else [])
    dense = dense_future.result() if dense_future is not None else []
    share, why = vector_share(languages, query_language(text) if languages is not None else None,
                              [r["language"] for r in sparse] if languages is not None else [])
    weight = qcfg.vector_weight * share
    dense = dense if weight > 0 else []
    scores = fuse_sides([(r["_rowid"], 1.0 - float(r["_distance"])) for r in dense],
                        [(r["_rowid"], float(r["_score"])) for r in sparse], method=qcfg.fusion,
                        vector_weight=weight, fulltext_weight=qcfg.fulltext_weight, rrf_k=qcfg.rrf_k,
                        agreement=qcfg.agreement, temperature=qcfg.temperature)
    # The sides' depth follows k alone: keep only lets more of the fused list through.
    rows = _fetch(table, tied_cut(scores, n))
    # Ties are broken by chunk id, as everywhere else: every row tied with the last one kept was fetched.
    best = sorted(rows, key=lambda r: (-scores[r], rows[r]["chunk_id"]))[:n]
    return [_result(rows[r], scores[r]) for r in best], [why] if why else []


def tied_cut(scores: dict[int, float], n: int) -> list[int]:
    """The n best row ids by score, and any more tied with the n-th (so that a tie can be broken by chunk id)."""
    order = sorted(scores, key=lambda r: -scores[r])
    if len(order) <= n:
        return order
    last = scores[order[n - 1]]
    end = n
    while end < len(order) and scores[order[end]] == last:
        end += 1
    return order[:end]


# (fingerprint, text) -> vector, as 4-byte floats: a list of 384 Python floats is 12 KB, its array 1.5 KB (the table
# holds float32 vectors, so nothing is lost); 1,024 kept lists of a 768-dimension embedder were ~25 MB.
_QUERY_VECTORS: OrderedDict[tuple[str, str], array] = OrderedDict()
_QUERY_VECTORS_KEPT = 1024
_QUERY_VECTORS_LOCK = threading.Lock()


def query_vector(embedder: Embedder, text: str) -> list[float]:
    """The query's vector, the last 1,024 kept: agents ask again, and e5 takes ~15 ms a query on two cores.

    Keyed by the embedder's fingerprint, which names its model, settings and task: equal fingerprints embed alike.
    """
    key = (embedder.fingerprint, text)
    with _QUERY_VECTORS_LOCK:  # searches may run on many threads
        if key in _QUERY_VECTORS:
            _QUERY_VECTORS.move_to_end(key)
            return list(_QUERY_VECTORS[key])
    vector = array("f", embedder.embed([text])[0])  # the first caller gets what the next ones will, float32 alike
    with _QUERY_VECTORS_LOCK:
        _QUERY_VECTORS[key] = vector
        if len(_QUERY_VECTORS) > _QUERY_VECTORS_KEPT:
            _QUERY_VECTORS.popitem(last=False)
    return list(vector)


def modified_times(cfg: InletConfig) -> dict[str, float]:
    """Each document's modification time (epoch seconds) from the documents table, read once per table version."""
    db = store_connection(cfg)
    try:
        table = db.open_table(cfg.store.documents_table)
    except (FileNotFoundError, ValueError):
        return {}

    def read(t: lancedb.table.Table) -> dict[str, float]:
        rows = t.search().select(["doc_id", "mtime_ns"]).limit(None).to_arrow()
        # 0: the source gave no time (a web page without Last-Modified): its age is unknown.
        return {d: m / 1e9 for d, m in zip(rows["doc_id"].to_pylist(), rows["mtime_ns"].to_pylist(), strict=True)
                if m and m > 0}

    return version_fact(table, str(cfg.store.uri), table.version, "mtimes", read)


def freshness_factor(age_days: float | None, half_life_days: float) -> float:
    """1 + 0.5 ** (age / half-life): 2 for a document modified now, 1 (no boost) for an unknown age."""
    if age_days is None:
        return 1.0
    return 1.0 + 0.5 ** (max(age_days, 0.0) / half_life_days)


def by_freshness(hits: list[SearchResult], modified: dict[str, float], half_life_days: float, now: float,
                 k: int) -> list[SearchResult]:
    """Re-rank hits by score x freshness factor and keep the k best; the score reported is the boosted one."""
    def boosted(hit: SearchResult) -> float:
        when = modified.get(hit.doc_id)
        factor = freshness_factor(None if when is None else (now - when) / 86400, half_life_days)
        # A negative score (a cosine below 0) is divided, not multiplied, so the boost still lifts it.
        return hit.score * factor if hit.score >= 0 else hit.score / factor

    scored = [(boosted(h), h) for h in hits]
    scored.sort(key=lambda pair: (-pair[0], pair[1].chunk_id))
    return [SearchResult(h.text, round(score, 6), h.citation, h.doc_id, h.chunk_id, h.metadata)
            for score, h in scored[:k]]


def _with_neighbors(table: lancedb.table.Table, hits: list[SearchResult], n: int) -> list[SearchResult]:
    """Attach the n previous and next chunks of each hit's document, in order."""
    if n <= 0 or not hits:
        return hits
    spans = [f"(doc_id = {_quote(h.doc_id)} AND chunk_index BETWEEN {h.metadata['chunk_index'] - n} AND "
             f"{h.metadata['chunk_index'] + n})" for h in hits]
    rows = table.search().where(" OR ".join(spans)).select(["doc_id", "chunk_id", "chunk_index", "text"]) \
        .limit(None).to_arrow().to_pylist()
    by_doc: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["chunk_index"]):
        by_doc.setdefault(row["doc_id"], []).append(row)
    out = []
    for hit in hits:
        i = hit.metadata["chunk_index"]
        near = [Neighbor(r["chunk_id"], r["chunk_index"], r["text"]) for r in by_doc.get(hit.doc_id, [])]
        out.append(SearchResult(hit.text, hit.score, hit.citation, hit.doc_id, hit.chunk_id, hit.metadata,
                                tuple(x for x in near if i - n <= x.chunk_index < i),
                                tuple(x for x in near if i < x.chunk_index <= i + n)))
    return out


def search(text: str, k: int = 5, where: dict[str, object] | str | None = None, *, mode: Mode | None = None,
           clearance: str = "public", as_of: int | str | datetime | None = None, neighbors: int = 0,
           fallback: bool = False, config: InletConfig | str | Path = DEFAULT_CONFIG,
           embedder: Embedder | None = None, variant: str | None = None) -> SearchResults:
    """Return the k best chunks for text that the caller's clearance may see.

    mode: vector (the table's own embedder, query task type), fulltext (BM25 over the native
    full-text index) or hybrid (both, fused as config.query.fusion says: query/fusion.py).
    where: metadata filters ({field: value or [values]} or SQL); with fallback=True an empty
    filtered result is retried without the filters (never without the clearance) and a notice
    says so. clearance: public < internal < restricted < confidential; rows above it are never
    read. as_of: a table version, a run tag, or a timestamp. neighbors: attach the n previous
    and next chunks of each hit. An explicit embedder must match the table's vector space.
    variant: search a named index variant's table instead of the main one.
    """
    cfg = select_variant(config if isinstance(config, InletConfig) else _load_config(Path(config)), variant)
    use_secret_block(cfg.api_key_block)
    qcfg = cfg.query.for_embedder(cfg.embedding.kind)  # the fusion weights of the index's embedder, unless set
    mode = mode or qcfg.mode
    if mode not in ("vector", "fulltext", "hybrid"):
        msg = f"mode '{mode}' is not one of vector, fulltext, hybrid"
        raise QueryError(msg)
    clearance_clause(clearance)  # an unknown clearance is refused before any read
    filters = where_clause(where)
    store = str(cfg.store.uri)
    table, version, pinned = _published_table(cfg, as_of)

    def run(table: lancedb.table.Table, version: int) -> SearchResults:
        # Everything that depends on the table version is decided here, against the version read.
        fulltext = mode == "fulltext" or (mode == "hybrid" and qcfg.fulltext_weight > 0)
        if fulltext and not _has_fulltext_index(table, store, version):
            msg = (f"table '{table.name}' (version {version}) has no full-text index: run `inlet ingest` with "
                   "query.fulltext_index on, or search in vector mode")
            raise QueryError(msg)
        guard = visible_clause(table, store, version, clearance)
        clause = f"({guard}) AND ({filters})" if filters else guard
        chosen = embedder
        if mode != "fulltext":
            table_fp = _table_embedder(table, store, version)
            chosen = embedder or query_embedder(table_fp, cfg.embedding)
            check_embedder(table_fp, chosen)
        # Only vector and hybrid searches pay for a query embedding, and only once with a fallback.
        embed = functools.cache(lambda: query_vector(chosen, text))
        languages = getattr(chosen, "languages", None)
        half_life = cfg.query.freshness_half_life_days
        # With freshness on, more candidates are ranked, so that a recent document just below the k best can rise.
        keep = k * cfg.query.candidates if half_life else None
        hits, notices = _ranked(table, text, mode, clause, k, qcfg, embed, languages, keep)
        if not hits and filters and fallback:
            hits, more = _ranked(table, text, mode, guard, k, qcfg, embed, languages, keep)
            notices += [f"nothing matched the filters ({filters}); these results ignore them", *more]
        if half_life:
            hits = by_freshness(hits, modified_times(cfg), half_life, datetime.now(UTC).timestamp(), k)
        return SearchResults(_with_neighbors(table, hits, neighbors), notices, version)

    return _in_one_version(cfg, table, version, pinned, run)


def _published_table(cfg: InletConfig, as_of: int | str | datetime | None) -> tuple[lancedb.table.Table, int, bool]:
    """Return the table to search, its version and whether it is pinned: as_of, else the published version.

    A run commits in groups and moves the published tag to its last version when it is done, so a search
    during a run reads the previous run's version, never part of the one in progress. A table that was
    never published (written by hand) is read at its latest version.
    """
    table, version = _current_table(cfg, as_of)
    if as_of is not None:
        return table, version, True
    try:
        published = table.tags.get_version(PUBLISHED_TAG)
    except (RuntimeError, ValueError):  # no such tag: the table was not written by a run
        return table, version, False
    if published == version:
        return table, version, False
    return _pinned(str(cfg.store.uri), cfg.store.chunks_table, published), published, True


@functools.lru_cache(maxsize=4)
def _pinned(uri: str, name: str, version: int) -> lancedb.table.Table:
    """A table object checked out at one version, kept while readers keep asking for it."""
    table = _connect(uri).open_table(name)
    table.checkout(version)
    return table


def _in_one_version(cfg: InletConfig, table: lancedb.table.Table, version: int, pinned: bool,
                    run: Callable[[lancedb.table.Table, int], T]) -> T:
    """Run a search's reads (sides, row fetches, neighbours) against one table version, even while runs commit.

    The cached table reads the latest version on every call; if a run committed between the first and
    the last read, the search is read again from a table object pinned to the version it began with.
    """
    if pinned:  # nothing can move in a pinned version: rows that cannot be read are an error
        try:
            return run(table, version)
        except _RowsMoved as exc:
            msg = f"table '{table.name}' version {version}: rows could not be read ({exc.__cause__ or 'missing'})"
            raise StoreError(msg) from exc
    try:
        out = run(table, version)
        if table.version == version:
            return out
    except _RowsMoved:
        pass
    return _in_one_version(cfg, _pinned(str(cfg.store.uri), cfg.store.chunks_table, version), version, True, run)


def in_published_version(cfg: InletConfig, run: Callable[[lancedb.table.Table, int], T]) -> T:
    """Run run(table, version) against the published version alone: again, pinned, if a run committed meanwhile."""
    table, version, pinned = _published_table(cfg, None)
    return _in_one_version(cfg, table, version, pinned, run)


def warm(config: InletConfig | str | Path = DEFAULT_CONFIG, variant: str | None = None) -> None:
    """Load the chunks table's indexes into memory, for a long-lived process that will answer many searches.

    Without it the first searches load index parts as they need them (at 1M chunks a first round of
    vector searches ran ~2 ms slower at the median). A one-shot query should not call it: it reads
    every index whole (~1.5 s at 1M chunks) to answer one question. The first warm() of a store also bounds the
    caches of its read connection (cache_bounds): the indexes are read once through a connection of their own to
    learn what the served version takes, then again through the bounded one that will serve.
    """
    cfg = select_variant(config if isinstance(config, InletConfig) else _load_config(Path(config)), variant)
    uri = str(cfg.store.uri)
    if uri not in _CACHE_BOUNDS:
        _current_table(cfg, None)  # a store without the table is refused here, as a search would be
        probe = lancedb.Session()
        db = lancedb.connect(uri, storage_options=_STORE_OPTIONS.get(uri) or None, session=probe)
        table = db.open_table(cfg.store.chunks_table)
        for index in table.list_indices():
            table.prewarm_index(index.name)
        with _CONNECTING:
            _CACHE_BOUNDS[uri] = cache_bounds(probe.size_bytes)
            for key in [k for k in _CONNECTIONS if k[0] == uri]:
                del _CONNECTIONS[key]  # its caches unbounded; reads from now on open the bounded one
        for key in [k for k in _TABLES if k[0] == uri]:
            del _TABLES[key]
        _pinned.cache_clear()
    table, _ = _current_table(cfg, None)
    for index in table.list_indices():
        table.prewarm_index(index.name)


def _current_table(cfg: InletConfig, as_of: int | str | datetime | None) -> tuple[lancedb.table.Table, int]:
    """Open the chunks table (cached per store) and read its version, reopening a dataset dropped and made anew."""
    try:
        table = _open_chunks(cfg, as_of)
        return table, table.version  # a cached table whose dataset was dropped fails here
    except (OSError, RuntimeError, ValueError):
        _TABLES.pop((str(cfg.store.uri), cfg.store.chunks_table), None)
        table = _open_chunks(cfg, as_of)
        return table, table.version
