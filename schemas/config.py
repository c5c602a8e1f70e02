"""Typed settings for Inlet, loaded from one YAML file (configs/inlet.yaml)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from datetime import UTC, date, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from schemas.errors import ConfigError

ACCESS_LEVELS: tuple[str, ...] = ("public", "internal", "restricted", "confidential")
DEFAULT_INCLUDE: tuple[str, ...] = (
    "**/*.md", "**/*.markdown", "**/*.txt", "**/*.html", "**/*.htm", "**/*.pdf", "**/*.docx",
)

Scalar = str | int | float | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceMetadata(BaseModel):
    """Metadata stamped on every document of a source; free fields (subject, grade, ...) allowed."""

    model_config = ConfigDict(extra="allow", frozen=True)
    doc_type: str | None = Field(None, description="Kind of document, e.g. guide, policy, reference.")
    tags: tuple[str, ...] = Field((), description="Tags copied to every chunk for filtering.")
    access_level: Literal["public", "internal", "restricted", "confidential"] = Field(
        "public", description="Who may read it: public < internal < restricted < confidential."
    )
    language: str | None = Field(None, description="ISO 639-1 code of the documents' language.")
    expires_at: datetime | None = Field(None, description="After this moment (a date means its midnight UTC) the "
                                        "documents are no longer returned by search.")

    @field_validator("expires_at", mode="before")
    @classmethod
    def _date_is_midnight_utc(cls, value: object) -> object:
        if isinstance(value, date) and not isinstance(value, datetime):
            return datetime(value.year, value.month, value.day, tzinfo=UTC)
        if isinstance(value, datetime) and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value

    def extra_fields(self) -> dict[str, Scalar]:
        """Return the free fields (everything but the named ones)."""
        extra = dict(self.model_extra or {})
        for key, value in extra.items():
            if not isinstance(value, (str, int, float, bool)):
                msg = f"metadata.{key}: free metadata fields must be a string, number or boolean"
                raise ValueError(msg)
        return extra


class MetadataRule(_Strict):
    """Metadata for the documents whose path (relative to the source) matches a regular expression.

    Named groups become fields (subject and grade from folder names); `set` adds fixed ones.
    """

    path: str = Field(description="Regular expression searched in the relative path, e.g. "
                      "'^(?P<subject>[^/]+)/grade-(?P<grade>\\d+)/'.")
    set: dict[str, Scalar | list[str]] = Field(default_factory=dict, description="Fields to set when it matches.")

    @field_validator("path")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            msg = f"not a valid regular expression: {exc}"
            raise ValueError(msg) from None
        return value

    def fields_for(self, rel: str) -> dict[str, object] | None:
        """Return the fields this rule gives a relative path, or None when it does not match."""
        match = re.search(self.path, rel)
        if match is None:
            return None
        return {**self.set, **{k: v for k, v in match.groupdict().items() if v is not None}}


class SourceConfig(_Strict):
    """Where documents come from: a local folder, an llms-full.txt bundle of many pages, or web pages."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Stable id of the source; part of doc ids.")]
    kind: Literal["folder", "bundle", "web"] = Field(
        "folder", description="folder: files under path; bundle: an llms-full.txt file at path, each page a document; "
        "web: the pages of `urls` and `sitemap`.")
    path: Path | None = Field(None, description="Folder (or bundle file) to read; relative paths are taken from the "
                              "config file's folder.")
    uri: str | None = Field(None, description="Folder on object storage instead of path: an fsspec URI such as "
                            "s3://bucket/docs, gs://bucket/docs or file:///srv/docs.")
    storage_options: dict[str, Any] = Field(default_factory=dict, description="fsspec options for uri, e.g. "
                                            "endpoint_url, key, secret, anon (credentials may come from the "
                                            "environment instead).")
    urls: tuple[str, ...] = Field((), description="Web: pages to fetch.")
    sitemap: str | None = Field(None, description="Web: a sitemap (or sitemap index) listing the pages to fetch.")
    allow_hosts: tuple[str, ...] = Field((), description="Web: hosts pages and redirects may come from; default: "
                                         "the hosts of urls and sitemap.")
    timeout_s: float = Field(20.0, gt=0, description="Web: time-out of one request.")
    max_redirects: int = Field(5, ge=0, le=20, description="Web: redirects followed per page.")
    keep: tuple[str, ...] = Field((), description="Bundle or web pages to keep, by URL: substrings (/oss/python/) or "
                                  "globs (*/tools/*); none: keep all.")
    drop: tuple[str, ...] = Field((), description="Bundle or web pages to leave out, by URL; drop wins over keep.")
    base_url: str | None = Field(None, description="For bundles naming pages by path: the site they come from, so "
                                 "each page's URI is base_url/path.")
    include: tuple[str, ...] = Field(DEFAULT_INCLUDE, description="Glob patterns (relative to path) to take.")
    exclude: tuple[str, ...] = Field((), description="Glob patterns (relative to path) to leave out.")
    metadata: SourceMetadata = Field(default_factory=SourceMetadata, description="Metadata for every document.")
    metadata_rules: tuple[MetadataRule, ...] = Field(
        (), description="Per-path metadata, applied in order over `metadata` (later rules win).")
    max_delete_share: float = Field(
        0.5, ge=0, le=1, description="Mass-deletion guard: a run that would delete more than this share of the "
        "source's documents (or whose listing fails or comes back empty) deletes none; --allow-deletions overrides.")
    poll_s: float | None = Field(None, gt=0, description="`inlet watch`: seconds between polls of this source when "
                                 "it is on object storage or the web (default watch.poll_s); local folders and "
                                 "bundles are watched by file-system events instead.")

    @field_validator("include", "exclude")
    @classmethod
    def _inside_root(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            if pattern.startswith("/") or ".." in pattern.replace("\\", "/").split("/"):
                msg = f"'{pattern}': patterns are relative to the source folder and cannot leave it ('..', '/')"
                raise ValueError(msg)
        return value

    @field_validator("metadata")
    @classmethod
    def _scalar_extras(cls, value: SourceMetadata) -> SourceMetadata:
        value.extra_fields()
        return value

    @model_validator(mode="after")
    def _what_to_read(self) -> SourceConfig:
        if self.kind == "web":
            if not self.urls and not self.sitemap:
                msg = "a web source needs `urls` or a `sitemap`"
                raise ValueError(msg)
            for url in (*self.urls, *([self.sitemap] if self.sitemap else [])):
                if not re.match(r"^https?://[^/\s]+", url):
                    msg = f"'{url}' is not an http(s) URL"
                    raise ValueError(msg)
        elif self.kind == "folder" and self.uri is not None:
            if self.path is not None:
                msg = "give a folder source `path` or `uri`, not both"
                raise ValueError(msg)
            if "://" not in self.uri:
                msg = f"'{self.uri}' is not a URI (s3://bucket/prefix, gs://..., file:///...)"
                raise ValueError(msg)
        elif self.path is None:
            msg = f"a {self.kind} source needs `path`" + (" or `uri`" if self.kind == "folder" else "")
            raise ValueError(msg)
        return self

    def hosts(self) -> frozenset[str]:
        """The hosts a web source may fetch from: allow_hosts, else those of its urls and sitemap."""
        if self.allow_hosts:
            return frozenset(h.lower() for h in self.allow_hosts)
        from urllib.parse import urlsplit

        found = set()
        for url in (*self.urls, *([self.sitemap] if self.sitemap else [])):
            parts = urlsplit(url)
            found.add((parts.hostname or "") + (f":{parts.port}" if parts.port else ""))
        return frozenset(found)


class ExtractionConfig(_Strict):
    """How documents become elements."""

    pdf_strategy: Literal["fast"] = Field("fast", description="unstructured PDF strategy; hi_res needs a hub model.")
    max_file_mb: float = Field(100.0, gt=0, description="Files above this size are quarantined unread (too_large).")
    timeout_s: float = Field(300.0, gt=0, description="Time limit for extracting one non-Markdown document; past it "
                             "the document is quarantined (timeout) and the run goes on.")
    ocr: bool = Field(False, description="Read PDFs without a text layer with tesseract (unstructured's ocr_only "
                      "strategy); needs tesseract and poppler installed. Off: they are quarantined as no_text.")
    ocr_languages: tuple[str, ...] = Field(("eng",), description="tesseract language packs to OCR with.")
    workers: int = Field(1, ge=1, le=64, description="Processes partitioning non-Markdown documents in parallel "
                         "(Markdown is read in the run's own process).")


class ChunkStrategy(StrEnum):
    """How element text is cut into chunks."""

    MARKDOWN = "markdown"
    FIXED = "fixed"


class ChunkingConfig(_Strict):
    """How extracted text becomes chunks (tokens counted with tiktoken cl100k_base)."""

    strategy: ChunkStrategy = Field(ChunkStrategy.MARKDOWN, description="markdown: split at headings; fixed: windows.")
    max_tokens: int = Field(
        200, gt=8, le=8192,
        description="Upper bound per chunk; 200 cl100k tokens plus enrichment fit MiniLM's 256 word pieces.",
    )
    overlap_tokens: int = Field(30, ge=0, description="Tokens shared by adjacent chunks of one section.")
    heading_levels: int = Field(3, ge=1, le=6, description="Headings down to this level (#, ##, ###) start sections.")
    merge_small_sections: bool = Field(
        False, description="Merge adjacent small sections under the same ## parent up to max_tokens."
    )

    @field_validator("overlap_tokens")
    @classmethod
    def _overlap_below_max(cls, value: int, info) -> int:
        max_tokens = info.data.get("max_tokens", 200)
        if value >= max_tokens:
            msg = f"must be smaller than max_tokens ({max_tokens})"
            raise ValueError(msg)
        return value


PROMPTS_DIR = Path(__file__).resolve().parent.parent / "configs" / "prompts"
DEFAULT_CONFIG = PROMPTS_DIR.parent / "inlet.yaml"  # the embedded defaults every entry point starts from
# glibc's and Arrow's documented switches: fewer per-thread malloc arenas keeping freed memory, and Arrow on the
# system allocator so that what it frees can go back (docs/operations.md, "Memory").
LEAN_MEMORY_ENV = {"MALLOC_ARENA_MAX": "2", "ARROW_DEFAULT_MEMORY_POOL": "system"}


class BatchModeConfig(_Strict):
    """Gemini Batch Mode for backfills: half price, answers within hours instead of seconds."""

    mode: Literal["auto", "always", "never"] = Field(
        "auto", description="auto: batch when at least min_rows texts need the model; always; never.")
    min_rows: int = Field(1000, ge=1, description="Texts to enrich or embed at or above which auto mode submits a job.")
    poll_initial_s: float = Field(10.0, gt=0, description="First wait between job state checks; doubles each time.")
    poll_max_s: float = Field(300.0, gt=0, description="Longest wait between job state checks.")
    max_wait_s: float = Field(86_400.0, gt=0, description="Give up waiting after this long; the next run resumes "
                              "the same job instead of submitting it again.")


class EnrichmentConfig(_Strict):
    """Chunk enrichment: offline keywords (YAKE + title + heading path), or Gemini."""

    enabled: bool = Field(True, description="Add an enrichment column and feed it to the embedder.")
    provider: Literal["local", "gemini"] = Field(
        "local", description="local: YAKE keywords, no key needed; gemini: needs GEMINI_API_KEY or GOOGLE_API_KEY, "
        "else the local enricher is used and the report says so.",
    )
    kind: Literal["keywords", "questions", "context", "custom"] = Field(
        "keywords", description="What to add: keywords, questions the chunk answers, its context in the document, "
        "or a custom prompt's answer (Gemini only, except keywords).",
    )
    prompt: Path | None = Field(None, description="Prompt file (version, system, template); default "
                                "configs/prompts/<kind>.yaml; relative to the config file's folder.")
    system: str | None = Field(None, description="System message; overrides the prompt file's (and so its cache key).")
    model: str = Field("gemini-2.5-flash", description="Gemini model for enrichment.")
    base_url: str | None = Field(None, description="Gemini API base URL (a proxy or a local test server).")
    timeout_s: float = Field(60.0, gt=0, description="Time-out of one Gemini request.")
    attempts: int = Field(5, ge=1, le=20, description="Tries per Gemini request on 429, 5xx and time-outs.")
    batch_size: int = Field(50, ge=1, le=10_000, description="Chunks handed to the enricher at a time.")
    batch: BatchModeConfig = Field(default_factory=BatchModeConfig, description="Gemini Batch Mode for backfills.")
    max_in_flight: int = Field(8, ge=1, le=256, description="Gemini requests in flight at once.")
    requests_per_minute: int | None = Field(1000, ge=1, description="Gemini request quota (None: no limit).")
    tokens_per_minute: int | None = Field(1_000_000, ge=1, description="Gemini prompt-token quota (None: no limit).")
    max_keywords: int = Field(8, ge=1, le=50, description="Keywords kept per chunk (local enricher).")
    delimiter: str = Field("\n\n", description="Put between chunk text and enrichment in the embedding input.")

    @field_validator("kind")
    @classmethod
    def _local_does_keywords(cls, value: str, info) -> str:
        if info.data.get("provider", "local") == "local" and value != "keywords":
            msg = f"the local enricher only does keywords; '{value}' needs provider: gemini"
            raise ValueError(msg)
        return value

    def prompt_path(self) -> Path:
        """Return the prompt file to use."""
        return self.prompt or PROMPTS_DIR / f"{self.kind}.yaml"


class EmbeddingConfig(_Strict):
    """Which embedder turns embedding inputs into vectors."""

    kind: Literal["minilm", "e5", "static", "hashing", "gemini"] = Field(
        "e5", description="e5: local multilingual-e5-small, 4-bit (~100 languages; chosen on every set in "
        "../shared/corpora/eval, bench/README.md); minilm: local all-MiniLM-L6-v2 (English, ~4x faster to "
        "index); static: a model2vec model distilled from MiniLM on "
        "first use (256 dims, ~100x faster, some quality lost); hashing: deterministic feature hashing (tests, "
        "benchmarks); gemini: Gemini embeddings (needs GEMINI_API_KEY or GOOGLE_API_KEY, else e5 is used).",
    )
    dim: int | None = Field(None, gt=0, description="Vector size: hashing 384 and gemini 768 by default; MiniLM is 384.")
    batch_size: int = Field(64, gt=0, description="Texts per embedder call.")
    model: str = Field("gemini-embedding-001", description="Gemini embedding model.")
    base_url: str | None = Field(None, description="Gemini API base URL (a proxy or a local test server).")
    timeout_s: float = Field(60.0, gt=0, description="Time-out of one Gemini request.")
    attempts: int = Field(5, ge=1, le=20, description="Tries per Gemini request on 429, 5xx and time-outs.")
    max_in_flight: int = Field(4, ge=1, le=64, description="Gemini embedding requests (100 texts each) in flight.")
    requests_per_minute: int | None = Field(1000, ge=1, description="Gemini embedding request quota (None: no limit).")
    tokens_per_minute: int | None = Field(1_000_000, ge=1, description="Gemini embedding token quota (None: no limit).")
    batch: BatchModeConfig = Field(default_factory=BatchModeConfig, description="Gemini Batch Mode for backfills.")

    @field_validator("dim")
    @classmethod
    def _minilm_is_384(cls, value: int | None, info) -> int | None:
        if info.data.get("kind", "e5") == "minilm" and value not in (None, 384):
            msg = "all-MiniLM-L6-v2 vectors have 384 dimensions; leave dim out"
            raise ValueError(msg)
        if info.data.get("kind") == "e5" and value not in (None, 384):
            msg = "multilingual-e5-small vectors have 384 dimensions; leave dim out"
            raise ValueError(msg)
        if info.data.get("kind") == "static" and value not in (None, 256):
            msg = "the static model's vectors have 256 dimensions; leave dim out"
            raise ValueError(msg)
        return value


class ModelPrice(_Strict):
    """List price of one model in US dollars per million tokens."""

    input: float = Field(ge=0, description="Prompt tokens not served from a cache.")
    output: float = Field(0.0, ge=0, description="Answer tokens (thinking included).")
    cached_input: float | None = Field(None, ge=0, description="Prompt tokens served from a cache; None: as input.")


# Gemini API paid-tier list prices (USD per 1M tokens) when this was written; edit `pricing` to match yours.
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "gemini-2.5-flash": ModelPrice(input=0.30, output=2.50, cached_input=0.03),
    "gemini-2.5-flash-lite": ModelPrice(input=0.10, output=0.40, cached_input=0.01),
    "gemini-2.5-pro": ModelPrice(input=1.25, output=10.00, cached_input=0.125),
    "gemini-embedding-001": ModelPrice(input=0.15),
}


