"""A document's own metadata: front matter, HTML head, detected language, merged with its source's."""

from __future__ import annotations

import html as html_lib
import io
import json
import re
import xml.etree.ElementTree as ET  # noqa: N817 - expat refuses entity expansion bombs (expat >= 2.4)
import zipfile
from html.parser import HTMLParser

from providers.langid import classify_many, language_identifier
from schemas.config import ACCESS_LEVELS
from schemas.errors import ExtractionError, one_line
from tasks.access import declared_access, effective_access, field_name, stricter

_FREE_FIELDS = ("description", "author", "date")  # front matter scalars kept as free (filterable) fields


def _iso_language(value: object) -> str | None:
    """'en-US', 'EN', 'en_GB' -> 'en'; anything else -> None."""
    if not isinstance(value, str):
        return None
    code = re.split(r"[-_]", value.strip())[0].lower()
    return code if re.fullmatch(r"[a-z]{2,3}", code) else None


def front_matter_metadata(front: dict) -> dict:
    """Pick what Inlet keeps from front matter: tags (tags/keywords), language, a few free fields, access and expiry.

    Raise ExtractionError('invalid') when it declares an access level or expiry that is not valid.
    """
    meta: dict[str, object] = {}
    tags = front.get("tags", front.get("keywords"))
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",")]
    if isinstance(tags, list):
        meta["tags"] = [str(t) for t in tags if isinstance(t, (str, int, float)) and str(t).strip()]
    language = _iso_language(front.get("language", front.get("lang")))
    if language:
        meta["language"] = language
    for key in _FREE_FIELDS:
        value = front.get(key)
        if isinstance(value, (str, int, float, bool)) or hasattr(value, "isoformat"):
            meta[key] = value.isoformat() if hasattr(value, "isoformat") else value
    meta |= declared_access(list(front.items()), "front matter")
    return meta


class _MetaTags(HTMLParser):
    """The <html lang> and every <meta name=... content=...> of a page, in any attribute order or quoting."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lang: str | None = None
        self.meta: list[tuple[str, str]] = []  # (name as written, content)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "html" and self.lang is None:
            self.lang = found.get("lang")
        elif tag == "meta" and found.get("name") and found.get("content") is not None:
            self.meta.append((found["name"].strip(), found["content"] or ""))


def html_metadata(text: str) -> dict:
    """Read <html lang>, <meta name=description|author|keywords> and access and expiry <meta> tags from a page.

    The whole page is read, not its head only: an access declaration is never missed for being placed late.
    Every access or expiry tag counts, the strictest winning. Raise ExtractionError('invalid') when one
    declares an access level or expiry that is not valid.
    """
    parser = _MetaTags()
    parser.feed(text)
    parser.close()
    meta: dict[str, object] = {}
    if _iso_language(parser.lang):
        meta["language"] = _iso_language(parser.lang)
    for name, content in parser.meta:
        key, value = field_name(name), " ".join(html_lib.unescape(content).split())
        if key == "keywords" and value and "tags" not in meta:
            meta["tags"] = [t.strip() for t in value.split(",") if t.strip()]
        elif key in ("description", "author") and value and key not in meta:
            meta[key] = value
    return meta | declared_access([(n, c.strip()) for n, c in parser.meta], "HTML <meta>")


_CORE_NS = "{http://schemas.openxmlformats.org/package/2006/metadata/core-properties}"
_CUSTOM_NS = "{http://schemas.openxmlformats.org/officeDocument/2006/custom-properties}"
_RELS_NS = "{http://schemas.openxmlformats.org/package/2006/relationships}"


def _package_part(package: zipfile.ZipFile, kind: str) -> ET.Element | None:
    """The XML of the package part the root relationships name as kind ('core-properties', 'custom-properties')."""
    try:
        rels = ET.fromstring(package.read("_rels/.rels"))
    except KeyError:
        return None
    for rel in rels.iter(f"{_RELS_NS}Relationship"):
        if rel.get("Type", "").endswith(f"/{kind}"):
            try:
                return ET.fromstring(package.read(rel.get("Target", "").lstrip("/")))
            except KeyError:
                return None
    return None


def docx_metadata(data: bytes) -> dict:
    """A DOCX's access level and expiry: custom properties named as in front matter, or Category set to a level.

    python-docx (which unstructured reads DOCX with) has no API for custom properties, so the package's
    documented parts (ECMA-376 Part 2: _rels/.rels, docProps/core.xml, docProps/custom.xml) are read here.
    Raise ExtractionError('invalid') for a declared value that is not valid, 'corrupt' for unreadable parts.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as package:
            core, custom = _package_part(package, "core-properties"), _package_part(package, "custom-properties")
    except (zipfile.BadZipFile, ET.ParseError, OSError) as exc:
        raise ExtractionError("corrupt", f"the DOCX's properties cannot be read ({one_line(exc)})") from exc
    fields = []
    for prop in custom.iter(f"{_CUSTOM_NS}property") if custom is not None else ():
        value = next(iter(prop), None)  # one typed value element: vt:lpwstr, vt:filetime, ...
        fields.append((prop.get("name", ""), (value.text or "").strip() if value is not None else ""))
    meta = declared_access(fields, "DOCX custom property")
    category = core.find(f"{_CORE_NS}category") if core is not None else None
    if category is not None and (category.text or "").strip().lower() in ACCESS_LEVELS:
        meta = stricter(meta, {"declared_level": category.text.strip().lower()})
    return meta


