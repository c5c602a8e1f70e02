"""What the knowledge base answers agents and applications (`inlet mcp`, `inlet api`): typed, documented models.

Their JSON Schemas are the MCP tools' output schemas and the HTTP API's OpenAPI responses.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

Scalar = str | int | float | bool
# Filters are values, never SQL: a caller cannot write a clause that widens what its clearance reads.
Filters = dict[str, Scalar | list[Scalar]]


class CitationOut(BaseModel):
    """Where a chunk comes from: enough to cite it."""

    title: str | None = Field(description="The document's title.")
    uri: str = Field(description="The document's address (file path, URL or bundle page).")
    heading_path: list[str] = Field(description="The headings above the chunk, outermost first.")
    pages: tuple[int, int] | None = Field(description="First and last page (PDF), else null.")
    text: str = Field(description="The citation as one line: title | headings | pages <uri>.")


class NeighborOut(BaseModel):
    """A chunk next to another in its document."""

    chunk_id: str
    chunk_index: int = Field(description="Its position in the document, from 0.")
    text: str


class Hit(BaseModel):
    """One chunk served: its original text (never the model's enrichment), score and citation."""

    chunk_id: str = Field(description="Pass it to get_context for the chunks around it.")
    doc_id: str
    text: str = Field(description="The chunk's text as the document has it.")
    score: float | None = Field(description="Higher is better (null for a chunk fetched by id); comparable only "
                                "within one search.")
    citation: CitationOut
    metadata: dict[str, Any] = Field(description="source, doc_type, tags, access_level, language, chunk_index, "
                                     "total_chunks, expires_at and the document's own fields (e.g. subject, grade).")
    before: list[NeighborOut] = Field(default_factory=list, description="Preceding chunks, in order.")
    after: list[NeighborOut] = Field(default_factory=list, description="Following chunks, in order.")


class SearchAnswer(BaseModel):
    """The best chunks for a query, best first, with notices on how they were found."""

    hits: list[Hit]
    notices: list[str] = Field(default_factory=list, description="Fallbacks and skipped sides of the search.")
    version: int | None = Field(None, description="The chunks-table version every hit and neighbour was read from.")


class ContextAnswer(BaseModel):
    """A chunk with its neighbours, in document order."""

    chunk: Hit
    before: list[NeighborOut] = Field(description="Up to `neighbors` preceding chunks, in order.")
    after: list[NeighborOut] = Field(description="Up to `neighbors` following chunks, in order.")
    version: int | None = Field(None, description="The chunks-table version the chunk and its neighbours were read "
                                "from.")


class SourceInfo(BaseModel):
    """One configured source as the caller may see it."""

    name: str
    kind: str = Field(description="folder, bundle or web.")
    documents: int = Field(description="Documents with at least one chunk the caller may read.")
    chunks: int = Field(description="Chunks the caller may read.")
    last_modified: datetime | None = Field(description="Latest modification time of those documents (UTC).")


class SourcesAnswer(BaseModel):
    """What is indexed, and how fresh it is."""

    sources: list[SourceInfo]
    published_version: int | None = Field(description="The chunks-table version readers are served.")
    published_run: str | None = Field(description="The run that made it (null: rolled back or written by hand).")
    published_at: datetime | None = Field(description="When that run finished (UTC).")
    last_run: str | None = Field(description="The latest run, published or not.")
    last_run_at: datetime | None = Field(description="When it finished (UTC).")


class VersionInfo(BaseModel):
    """One run of the ingest flow and the version it made."""

    run_id: str
    started_at: datetime | None
    finished_at: datetime | None
    status: str | None = Field(description="completed, held (by the publish gate), rollback, ...")
    published: bool = Field(description="Readers are served this run's version now.")
    gate: str | None = Field(description="The publish gate's verdict, if a gate is configured.")
    chunks_version: int | None


class VersionsAnswer(BaseModel):
    """The runs, oldest first."""

    versions: list[VersionInfo]