class PricingConfig(_Strict):
    """Price table used to estimate what a run cost and what the cache saved."""

    models: dict[str, ModelPrice] = Field(default_factory=lambda: dict(DEFAULT_PRICES),
                                          description="Model name -> prices; models not listed are costed at 0.")
    batch_discount: float = Field(0.5, gt=0, le=1, description="Share of the list price paid in Batch Mode.")


# LanceDB's stemmers and stop-word lists, by the ISO 639-1 code a document's language is kept as.
FTS_LANGUAGES: dict[str, str] = {"ar": "Arabic", "da": "Danish", "nl": "Dutch", "en": "English", "fi": "Finnish", "fr": "French",
                 "de": "German", "el": "Greek", "hu": "Hungarian", "it": "Italian", "no": "Norwegian",
                 "nb": "Norwegian", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "es": "Spanish",
                 "sv": "Swedish", "ta": "Tamil", "tr": "Turkish"}

@dataclasses.dataclass(frozen=True)
class FusionPrior:
    """How hybrid search fuses over an index of one embedder kind, where the config leaves it unset."""

    vector_weight: float
    fulltext_weight: float
    agreement: float
    temperature: float


# By the index's embedder kind. e5: vector 0.55 / full-text 0.45 at temperature 3 (each standardised score z counts as
# 3 exp(z / 3): query/fusion.py), chosen by leave-one-set-out in 25 of 26 folds (ArguAna's fold: 0.6 / 0.4 at 4) over
# the 18 sets of ../shared/corpora/eval and 8 cross-lingual XQuAD-R pairings (questions or paragraphs in one language
# asked of paragraphs in another: vector search far ahead), scored both as `inlet eval` does (k 30) and as a default
# search returns it (k 5), among the fusions keeping those rows' mean at least at 0.5 / 0.5's (bench/fusion.py;
# bench/README.md, "Fusion with a temperature"). Before: 0.5 / 0.5 at temperature 0, up to 0.016 below vector search
# where it is far ahead. MiniLM and Gemini: 0.5 / 0.5 at temperature 0, not re-chosen (no runs of theirs over the new
# sets; Gemini is not reachable here); MiniLM's vector side is skipped for languages it does not read. The static and
# hashing embedders: full-text alone (vector weight 0, so a hybrid search embeds no query), chosen by leave-one-set-out
# over each one's own rows (6 static, 18 hashing) in every fold: no weight from 0.05 to 0.7, fixed or following the
# sides' agreement, gained more than +0.007 on any row, and 0.5 lost up to 0.147 (bench/fusion.py, "per embedder").
EMBEDDER_FUSION: dict[str, FusionPrior] = {
    "e5": FusionPrior(0.55, 0.45, 0.0, 3.0), "minilm": FusionPrior(0.5, 0.5, 0.0, 0.0),
    "gemini": FusionPrior(0.5, 0.5, 0.0, 0.0),
    "static": FusionPrior(0.0, 1.0, 0.0, 0.0), "hashing": FusionPrior(0.0, 1.0, 0.0, 0.0)}