_FENCED = re.compile(r"```.*?```", re.DOTALL)


def _prose(markdown: str, sample_chars: int) -> str:
    """Markdown with its fenced code blocks blanked out; only as much as a sample of sample_chars needs.

    Blanking the whole of a long page was the costliest part of language detection. A prefix, with
    everything from a fence left open in it cut off, begins exactly as the whole would (fences pair
    left to right), so when it is long enough it is used; otherwise the whole text is blanked.
    """
    limit = sample_chars * 8
    if len(markdown) <= limit:
        return _FENCED.sub(" ", markdown)
    head = _FENCED.sub(" ", markdown[:limit])
    head = head[: head.find("```")] if "```" in head else head.rstrip("`")
    return head if len(head) >= sample_chars else _FENCED.sub(" ", markdown)


def language_sample(rows: list[dict], sample_chars: int = 2000) -> str | None:
    """The prose a document's language is guessed from (code and tables left out); None under 40 characters."""
    sample: list[str] = []
    size = 0
    for row in rows:
        if row["kind"] in {"code", "table"}:
            continue
        text = _prose(row["text"], sample_chars) if row["kind"] == "markdown" else row["text"]
        sample.append(text)
        size += len(text)
        if size >= sample_chars:
            break
    text = " ".join(sample)[:sample_chars]
    return None if len(text.strip()) < 40 else text


def detect_language(rows: list[dict], sample_chars: int = 2000) -> str | None:
    """Guess a document's language from its prose (code left out); None when unsure (below 0.9)."""
    return detect_languages([rows], sample_chars)[0]


def detect_languages(documents: list[list[dict]], sample_chars: int = 2000) -> list[str | None]:
    """detect_language for each document's rows, the language model run over all of them at once."""
    samples = [language_sample(rows, sample_chars) for rows in documents]
    texts = [text for text in samples if text is not None]
    answers = iter(classify_many(language_identifier(), texts))
    return [None if text is None else _confident(next(answers)) for text in samples]


def _confident(answer: tuple[str, float]) -> str | None:
    language, confidence = answer
    return language if confidence >= 0.9 else None


def merged_metadata(doc: dict, own: dict) -> dict:
    """A document's language, tags, free fields, access level and expiry: its own merged with its source's.

    The source's language wins over a detected one but not over one the document states; tags are
    the union; the source's free fields win over the document's; access as tasks/access.py says.
    """
    language = own.get("language") or doc.get("language") or own.get("detected_language")
    tags = list(dict.fromkeys([*(doc.get("tags") or []), *own.get("tags", [])]))
    extra = {**{k: own[k] for k in _FREE_FIELDS if k in own}, **json.loads(doc.get("extra") or "{}")}
    return {"language": language, "tags": tags, "extra": json.dumps(extra, sort_keys=True),
            **effective_access(doc["access_level"], doc.get("expires_at"), own)}
