"""Seeded mutants of real documents for the failure-isolation fuzz test (tests/test_fuzz.py).

Seeds are small real files of every supported format from ../shared/corpora, or the sample corpus when that is
absent. Each mutant is one of: truncated at a random offset, bytes flipped, two files spliced, PDF object values
replaced by numbers or names, a zip entry zeroed or dropped, or a file saved under another format's extension.
"""

from __future__ import annotations

import io
import random
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FORMATS = (".md", ".html", ".txt", ".pdf", ".docx")
_CORPUS_FOLDERS = {".md": "markdown", ".html": "html", ".txt": "text", ".pdf": "pdf", ".docx": "docx"}
# Small seeds: hundreds of mutants must be extracted, chunked, enriched and embedded within the test's minutes.
_MAX_SEED_BYTES = {".md": 30_000, ".html": 30_000, ".txt": 30_000, ".pdf": 120_000, ".docx": 120_000}


@dataclass(frozen=True)
class Mutant:
    """One damaged file to ingest: its name, bytes, the seed's format and how it was made."""

    name: str
    data: bytes
    fmt: str
    how: str


def seeds(corpora: Path | None, fallback: Path, per_format: int, rng: random.Random,
          usable: Callable[[Path], bool] = lambda _p: True) -> dict[str, list[Path]]:
    """Pick up to per_format small usable seed files of each format: from corpora when present, else fallback."""
    picked: dict[str, list[Path]] = {}
    for fmt in FORMATS:
        folder = corpora / _CORPUS_FOLDERS[fmt] if corpora is not None else None
        pool = folder.rglob(f"*{fmt}") if folder is not None and folder.is_dir() else fallback.rglob(f"*{fmt}")
        files = sorted(p for p in pool if p.is_file() and 200 < p.stat().st_size <= _MAX_SEED_BYTES[fmt])
        if fmt == ".html" and not files:
            files = sorted(p for p in fallback.rglob("*.htm*") if p.is_file())
        rng.shuffle(files)
        picked[fmt] = [p for p in files[: per_format * 4] if usable(p)][:per_format]
    return picked


def _truncate(data: bytes, rng: random.Random, _other: bytes) -> bytes:
    return data[: rng.randrange(1, max(2, len(data)))]


def _flip(data: bytes, rng: random.Random, _other: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 64)):
        out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def _splice(data: bytes, rng: random.Random, other: bytes) -> bytes:
    return data[: rng.randrange(1, max(2, len(data)))] + other[rng.randrange(0, max(1, len(other))):]


_PDF_VALUE = re.compile(rb"\d+ \d+ R|<<|\[")


def _pdf_values(data: bytes, rng: random.Random, _other: bytes) -> bytes:
    """Replace object references, dictionaries or arrays with a number or a name (the catalog-as-number crash)."""
    spots = list(_PDF_VALUE.finditer(data))
    if not spots:
        return _flip(data, rng, b"")
    out = data
    for match in sorted(rng.sample(spots, min(len(spots), rng.randint(1, 6))), key=lambda m: -m.start()):
        value = rng.choice([b"42", b"0", b"-1", b"/Bogus", b"3.14", b"null"])
        out = out[: match.start()] + value + out[match.end():]
    return out


def _zip_entry(data: bytes, rng: random.Random, _other: bytes) -> bytes:
    """Zero out or drop one entry of a zip (DOCX) file, rewriting the archive."""
    try:
        source = zipfile.ZipFile(io.BytesIO(data))
        names = source.namelist()
    except zipfile.BadZipFile:
        return _truncate(data, rng, b"")
    victim = rng.choice(names)
    drop = rng.random() < 0.3
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as target:
        for name in names:
            if name == victim and drop:
                continue
            body = source.read(name)
            target.writestr(name, bytes(len(body)) if name == victim else body)
    return buffer.getvalue()


MUTATIONS: dict[str, Callable[[bytes, random.Random, bytes], bytes]] = {
    "truncate": _truncate, "flip": _flip, "splice": _splice, "pdf-values": _pdf_values, "zip-entry": _zip_entry,
}


def _mutations_for(fmt: str) -> list[str]:
    kinds = ["truncate", "flip", "splice", "wrong-extension"]
    if fmt == ".pdf":
        kinds += ["pdf-values", "pdf-values"]
    if fmt == ".docx":
        kinds += ["zip-entry", "zip-entry"]
    return kinds


def mutants(picked: dict[str, list[Path]], per_format: int, rng: random.Random) -> list[Mutant]:
    """Make per_format mutants of each format's seeds, round-robin over the seeds and the format's mutations."""
    everything = [p for files in picked.values() for p in files]
    out: list[Mutant] = []
    for fmt, files in picked.items():
        if not files:
            continue
        kinds = _mutations_for(fmt)
        for i in range(per_format):
            seed = files[i % len(files)]
            how = kinds[i % len(kinds)]
            data = seed.read_bytes()
            other = rng.choice(everything).read_bytes()
            if how == "wrong-extension":
                suffix = rng.choice([s for s in FORMATS if s != fmt])
                out.append(Mutant(f"{fmt[1:]}-{i:03}-{how}{suffix}", data, fmt, how))
                continue
            out.append(Mutant(f"{fmt[1:]}-{i:03}-{how}{fmt}", MUTATIONS[how](data, rng, other), fmt, how))
    return out