class QueryConfig(_Strict):
    """How search ranks and fuses; indexes kept by the ingest flow."""

    mode: Literal["vector", "fulltext", "hybrid"] = Field(
        "hybrid", description="Default search mode. Hybrid, fused as query.fusion says: measured against both "
        "of its parts on every set in ../shared/corpora/eval (bench/README.md).")
    fusion: Literal["zscore", "rrf"] = Field(
        "zscore", description="How hybrid mode fuses its sides: zscore (standardised scores, weighted: a side "
        "that cannot tell its candidates apart barely counts) or rrf (reciprocal rank fusion). query/fusion.py.")
    # Unset, the weights, agreement and temperature are the index's embedder's (EMBEDDER_FUSION); only the
    # weights' ratio matters.
    vector_weight: float | None = Field(None, ge=0, description="Weight of the vector ranking in hybrid fusion; "
                                        "unset: the embedder's own (0.55 for e5, 0.5 for MiniLM and Gemini, 0 for "
                                        "static and hashing; docs/querying.md).")
    fulltext_weight: float | None = Field(None, ge=0, description="Weight of the full-text (BM25) ranking in hybrid "
                                          "fusion; unset: the embedder's own (0.45 for e5, 0.5 for MiniLM and "
                                          "Gemini, 1 for static and hashing).")
    rrf_k: int = Field(60, ge=1, description="Reciprocal rank fusion constant: score = weight / (rrf_k + rank).")
    temperature: float | None = Field(
        None, ge=0, description="z-score fusion: each standardised score z counts as T x exp(z / T), so a side "
        "whose best candidate stands far above its rest carries the query (0: z itself; else at least 1). Unset: "
        "the embedder's own (3 for e5, 0 for the others). query/fusion.py.")
    agreement: float | None = Field(
        None, ge=0, le=1, description="Hybrid fusion: the share of their first 20 candidates the two "
        "sides must have in common for the vector side to keep all its weight; below it, it keeps that fraction "
        "(a weak embedder's list shares little with BM25's). 0: fixed weights; unset: the embedder's own (0 for "
        "e5, MiniLM and Gemini). query/fusion.py.")
    candidates: int = Field(4, ge=1, le=100, description="Each side of a hybrid search fetches candidates x k rows.")
    fulltext_index: bool = Field(True, description="Create and keep current a full-text index on chunk text.")
    fulltext_language: str = Field(
        "auto", description="Stemming and stop words of the full-text index: auto (the chunks' most common "
        "language, decided when the index is built and checked again by maintenance), none, or a language code "
        "LanceDB stems (ar da nl en fi fr de el hu it no pt ro ru es sv ta tr). Words are split by ICU in every "
        "case, so Chinese, Japanese and Thai are searchable.")
    freshness_half_life_days: float | None = Field(
        None, gt=0, description="Boost recently modified documents in every mode: a hit's score is multiplied by "
        "1 + 0.5 ** (age in days / this), so a document modified now counts double and one this many days old "
        "1.5 times; documents of unknown age are not boosted. None (default): off.")
    # 15,000: from here the index's recall@10 is 0.998 (bench/search_latency.py), exact search reads every vector
    # of the table per query (~57 ms of CPU at 19.2k chunks against ~17 with the index; a served load is CPU-bound),
    # and on SciFact (15.2k chunks) the index changed no vector top 10 of 300 queries and no nDCG@10 (0.724 default).
    # Built once when a run crosses it: ~6 s at 19.2k rows on two cores.
    ann_min_rows: int = Field(15_000, ge=256, description="Build the ANN vector index once the chunks table has "
                              "this many rows; below it, exact search is fast enough.")
    nprobes: int = Field(12, ge=1, description="ANN index partitions searched per query (of rows / 4096): at 1M "
                         "rows, 12 gives recall@10 0.997 with refine_factor 2, as 20 does, ~3 ms sooner.")
    ef: int = Field(100, ge=10, description="ANN graph search breadth per partition: recall@10 0.98 at 100 in "
                    "bench/search_latency.py, 0.86 at the library default.")
    refine_factor: int = Field(2, ge=1, description="Re-rank refine_factor x k ANN candidates by their full vectors "
                               "(1: no re-ranking): the index's 8-bit vectors alone cap recall@10 near 0.95 at 1M.")

    def fusion_for(self, embedder: str) -> FusionPrior:
        """The fusion over an index of this embedder kind: each of its settings as this section sets it, else the
        kind's (EMBEDDER_FUSION)."""
        prior = EMBEDDER_FUSION[embedder]
        return FusionPrior(**{f.name: getattr(prior, f.name) if getattr(self, f.name) is None else getattr(self, f.name)
                              for f in dataclasses.fields(FusionPrior)})

    def for_embedder(self, embedder: str) -> QueryConfig:
        """This section with its fusion decided for an index of this embedder kind."""
        return self.model_copy(update=dataclasses.asdict(self.fusion_for(embedder)))

    @field_validator("temperature")
    @classmethod
    def _temperature_off_or_from_one(cls, value: float | None) -> float | None:
        # A standout's z reaches sqrt(candidates - 1): below T 1, exp(z / T) overflows floats on long candidate lists.
        if value is not None and 0 < value < 1:
            msg = f"{value} is neither 0 (plain z-scores) nor at least 1"
            raise ValueError(msg)
        return value

    @field_validator("fulltext_language")
    @classmethod
    def _stemmed_language(cls, value: str) -> str:
        if value not in ("auto", "none", *FTS_LANGUAGES):
            msg = f"'{value}' is not auto, none or a language LanceDB stems ({' '.join(sorted(FTS_LANGUAGES))})"
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _fulltext_modes_need_the_index(self) -> QueryConfig:
        if self.mode != "vector" and not self.fulltext_index:
            msg = f"mode {self.mode} searches the full-text index, which fulltext_index: false turns off"
            raise ValueError(msg)
        return self


