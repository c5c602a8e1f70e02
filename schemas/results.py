"""What a search returns: hits with citations and neighbours (plain data, light to import and to pickle)."""

from __future__ import annotations

from dataclasses import dataclass


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
class Neighbor:
    """A chunk next to a hit in its document."""

    chunk_id: str
    chunk_index: int
    text: str


@dataclass(frozen=True)
class SearchResult:
    """One retrieved chunk: its original text (enrichment apart), score, citation and neighbours in order."""

    text: str
    score: float
    citation: Citation
    doc_id: str
    chunk_id: str
    metadata: dict
    before: tuple[Neighbor, ...] = ()
    after: tuple[Neighbor, ...] = ()


class SearchResults(list[SearchResult]):
    """The hits, best first, with notices about how they were found (fallbacks, skipped sides)."""

    def __init__(self, hits: list[SearchResult] = (), notices: list[str] | None = None,
                 version: int | None = None) -> None:
        super().__init__(hits)
        self.notices: list[str] = notices or []
        self.version = version  # the chunks-table version every read of the search was made against


__all__ = ["Citation", "Neighbor", "SearchResult", "SearchResults"]
