"""A document's own metadata: front matter, HTML head, detected language, merged with its source's."""

from __future__ import annotations

import html as html_lib
import io
import json
import lzma
import mmap
import os
import re
import shutil
import threading
import xml.etree.ElementTree as ET  # noqa: N817 - expat refuses entity expansion bombs (expat >= 2.4)
import zipfile
from array import array
from html.parser import HTMLParser
from pathlib import Path

import numpy as np

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


def model_cache_dir() -> Path:
    """Where Inlet keeps models it derives on first use: $INLET_MODEL_DIR, else ~/.cache/inlet/models."""
    return Path(os.environ.get("INLET_MODEL_DIR") or Path.home() / ".cache" / "inlet" / "models")


def _uint_array(values: np.ndarray) -> array:
    """A NumPy unsigned array as the stdlib array py3langid's tokenizer indexes (faster per item than NumPy)."""
    out = array({2: "H", 4: "I", 8: "L"}[values.dtype.itemsize])
    out.frombytes(np.ascontiguousarray(values).tobytes())
    return out


def _automaton_depth(nextmove: np.ndarray, rowbase: np.ndarray) -> int:
    """Longest path from the start state to any state of py3langid's byte automaton (its longest n-gram prefix).

    The automaton is Aho-Corasick's: a state stands for the longest suffix of the input read so far that
    begins a feature, so it depends only on the last `depth` bytes. A breadth-first walk finds the depth.
    """
    seen = np.zeros(len(rowbase), dtype=bool)
    seen[0] = True
    frontier, depth, byte = np.array([0]), 0, np.arange(256)
    while True:
        reached = np.zeros(len(rowbase), dtype=bool)
        reached[nextmove[(rowbase[frontier][:, None] + byte).ravel()]] = True
        frontier = np.flatnonzero(reached & ~seen)
        if not len(frontier):
            return depth
        seen[frontier] = True
        depth += 1