# The data-quality checks of each stage artifact (tasks/quality.py defines them); severities can be overridden.
QUALITY_CHECKS: dict[str, tuple[str, ...]] = {
    "documents": ("doc_id_present", "doc_id_unique", "access_level_allowed"),
    "elements": ("doc_id_present", "text_not_empty", "page_at_least_1"),
    "chunks": ("chunk_id_present", "chunk_id_unique", "text_not_empty", "tokens_within_limit"),
    "embedded_chunks": ("vector_dimension", "vector_finite", "vector_not_zero"),
}


class QualityConfig(_Strict):
    """Data-quality gates (great-expectations) over each stage artifact, before anything is committed."""

    enabled: bool = Field(True, description="Validate every run's artifacts before the upsert.")
    severity: dict[str, Literal["quarantine", "fail", "warn"]] = Field(
        default_factory=dict, description="Override a check's severity, keyed '<artifact>.<check>', e.g. "
        "{'chunks.tokens_within_limit': 'fail'}: quarantine (the failing rows' documents), fail (stop the run "
        "before committing) or warn (report only).")

    @field_validator("severity")
    @classmethod
    def _known_checks(cls, value: dict[str, str]) -> dict[str, str]:
        known = {f"{a}.{c}" for a, checks in QUALITY_CHECKS.items() for c in checks}
        unknown = sorted(set(value) - known)
        if unknown:
            msg = f"unknown check {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            raise ValueError(msg)
        return value


