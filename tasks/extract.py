"""documents -> elements: unstructured partitions each new or changed file; Markdown keeps its raw text."""

from __future__ import annotations

import hashlib
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import yaml
from prefect import get_run_logger

from schemas.arrow import DOCUMENTS_SCHEMA, ELEMENTS_SCHEMA, EXTRACTED_SCHEMA
from schemas.config import ExtractionConfig
from schemas.errors import ExtractionError
from tasks.artifacts import read_artifact, write_artifact
from tasks.progress import stage_progress
from tasks.stage import stage

MARKDOWN = {".md", ".markdown"}
PARTITIONED = {".txt", ".html", ".htm", ".pdf", ".docx"}
_OLE2_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # legacy Office / encrypted OOXML container
_FRONT_MATTER = re.compile(r"\A(?:---|\+\+\+)[ \t]*\n(.*?)\n(?:---|\+\+\+)[ \t]*(?:\n|\Z)", re.S)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml is ~10x faster on front matter
_SKIPPED_CATEGORIES = {"PageBreak", "Header", "Footer", "PageNumber", "Image", "FigureCaption"}


@dataclass(frozen=True)
class Extracted:
    """One document's elements and title."""

    elements: list[dict]
    title: str | None
    content_hash: str


# --- decoding and sniffing ------------------------------------------------------------------


