"""Vector search over the chunks table, with metadata filters and citations."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import lancedb

from providers.embedders import Embedder, query_embedder
from providers.keys import use_secret_block
from schemas.config import InletConfig, load_config
from schemas.errors import EmbedderMismatchError, StoreError

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "inlet.yaml"
_COLUMNS = ("source", "doc_type", "access_level", "language", "title", "uri", "doc_id")
_SELECT = ["chunk_id", "doc_id", "text", "title", "uri", "heading_path", "page_start", "page_end", "source",
           "doc_type", "tags", "access_level", "language", "extra", "chunk_index", "total_chunks", "embedder"]


@dataclass(frozen=True)
class Citation:
    """Where a result comes from."""

    title: str | None
    uri: str
    heading_path: tuple[str, ...]
    pages: tuple[int, int] | None

    def __str__(self) -> str:
        parts = [self.title or self.uri]
        if self.heading_path:
            parts.append(" > ".join(self.heading_path))
        if self.pages:
            first, last = self.pages
            parts.append(f"p. {first}" if first == last else f"pp. {first}-{last}")
        return " | ".join(parts) + f" <{self.uri}>"


@dataclass(frozen=True)
class SearchResult:
    """One retrieved chunk: its original text (enrichment apart), score and citation."""

    text: str
    score: float
    citation: Citation
    doc_id: str
    chunk_id: str
    metadata: dict


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


def _open_chunks(cfg: InletConfig) -> lancedb.table.Table:
    db = lancedb.connect(str(cfg.store.uri))
    listed = db.list_tables()
    if cfg.store.chunks_table not in set(getattr(listed, "tables", listed)):
        msg = f"no '{cfg.store.chunks_table}' table in {cfg.store.uri}: run `inlet ingest` first"
        raise StoreError(msg)
    return db.open_table(cfg.store.chunks_table)


def _table_embedder(table: lancedb.table.Table) -> str:
    fingerprints = table.search().select(["embedder"]).limit(None).to_arrow()["embedder"].unique().to_pylist()
    if len(fingerprints) != 1:
        msg = f"chunks table mixes embedders {fingerprints}: re-run ingest to finish re-embedding"
        raise EmbedderMismatchError(msg)
    return fingerprints[0]


def _result(row: dict) -> SearchResult:
    pages = (row["page_start"], row["page_end"]) if row["page_start"] is not None else None
    citation = Citation(row["title"], row["uri"], tuple(row["heading_path"] or ()), pages)
    meta = {k: row[k] for k in ("source", "doc_type", "tags", "access_level", "language", "chunk_index",
                                 "total_chunks")}
    meta |= json.loads(row["extra"] or "{}")
    # Cosine distance on unit vectors: 1 - distance is the cosine similarity.
    return SearchResult(row["text"], round(1.0 - float(row["_distance"]), 6), citation, row["doc_id"],
                        row["chunk_id"], meta)


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


def search(text: str, k: int = 5, where: dict[str, object] | str | None = None, *,
           config: InletConfig | str | Path = DEFAULT_CONFIG, embedder: Embedder | None = None) -> list[SearchResult]:
    """Return the k chunks nearest to text, embedded with the table's own embedder, filtered by where.

    An explicit embedder must match the one the table was built with; it is refused otherwise.
    """
    cfg = config if isinstance(config, InletConfig) else load_config(config)
    use_secret_block(cfg.api_key_block)
    table = _open_chunks(cfg)
    table_fp = _table_embedder(table)
    if embedder is None:
        embedder = query_embedder(table_fp, cfg.embedding)
    check_embedder(table_fp, embedder)
    vector = embedder.embed([text])[0]
    query = table.search(vector, vector_column_name="vector").distance_type("cosine").limit(k)
    clause = where_clause(where)
    if clause:
        query = query.where(clause, prefilter=True)
    return [_result(r) for r in query.select([*_SELECT, "_distance"]).to_arrow().to_pylist()]