class RunConfig(_Strict):
    """Limits a run checks before it calls any model."""

    max_cost_usd: float | None = Field(
        None, ge=0, description="Stop a run whose plan (`inlet plan`) is estimated to cost more than this, before "
        "any model call and with nothing written; the error says what the plan costs and why. None: no ceiling. "
        "A ceiling extracts and chunks the run's documents once more, for the plan.")


class GateConfig(_Strict):
    """A quality gate on publishing: a run whose new version loses too much recall on these questions is held."""

    questions: Path = Field(description="CSV with columns question and gold (document ids or paths, ';'-separated), "
                            "relative to the config file's folder.")
    k: int = Field(10, ge=1, le=100, description="Recall is measured in the top k search results.")
    max_drop: float | None = Field(0.02, ge=0, le=1, description="Hold the run if its recall@k falls more than "
                                   "this below the published version's (None: no such rule).")
    min_recall: float | None = Field(None, ge=0, le=1, description="Hold the run if its recall@k is below this "
                                     "(None: no floor).")
    mode: Literal["vector", "fulltext", "hybrid"] | None = Field(None, description="Search mode to measure "
                                                                  "(default: query.mode).")


class PublishConfig(_Strict):
    """What a run must pass before readers move to its version."""

    gate: GateConfig | None = Field(None, description="A recall gate on a questions CSV; None: every run publishes.")