def _unpacked_model() -> Path:
    """py3langid's model as a folder of plain .npy files beside Inlet's other models, unpacked once per machine.

    Unpacking its LZMA file (and finding the automaton's depth) takes ~1 s, paid once per machine. The arrays
    are then memory-mapped, not read: reading the 68 MB into memory took ~180 ms of every process's first
    run (bench/README.md), and a classification touches only the pages of the states and features it meets.
    """
    from py3langid import __version__
    from py3langid.langid import MODEL_DIR, MODEL_FILE

    # "-v3": one .npy per array, with the automaton's depth; older unpacked files (.npz) are left alone.
    path = model_cache_dir() / f"py3langid-{__version__}-{Path(MODEL_FILE).name.split('.')[0]}-v3"
    if path.is_dir():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = path.with_name(f"{path.name}.{os.getpid()}.raw.npz")
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        with lzma.open(MODEL_DIR / MODEL_FILE) as src, raw.open("wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
        with np.load(raw, allow_pickle=False) as unpacked:
            arrays = {name: unpacked[name] for name in unpacked.files}
    finally:
        raw.unlink(missing_ok=True)  # ~40 MB: never left behind, whatever failed
    rowbase = arrays["nextmove_row"].astype(np.int64) << 8
    arrays["depth"] = np.array(_automaton_depth(arrays["nextmove"], rowbase))
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    for name, values in arrays.items():
        np.save(partial / f"{name}.npy", values, allow_pickle=False)
    try:
        partial.rename(path)  # atomic: a concurrent process sees no folder or the whole one
    except OSError:
        if not path.is_dir():
            raise
        shutil.rmtree(partial, ignore_errors=True)  # another process unpacked it first
    return path


_MODEL_ARRAYS = ("ptc", "pc", "classes", "nextmove", "nextmove_row", "out_feat", "depth")


def _model_arrays(folder: Path) -> dict[str, np.ndarray]:
    """The unpacked model's arrays, memory-mapped read-only; a folder missing one is named, to be removed."""
    missing = [name for name in _MODEL_ARRAYS if not (folder / f"{name}.npy").is_file()]
    if missing:
        msg = f"{folder}: the unpacked language model lacks {', '.join(missing)}; remove the folder to unpack it again"
        raise RuntimeError(msg)
    return {name: np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in _MODEL_ARRAYS}


_LOADING = threading.Lock()
_MODEL: object | None = None


def language_identifier() -> object:
    """py3langid's model (97 languages, ~0.5 ms per document), loaded once per process, threads or not."""
    global _MODEL
    with _LOADING:
        if _MODEL is None:
            _MODEL = _load_language_model()
        return _MODEL


def page_in_language_model() -> None:
    """Map every page of the language model's two large arrays now, one read a page (~4-9 ms).

    They are memory-mapped: a process's first classifications fault their pages in as they meet them (a
    1% run's 16 documents: ~700 faults, ~2-3 ms of its extraction). The flow does this while GX imports.
    """
    model = language_identifier()
    for array in (model.tk_nextmove, model.nb_ptc):  # type: ignore[attr-defined]
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        int(flat[:: mmap.PAGESIZE].sum())


def _load_language_model() -> object:
    from py3langid.langid import LanguageIdentifier

    class Identifier(LanguageIdentifier):
        """py3langid's identifier with its byte automaton run in NumPy: the same scores, half the time.

        py3langid steps through a text's bytes in Python. A state depends only on the last `depth` bytes,
        so every position's state is reached by `depth` array steps from the start state instead; the
        features then count in the order they first occur, as py3langid's Counter does, so the sums (and
        the floating-point results) are exactly its own.
        """

        __slots__ = ("_depth", "_np_half", "_np_output", "_np_ptc_bits", "_np_rowbase")

        def __init__(self, *args: object, depth: int, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            self._depth = depth
            self._np_rowbase = np.asarray(self.tk_row, dtype=np.int32) << 8
            self._np_output = np.asarray(self.tk_output, dtype=np.int32)
            # The float16 table's rows go to float32 through a 65,536-entry table (256 KB): NumPy's own float16 cast
            # was half of a document's scoring. The values are exact either way, so the scores are unchanged.
            self._np_ptc_bits = np.ascontiguousarray(self.nb_ptc, dtype=np.float16).view(np.uint16)
            self._np_half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)

        def _raw_score(self, text: bytes) -> np.ndarray:
            raw = np.frombuffer(text, dtype=np.uint8)
            n, nextmove, rowbase = len(raw), self.tk_nextmove, self._np_rowbase  # nextmove: a NumPy array here
            state = np.zeros(n, dtype=np.int32)
            # np.take rather than fancy indexing: the same gathers, several times faster on 1-D arrays.
            for back in range(min(self._depth, n) - 1, 0, -1):  # position i reads byte i - back, from the start state
                state[back:] = np.take(nextmove, np.take(rowbase, state[back:]) + raw[: n - back])
            features = np.take(self._np_output, np.take(nextmove, np.take(rowbase, state) + raw))
            features = features[features >= 0]
            if not len(features):
                return super()._raw_score(text)  # py3langid's own answer for featureless text
            ids, first, counts = np.unique(features, return_index=True, return_counts=True)
            order = np.argsort(first, kind="stable")
            rows = np.take(self._np_half, np.take(self._np_ptc_bits, ids[order], axis=0))
            return np.log1p(counts[order].astype(np.float32)) @ rows + self.nb_pc

    data = _model_arrays(_unpacked_model())
    # nextmove as a NumPy array: py3langid's own walk indexes it too, for featureless text only.
    return Identifier(data["ptc"], np.array(data["pc"]), data["classes"].tolist(), data["nextmove"],
                      data["out_feat"].tolist(), norm_probs=True, tk_row=_uint_array(data["nextmove_row"]),
                      depth=int(data["depth"]))


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


def detect_language(rows: list[dict], sample_chars: int = 2000) -> str | None:
    """Guess a document's language from its prose (code left out); None when unsure (below 0.9)."""
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
    if len(text.strip()) < 40:
        return None
    language, confidence = language_identifier().classify(text)
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