def decode_text(data: bytes) -> str:
    """Decode bytes as UTF-8 (BOM aware), else by detection; newlines normalised to \\n."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        from charset_normalizer import from_bytes

        best = from_bytes(data).best()
        if best is None:
            raise ExtractionError("encoding", "could not detect the text encoding") from None
        text = str(best)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def sniff_kind(data: bytes, suffix: str) -> str:
    """Return the file kind from its leading bytes, falling back to the suffix."""
    if data.startswith(b"%PDF-"):
        return ".pdf"
    if data.startswith(b"PK\x03\x04") and suffix in {".pdf", ".txt", ".md", ""}:
        return ".docx"
    return suffix


def split_front_matter(text: str) -> tuple[dict, str]:
    """Split YAML front matter from Markdown; malformed front matter is kept as text."""
    match = _FRONT_MATTER.match(text)
    if not match:
        return {}, text
    try:
        meta = yaml.load(match.group(1), Loader=_YAML_LOADER)  # noqa: S506 - a safe loader, C or Python
    except yaml.YAMLError:
        return {}, text
    return (meta if isinstance(meta, dict) else {}), text[match.end() :]


def _first_heading(text: str) -> str | None:
    for line in text.split("\n"):
        m = re.match(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", line)
        if m:
            return m.group(1).strip()
    return None


# --- per format -------------------------------------------------------------------------------


def markdown_elements(doc_id: str, data: bytes, name: str) -> tuple[list[dict], str | None]:
    """Keep Markdown as written (headings, fences) so the chunker sees its structure."""
    meta, body = split_front_matter(decode_text(data))
    if not body.strip():
        raise ExtractionError("empty", "the document has no text")
    title = meta.get("title") if isinstance(meta.get("title"), str) else None
    title = title or _first_heading(body) or Path(name).stem
    row = {"doc_id": doc_id, "element_index": 0, "kind": "markdown", "text": body,
           "heading_level": None, "page": None}
    return [row], title


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


def _partition(path: str, kind: str, cfg: ExtractionConfig) -> list:
    if kind == ".pdf":
        from unstructured.partition.pdf import partition_pdf

        # pdfminer opens PDFs encrypted with an empty user password on its own.
        return partition_pdf(filename=path, strategy=cfg.pdf_strategy, languages=["eng"])
    if kind == ".docx":
        from unstructured.partition.docx import partition_docx

        return partition_docx(filename=path)
    if kind in {".html", ".htm"}:
        from unstructured.partition.html import partition_html

        return partition_html(filename=path)
    from unstructured.partition.text import partition_text

    return partition_text(filename=path, languages=["eng"])


def check_pdf_opens(data: bytes) -> str | None:
    """Refuse PDFs that need a password; return pypdf's complaint about a damaged file, if any.

    unstructured returns no text for both instead of saying why.
    """
    import io

    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        # An empty user password (common for "protected" reports) opens the file: try it.
        if reader.is_encrypted and not reader.decrypt(""):
            raise ExtractionError("encrypted", "the PDF needs a user password")
        len(reader.pages)
    except (PyPdfError, ValueError, KeyError, TypeError, AssertionError, RecursionError) as exc:
        # pypdf is stricter than pdfminer: let unstructured try, and keep this for the verdict.
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


def _classify_failure(exc: Exception, data: bytes, kind: str) -> ExtractionError:
    name = type(exc).__name__
    text = f"{name}: {exc}"[:500]
    if "Password" in name or "password" in str(exc).lower() or "decrypt" in str(exc).lower():
        return ExtractionError("encrypted", f"the file is password-protected ({text})")
    if kind == ".docx" and data.startswith(_OLE2_MAGIC):
        return ExtractionError("encrypted", "an OLE2 container, not a .docx zip: encrypted or legacy Word")
    if isinstance(exc, zipfile.BadZipFile):
        return ExtractionError("corrupt", f"not a readable .docx zip ({text})")
    return ExtractionError("corrupt", f"the parser failed ({text})")


def partitioned_elements(doc_id: str, path: str, data: bytes, cfg: ExtractionConfig) -> tuple[list[dict], str | None]:
    """Partition a non-Markdown file with unstructured."""
    kind = sniff_kind(data, Path(path).suffix.lower())
    if kind not in PARTITIONED:
        raise ExtractionError("unsupported", f"no extractor for '{kind or 'no extension'}' files")
    if kind in {".txt", ".html", ".htm"} and not decode_text(data).strip():
        raise ExtractionError("empty", "the document has no text")
    damage = check_pdf_opens(data) if kind == ".pdf" else None
    try:
        elements = _partition(path, kind, cfg)
    except Exception as exc:  # noqa: BLE001 - any parser failure quarantines this one document
        raise _classify_failure(exc, data, kind) from exc
    rows = [r for i, e in enumerate(elements) if (r := element_row(doc_id, i, e)) is not None]
    if not rows and damage:
        raise ExtractionError("corrupt", f"the PDF is damaged and yielded no text ({damage})")
    if not rows:
        reason = "no_text" if kind == ".pdf" else "empty"
        raise ExtractionError(reason, "no text could be extracted (scanned or image-only?)")
    title = next((r["text"] for r in rows if r["kind"] == "heading"), None) or Path(path).stem
    return rows, title


def extract_document(doc_id: str, path: str, cfg: ExtractionConfig) -> Extracted:
    """Read and extract one file; raise ExtractionError with a reason code on failure."""
    try:
        size = Path(path).stat().st_size
        if size > cfg.max_file_mb * 1024 * 1024:
            raise ExtractionError("too_large", f"{size} bytes is over the {cfg.max_file_mb} MB limit")
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ExtractionError("unreadable", exc.strerror or str(exc)) from exc
    if not data.strip():
        raise ExtractionError("empty", "the file is empty")
    digest = hashlib.sha256(data).hexdigest()
    if Path(path).suffix.lower() in MARKDOWN and not data.startswith((b"%PDF-", b"PK\x03\x04")):
        rows, title = markdown_elements(doc_id, data, path)
    else:
        rows, title = partitioned_elements(doc_id, path, data, cfg)
    return Extracted(rows, title, digest)


# --- stage ----------------------------------------------------------------------------------------


def extract_documents(documents: pa.Table, cfg: ExtractionConfig,
                      advance: Callable[[int], None] | None = None) -> tuple[pa.Table, pa.Table]:
    """Extract every new or changed document; failures become 'quarantined' rows, not exceptions."""
    elements: list[dict] = []
    extracted: list[dict] = []
    for doc in documents.filter(pa.compute.is_in(documents["change"], pa.array(["new", "changed"]))).to_pylist():
        try:
            result = extract_document(doc["doc_id"], doc["path"], cfg)
        except ExtractionError as exc:
            extracted.append({"doc_id": doc["doc_id"], "title": None, "status": "quarantined",
                              "reason": exc.reason, "message": exc.message, "content_hash": doc["content_hash"]})
        else:
            elements.extend(result.elements)
            extracted.append({"doc_id": doc["doc_id"], "title": result.title, "status": "ok",
                              "reason": None, "message": None, "content_hash": result.content_hash})
        if advance is not None:
            advance(1)
    return (pa.Table.from_pylist(elements, schema=ELEMENTS_SCHEMA),
            pa.Table.from_pylist(extracted, schema=EXTRACTED_SCHEMA))


@stage("extract")
def extract_stage(documents_path: str, cfg: ExtractionConfig, run_dir: str) -> tuple[str, str, list[str]]:
    """Extract new and changed documents; write elements and extracted artifacts."""
    documents = read_artifact(documents_path, DOCUMENTS_SCHEMA)
    todo = [p for p, c in zip(documents["path"].to_pylist(), documents["change"].to_pylist()) if c in ("new", "changed")]
    notice = None
    if any(Path(p).suffix.lower() not in MARKDOWN for p in todo):
        # Only pay for loading spaCy and unstructured (~2-4 s) when some file needs unstructured.
        from tasks.spacy_fallback import install_fallback_if_needed

        notice = install_fallback_if_needed()
    with stage_progress("extract", len(todo)) as advance:
        elements, extracted = extract_documents(documents, cfg, advance)
    failed = extracted.filter(pa.compute.equal(extracted["status"], "quarantined"))
    logger = get_run_logger()
    logger.info("extracted %d documents into %d elements; %d quarantined", len(todo), elements.num_rows, failed.num_rows)
    for row in failed.to_pylist():
        logger.warning("quarantined %s: %s: %s", row["doc_id"], row["reason"], row["message"])
    return (write_artifact(elements, run_dir, "elements", ELEMENTS_SCHEMA),
            write_artifact(extracted, run_dir, "extracted", EXTRACTED_SCHEMA),
            [notice] if notice else [])