class ServingConfig(_Strict):
    """How `inlet mcp` and `inlet api` serve agents and applications: whose clearance, and what they log."""

    clearance: Literal["public", "internal", "restricted", "confidential"] = Field(
        "public", description="Clearance of every caller of `inlet mcp`, and of `inlet api` without a keys file; "
        "fixed when the server starts, never taken from a request.")
    caller: str = Field("agent", description="Caller name written to the access log for `inlet mcp` (and for "
                        "`inlet api` without a keys file).")
    access_log: Path | None = Field(None, description="Access log (JSON lines, one per call), relative to the config "
                                    "file's folder; None: access.jsonl beside the run artifacts folder.")
    log_queries: bool = Field(False, description="Also write each query's text to the access log (by default only "
                              "its sha256).")
    api_keys: Path | None = Field(None, description="YAML file of API keys for `inlet api`: keys: [{caller, sha256, "
                                  "clearance}], relative to the config file's folder; None: no key asked.")
    max_k: int = Field(50, ge=1, le=1000, description="Most hits one search may return.")
    max_query_chars: int = Field(2000, ge=1, description="Longest query a search takes, in characters (longer: "
                                 "refused with a message).")
    rate_limit: str | None = Field("600/minute", description="Requests one caller (an API key, or a client address "
                                   "on a server without keys) may make to `inlet api` or `inlet mcp --http`, e.g. "
                                   "'600/minute' or '20/second'; past it, 429 with Retry-After. None: no limit.")
    max_body_bytes: int = Field(65536, ge=1024, description="Largest request body either HTTP server reads "
                                "(larger: 413).")
    timeout_s: float = Field(30.0, gt=0, le=3600, description="Longest either HTTP server waits for a request's body "
                             "(longer: 408) and for its answer (longer: 503 with Retry-After; the read it began "
                             "finishes on its own and is logged).")
    concurrency: int | None = Field(None, ge=1, le=256, description="Reads either server runs at once; the rest "
                                    "wait their turn (within timeout_s). None: twice the machine's cores. LanceDB "
                                    "uses every core for each read: more at once only share them, each holding its "
                                    "buffers.")

    @field_validator("rate_limit")
    @classmethod
    def _rate(cls, value: str | None) -> str | None:
        if value is None:
            return value
        from limits import parse  # the library that counts it (query/guard.py)

        try:
            parse(value)
        except ValueError:
            msg = f"'{value}' is not a rate such as '600/minute', '20/second' or '10000/hour'"
            raise ValueError(msg) from None
        return value


class MaintenanceConfig(_Strict):
    """What the maintenance flow keeps and whether it repairs what its integrity check finds."""

    retention_days: float = Field(7.0, ge=0, description="Table versions (and the run tags on them) younger than "
                                  "this are kept for as_of; older ones are pruned. 0 keeps only the latest.")
    keep_model_cache: bool = Field(False, description="Keep every model cache entry forever (cheap rebuilds and "
                                   "rollbacks, at the cost of disk); otherwise entries that no chunk has used for "
                                   "retention_days are dropped.")
    repair: bool = Field(False, description="Repair integrity findings: delete orphan chunks and bad vectors, and "
                         "send their documents back through the next ingest run.")


class WatchConfig(_Strict):
    """Live mode (`inlet watch`): how changes are noticed, settled and reconciled, and the store kept small."""

    events: bool = Field(True, description="Watch local folders and bundle files with file-system events; false: "
                         "only the reconciliation crawl and polling notice changes (network file systems).")
    settle_ms: int = Field(50, ge=10, le=60_000, description="A set of changes is settled once no further event "
                           "came for this long: a file still being written keeps moving it on.")
    max_wait_ms: int = Field(1000, ge=10, le=600_000, description="Under a steady stream of events, a micro-batch "
                             "starts at the latest this long after the first event of its set.")
    reconcile_s: float = Field(300.0, gt=0, description="Seconds between reconciliation crawls (the ordinary "
                               "stat/hash detection over every source): lost events cost latency, never content. "
                               "One also runs at start.")
    poll_s: float = Field(60.0, gt=0, description="Seconds between polls of object storage and web sources "
                          "(a source's own poll_s wins); web pages are fetched conditionally.")
    maintain_idle_s: float = Field(0.0, ge=0, description="Maintenance (tiered compaction, version pruning, run "
                                   "folders) runs once due and no change waits, and this long after the last "
                                   "micro-batch.")
    maintain_every: int = Field(20, ge=1, description="Maintenance is due after this many micro-batches (or "
                                "at the next gap past maintain_max_s); without a gap, it runs after twice as "
                                "many anyway.")
    maintain_max_s: float = Field(3600.0, gt=0, description="Maintenance is also due this long after the last one.")
    keep_versions_s: float = Field(120.0, ge=0, description="Live mode's version retention: table versions "
                                   "and run tags younger than this are kept for as_of; older ones are pruned, "
                                   "except one run tag per hour back to maintenance.retention_days.")
    keep_run_folders: int = Field(50, ge=1, description="Run artifact folders kept (the newest); older ones are "
                                  "deleted by live mode's maintenance.")
    maintain_quiet_s: float = Field(10.0, gt=0, description="Maintenance also runs once no change came for this "
                                    "long after a micro-batch, so a quiet store's indexes cover every row.")
    worker_growth_mb: float = Field(64.0, gt=0, description="The worker process that runs the flows is replaced by "
                                    "a warmed spare once its resident memory grew this much past its settled size "
                                    "(libraries' allocators keep what thousands of runs freed).")
    worker_settle_runs: int = Field(100, ge=1, description="Runs after which a worker's memory counts as settled "
                                    "(models loaded, caches filled): its growth is measured from there.")
    worker_nice: int = Field(10, ge=0, le=19, description="Added to the nice value of the worker that runs the live "
                             "flows: where `inlet api` or `inlet mcp` share the machine, their searches get the cores "
                             "first and a run waits only while they are busy (32 agents on 2 cores, a change every "
                             "3 s, the worker reniced to 19 by hand: searches over 300 ms 16.7% -> 2.4% of calls; "
                             "bench/README.md). 0: the watcher's own.")
    worker_env: dict[str, str] = Field(
        default_factory=lambda: dict(LEAN_MEMORY_ENV),
        description="Environment variables the worker is started with, where the watcher's own environment "
                    "does not set them: by default glibc's and Arrow's documented switches that let freed memory "
                    "go back (as prefect.yaml's deployments set them); {} starts it with the environment alone.")


class StoreConfig(_Strict):
    """Where tables and run artifacts live."""

    uri: str = Field("../data/lancedb", description="LanceDB folder, relative to the config file's folder, or a URI "
                     "on object storage (s3://bucket/lancedb) that workers on other machines can reach.")
    options: dict[str, str] = Field(default_factory=dict, description="LanceDB storage options for a store on object "
                                    "storage (aws_endpoint, aws_region, allow_http, ...); credentials may come from "
                                    "the environment.")
    artifacts: str = Field("../data/runs", description="Run artifact folder, relative to the config file's folder, "
                           "or an fsspec URI (s3://bucket/runs) that workers on other machines can reach.")
    artifacts_options: dict[str, Any] = Field(default_factory=dict, description="fsspec options for an artifacts "
                                              "URI (endpoint_url, ...); credentials may come from the environment.")
    chunks_table: str = Field("chunks", description="Name of the chunks table.")
    documents_table: str = Field("documents", description="Name of the documents table.")
    runs_table: str = Field("runs", description="Name of the runs table.")
    quarantine_table: str = Field("quarantine", description="Name of the table listing what is quarantined now.")
    cache_table: str = Field("model_cache", description="Name of the model cache table: every vector and "
                             "enrichment a model made, by content key, kept from the moment it is answered "
                             "(shared by the store's indexes and workers).")
    lock_wait_s: float = Field(0, ge=0, description="How long a run waits for another run writing to the same "
                               "store to finish; 0 refuses at once (nothing is written, the message names the "
                               "other run).")

    @model_validator(mode="after")
    def _distinct_tables(self) -> StoreConfig:
        """Refuse two roles in one table: the model cache appended to the chunks table would wreck both."""
        names = {"chunks_table": self.chunks_table, "documents_table": self.documents_table,
                 "runs_table": self.runs_table, "quarantine_table": self.quarantine_table,
                 "cache_table": self.cache_table}
        taken: dict[str, str] = {}
        for key, name in names.items():
            if name in taken:
                msg = f"{key} and {taken[name]} both name table '{name}': each table needs a name of its own"
                raise ValueError(msg)
            taken[name] = key
        return self


class ExecutionConfig(_Strict):
    """How a run's work is cut into batches and where the batches run."""

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: object) -> object:
        removed = {"stage_runs_mb": "every stage is a Prefect task run in every run now",
                   "lean_memory": "set MALLOC_ARENA_MAX=2 and ARROW_DEFAULT_MEMORY_POOL=system in the environment "
                                  "instead (prefect.yaml's deployments do)"}
        for key, why in removed.items():
            if isinstance(data, dict) and key in data:
                msg = f"{key} was removed: {why}; delete the key"
                raise ValueError(msg)
        return data

    batch_docs: int = Field(500, ge=1, description="Documents per batch: extract, chunk, enrich and embed run one "
                            "batch at a time per worker, so memory follows the batch size, not the corpus.")
    batch_mb: float = Field(64.0, gt=0, description="A batch closes early once its documents' bytes reach this.")
    commit_rows: int = Field(50_000, ge=1, description="The writer commits to LanceDB once this many chunk rows "
                             "have come in (chunks, then their documents): a run makes a handful of table "
                             "versions, and a crash loses at most this much finished model work.")
    task_runner: Literal["thread", "process", "dask"] = Field(
        "thread", description="thread: batches in threads of the run's process (model calls overlap the CPU "
        "work); process: in worker processes of this machine (CPU-bound extraction and chunking in parallel); "
        "dask: on a Dask cluster through prefect-dask.")
    workers: int = Field(2, ge=1, le=256, description="Batches processed at once (threads, processes or, for a "
                         "local Dask cluster, its worker processes).")
    dask_address: str | None = Field(None, description="Scheduler of an existing Dask cluster (tcp://host:8786); "
                                     "none starts a local cluster of `workers` processes for the run.")
    cpu_workers: int | None = Field(None, ge=0, le=64, description="With the thread runner: worker processes "
                                    "sharing the batches' Markdown extraction and chunking (Python work that threads "
                                    "cannot run in parallel); 0 keeps it in the run's process; none means one per "
                                    "core, at most four. Started only for runs with 2 MB of documents to process.")
    systemic_share: float = Field(0.5, gt=0, le=1, description="A run in which more than this share of the "
                                  "documents it works on fail with the same unexpected exception type (a missing "
                                  "library, a broken install) stops before committing anything, quarantining "
                                  "nothing: that is a broken install, not bad documents. Known reasons (encrypted, "
                                  "no_text, ...) never count.")
    systemic_min_docs: int = Field(20, ge=1, description="...and only when at least this many documents failed that "
                                   "way: in a small run a few bad files are just bad files.")

    @model_validator(mode="after")
    def _address_needs_dask(self) -> ExecutionConfig:
        if self.dask_address is not None and self.task_runner != "dask":
            msg = "dask_address is only read with task_runner: dask"
            raise ValueError(msg)
        return self


class VariantConfig(_Strict):
    """An index variant: settings that differ from the main index; each variant gets its own tables."""

    chunking: dict[str, Any] = Field(default_factory=dict, description="Overrides of the chunking section.")
    enrichment: dict[str, Any] = Field(default_factory=dict, description="Overrides of the enrichment section.")
    embedding: dict[str, Any] = Field(default_factory=dict, description="Overrides of the embedding section.")


class InletConfig(_Strict):
    """The whole pipeline configuration."""

    sources: tuple[SourceConfig, ...] = Field(min_length=1, description="Document sources to crawl.")
    extraction: ExtractionConfig = Field(default_factory=ExtractionConfig)
    chunking: ChunkingConfig = Field(default_factory=ChunkingConfig)
    enrichment: EnrichmentConfig = Field(default_factory=EnrichmentConfig)
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    pricing: PricingConfig = Field(default_factory=PricingConfig)
    query: QueryConfig = Field(default_factory=QueryConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    publish: PublishConfig = Field(default_factory=PublishConfig)
    serving: ServingConfig = Field(default_factory=ServingConfig)
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    watch: WatchConfig = Field(default_factory=WatchConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    api_key_block: str | None = Field(None, description="Prefect Secret block holding the Gemini API key, read "
                                      "when neither GEMINI_API_KEY nor GOOGLE_API_KEY is set.")
    store: StoreConfig = Field(default_factory=StoreConfig)
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    variants: dict[str, VariantConfig] = Field(
        default_factory=dict, description="Named index variants built from the same extracted documents, each "
        "in tables <chunks_table>__<name> and documents__<name>, e.g. header-only vs merged sections.")

    @field_validator("variants")
    @classmethod
    def _variant_names(cls, value: dict[str, VariantConfig]) -> dict[str, VariantConfig]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                msg = f"variant name '{name}' may only hold letters, digits, _ and -"
                raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _variants_are_valid(self) -> InletConfig:
        for name in self.variants:
            self.variant(name)  # raises naming the variant and key
        return self

    def variant(self, name: str) -> InletConfig:
        """Return the config of a named variant: its overrides on top of this one, with its own tables."""
        spec = self.variants[name]
        update = {}
        for section, model in (("chunking", ChunkingConfig), ("enrichment", EnrichmentConfig),
                               ("embedding", EmbeddingConfig)):
            overrides = getattr(spec, section)
            if not overrides:
                continue
            try:
                update[section] = model.model_validate({**getattr(self, section).model_dump(), **overrides})
            except ValidationError as exc:
                err = exc.errors()[0]
                where = ".".join(str(p) for p in err["loc"])
                msg = f"variants.{name}.{section}.{where}: {err['msg']}"
                raise ValueError(msg) from None
        store = self.store.model_copy(update={"chunks_table": f"{self.store.chunks_table}__{name}",
                                              "documents_table": f"{self.store.documents_table}__{name}",
                                              "runs_table": f"{self.store.runs_table}__{name}",
                                              "quarantine_table": f"{self.store.quarantine_table}__{name}"})
        return self.model_copy(update={**update, "store": store, "variants": {}})

    def all_variants(self) -> list[tuple[str | None, InletConfig]]:
        """Return the main index (name None) and each named variant, with their configs."""
        return [(None, self), *((name, self.variant(name)) for name in self.variants)]

    @field_validator("sources")
    @classmethod
    def _unique_names(cls, value: tuple[SourceConfig, ...]) -> tuple[SourceConfig, ...]:
        names = [s.name for s in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            msg = f"source names must be unique; repeated: {', '.join(dupes)}"
            raise ValueError(msg)
        return value

    def resolved(self, base: Path) -> InletConfig:
        """Return a copy with relative paths made absolute against base."""

        def _abs(p: Path) -> Path:
            return p if p.is_absolute() else (base / p).resolve()

        sources = tuple(s.model_copy(update={"path": _abs(s.path) if s.path is not None else None})
                        for s in self.sources)
        artifacts = self.store.artifacts if "://" in self.store.artifacts else str(_abs(Path(self.store.artifacts)))
        uri = self.store.uri if "://" in self.store.uri else str(_abs(Path(self.store.uri)))
        store = self.store.model_copy(update={"uri": uri, "artifacts": artifacts})
        prompt = self.enrichment.prompt
        enrichment = self.enrichment.model_copy(update={"prompt": _abs(prompt) if prompt else None})
        gate = self.publish.gate
        publish = (self.publish.model_copy(update={"gate": gate.model_copy(update={"questions": _abs(gate.questions)})})
                   if gate is not None else self.publish)
        keys = self.serving.api_keys
        log = self.serving.access_log
        if log is None and "://" not in artifacts:
            log = Path(artifacts).parent / "access.jsonl"
        serving = self.serving.model_copy(update={"access_log": _abs(log) if log is not None else None,
                                                  "api_keys": _abs(keys) if keys is not None else None})
        return self.model_copy(update={"sources": sources, "store": store, "enrichment": enrichment,
                                       "publish": publish, "serving": serving})

    def fingerprint(self) -> str:
        """Return a short hash of the whole configuration."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _location(loc: tuple[str | int, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def parse_config(data: object, *, origin: str) -> InletConfig:
    """Validate a mapping as an InletConfig; errors name origin and the key."""
    if not isinstance(data, dict):
        msg = f"{origin}: expected a mapping at the top level, got {type(data).__name__}"
        raise ConfigError(msg)
    try:
        return InletConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"{origin}: {_location(e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from None


def load_config(path: str | Path) -> InletConfig:
    """Read, validate and resolve a YAML config file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"{path}: cannot read config file: {exc.strerror or exc}"
        raise ConfigError(msg) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        msg = f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}"
        raise ConfigError(msg) from None
    return parse_config(data, origin=str(path)).resolved(path.resolve().parent)


class ApiKey(_Strict):
    """One caller of `inlet api`: its name, the sha256 of its key (the key itself is never stored) and clearance."""

    caller: str = Field(min_length=1, description="Name written to the access log.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex sha256 of the key: `printf %s KEY | sha256sum`.")
    clearance: Literal["public", "internal", "restricted", "confidential"] = Field(description="What it may read.")


class ApiKeys(_Strict):
    """The keys file of `inlet api`."""

    keys: tuple[ApiKey, ...] = Field(min_length=1)


def load_api_keys(path: Path) -> ApiKeys:
    """Read and validate a keys file; errors name the file and the key."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        msg = f"{path}: cannot read API keys file: {exc.strerror or exc}"
        raise ConfigError(msg) from None
    except yaml.YAMLError as exc:
        msg = f"{path}: not valid YAML: {getattr(exc, 'problem', exc)}"
        raise ConfigError(msg) from None
    try:
        keys = ApiKeys.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("\n".join(f"{path}: {_location(e['loc'])}: {e['msg']}" for e in exc.errors())) from None
    seen: set[str] = set()
    for i, key in enumerate(keys.keys):
        if key.sha256 in seen:
            msg = f"{path}: keys.{i}.sha256: the same key is listed twice"
            raise ConfigError(msg)
        seen.add(key.sha256)
    return keys
