"""py3langid's shipped model, unpacked once per machine into Inlet's cache folder (providers/cache.py).

py3langid ships its model LZMA-compressed; its loader (`modelio.load_model`) decompresses it on every
process start, ~0.35-0.45 s, more than the rest of extracting a small incremental run. The arrays it
returns are written once, uncompressed, to `<cache>/py3langid-<version>-<model file key>/`, and every
later process builds the identifier with py3langid's public constructor from them, memory-mapped (the
score table as a NumPy array, the automaton's transitions as integer views, indexed as py3langid
indexes its own arrays), so a process reads only the pages it uses and worker processes share them. A cache that
cannot be written or read is reported in the log and the packaged model is loaded as py3langid does: the answers
are the same.

The score table is stored as float32: py3langid multiplies its rows by float32 feature counts, and NumPy widened
the float16 rows it gathered on every call (half of a document's classify here). Widening is exact and the
product then runs on the same float32 values, so every score is the same (tests/test_langid.py).

classify_many answers as classify does for many texts at once: py3langid walks its automaton one byte at a time
in Python (~0.3 us a byte, the costliest part of extracting Markdown); here one NumPy step moves every text on by
a byte.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import mmap
import threading
import unicodedata
from importlib.metadata import version
from pathlib import Path

import numpy as np
from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier
from py3langid.modelio import load_model

from providers.cache import cache_root, drop_entry, make_entry, source_key

log = logging.getLogger(__name__)
_FORMAT = 3  # bump when the files written here change


def model_path() -> Path:
    """py3langid's shipped model file."""
    return Path(MODEL_DIR) / MODEL_FILE


def cache_folder(model: Path) -> Path:
    """The cache entry for this py3langid version and model file."""
    return cache_root() / f"py3langid-{version('py3langid')}-{source_key(model)}-v{_FORMAT}"


def _writer(model: Path):  # noqa: ANN202 - a closure for make_entry
    def write(tmp: Path) -> None:
        ptc, pc, classes, nextmove, row, out_feat = load_model(model)
        np.save(tmp / "ptc.npy", np.ascontiguousarray(ptc, dtype=np.float32))
        np.save(tmp / "pc.npy", np.asarray(pc))
        with open(tmp / "nextmove.bin", "wb") as fh:
            nextmove.tofile(fh)
        with open(tmp / "row.bin", "wb") as fh:
            row.tofile(fh)
        np.save(tmp / "out_feat.npy", np.asarray(out_feat, dtype=np.int32))
        manifest = {"classes": list(classes), "nextmove": [nextmove.typecode, len(nextmove)],
                    "row": [row.typecode, len(row)]}
        (tmp / "manifest.json").write_text(json.dumps(manifest))
    return write


def _mapped(path: Path, typecode: str, length: int) -> memoryview:
    """The file's integers, memory-mapped: indexed as py3langid indexes its stdlib array, shared between processes."""
    with open(path, "rb") as fh:
        view = memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)).cast(typecode)
    if len(view) != length:
        raise ValueError(f"{path}: {len(view)} entries, the manifest says {length}")
    return view


def _read(folder: Path) -> LanguageIdentifier:
    """Build the identifier from a cache entry with py3langid's constructor."""
    manifest = json.loads((folder / "manifest.json").read_text())
    return LanguageIdentifier(
        np.load(folder / "ptc.npy", mmap_mode="r"), np.load(folder / "pc.npy"), manifest["classes"],
        _mapped(folder / "nextmove.bin", *manifest["nextmove"]), np.load(folder / "out_feat.npy").tolist(),
        norm_probs=True, tk_row=_mapped(folder / "row.bin", *manifest["row"]))


def load_identifier() -> LanguageIdentifier:
    """py3langid's shipped model with normalised probabilities, from the cache (made on first use)."""
    model = model_path()
    try:
        folder = make_entry(cache_folder(model), _writer(model))
        try:
            return _read(folder)
        except (OSError, ValueError, KeyError, EOFError) as exc:  # a damaged entry (a full disk, a hand edit)
            log.warning("language model cache %s damaged (%s: %s); writing it again", folder, type(exc).__name__, exc)
            drop_entry(folder)
            return _read(make_entry(folder, _writer(model)))
    except (OSError, ValueError, KeyError, EOFError) as exc:
        log.warning("language model cache unusable (%s: %s); loading py3langid's compressed model",
                    type(exc).__name__, exc)
        return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


_LOADING = threading.Lock()
_IDENTIFIER: list[LanguageIdentifier] = []  # one per process, made on first use


def language_identifier() -> LanguageIdentifier:
    """The process's identifier, loaded once whichever thread asks first."""
    with _LOADING:
        if not _IDENTIFIER:
            _IDENTIFIER.append(load_identifier())
        return _IDENTIFIER[0]


# The py3langid releases whose scoring classify_many restates (and tests/test_langid.py checks against); any other
# release is asked text by text.
_RESTATED = ("0.4",)
_GROUP = 512
# Below this many texts one by one is as fast: a step of the walk costs about the same for 1 text as for 30
# (2,000-character samples: 16 texts 11.9 ms one by one, 14.9 together; 32: 21.2 and 19.6; 128: 56.0 and 30.5).
_FEWEST = 32


def classify_many(identifier: LanguageIdentifier, texts: list[str]) -> list[tuple[str, float]]:
    """identifier.classify(text) for each text, the automaton walked for all of them together.

    identifier: one load_identifier made (probabilities normalised).

    py3langid 0.4's classify, restated for a batch: each text NFC-normalised (lower-cased if all upper case)
    and UTF-8 encoded; the automaton's feature counts, in the order first seen; their log1p times the score
    table's rows plus the priors; a softmax at temperature sqrt(bytes); a duplicated label's score folded into
    its first. Sorted longest first, step i moves every text still longer than i bytes on by one byte. The
    bench corpus's 1,384 samples of 2,000 characters: 0.06 s walking and 0.31 s in all, against 0.81 s one by
    one. A text with no feature at all, fewer than _FEWEST texts, or another py3langid release, go to
    identifier.classify.
    """
    if not _restated() or len(texts) < _FEWEST:
        return [identifier.classify(text) for text in texts]
    # At most _GROUP texts walk together: the walk's arrays are bytes x texts (~25 MB for 512 texts of CJK).
    return [answer for start in range(0, len(texts), _GROUP)
            for answer in _classify_group(identifier, texts[start:start + _GROUP])]


@functools.cache
def _restated() -> bool:
    """Tell whether the installed py3langid is a release classify_many restates (its major.minor, read once)."""
    return ".".join(version("py3langid").split(".")[:2]) in _RESTATED


def _classify_group(identifier: LanguageIdentifier, texts: list[str]) -> list[tuple[str, float]]:
    """classify_many for one group of texts."""
    if not texts:
        return []
    data = [_encoded(text) for text in texts]
    lengths = np.fromiter(map(len, data), dtype=np.intp, count=len(data))
    order = np.argsort(-lengths, kind="stable")
    longest = int(lengths.max())
    byte_rows = np.zeros((longest, len(data)), dtype=np.uint8)  # one row per byte position, one column per text
    for column, j in enumerate(order.tolist()):
        byte_rows[: lengths[j], column] = np.frombuffer(data[j], dtype=np.uint8)
    features = _walk(identifier, byte_rows, np.searchsorted(-lengths[order], -np.arange(longest), side="right"))
    answers: list[tuple[str, float]] = [("", 0.0)] * len(texts)
    folds = _alias_pairs(identifier.nb_classes)
    for column, j in enumerate(order.tolist()):
        seen = features[column, : lengths[j]]
        seen = seen[seen >= 0]
        answers[j] = (_decide(identifier, seen, int(lengths[j]), folds) if len(seen)
                      else identifier.classify(texts[j]))
    return answers


def _encoded(text: str) -> bytes:
    """The bytes py3langid 0.4 classifies for a str."""
    if text.isupper():
        text = text.lower()
    return unicodedata.normalize("NFC", text).encode("utf8", errors="surrogatepass")


def _walk(identifier: LanguageIdentifier, byte_rows: np.ndarray, active: np.ndarray) -> np.ndarray:
    """Each text's feature at each byte (-1: none); byte_rows' columns sorted longest first, active[i] of them long enough."""
    moves = np.asarray(identifier.tk_nextmove)
    row_base = np.asarray(identifier.tk_row, dtype=np.intp) << 8
    output = np.asarray(identifier.tk_output, dtype=np.int32)
    states = np.zeros(byte_rows.shape[1], dtype=np.intp)
    features = np.full(byte_rows.shape, -1, dtype=np.int32)
    for i in range(byte_rows.shape[0]):
        k = active[i]
        states[:k] = moves[row_base[states[:k]] + byte_rows[i, :k]]
        features[i, :k] = output[states[:k]]
    return features.T.copy()  # one row per text, for the per-text scoring


def _alias_pairs(classes: list[str]) -> list[tuple[int, int]]:
    """(first, later) columns of each label that appears more than once (py3langid's script aliases)."""
    first: dict[str, int] = {}
    pairs = []
    for i, label in enumerate(classes):
        if label in first:
            pairs.append((first[label], i))
        else:
            first[label] = i
    return pairs


def _decide(identifier: LanguageIdentifier, seen: np.ndarray, length: int,
            folds: list[tuple[int, int]]) -> tuple[str, float]:
    """The label and confidence for one text's features in byte order, as py3langid 0.4 scores and normalises them."""
    values, first, counts = np.unique(seen, return_index=True, return_counts=True)
    order = np.argsort(first, kind="stable")  # py3langid sums in the order its Counter first saw each feature
    table = identifier.nb_ptc[values[order].astype(np.intp)]
    scores = np.log1p(counts[order].astype(np.float32)) @ table + identifier.nb_pc
    scores *= 1.0 / math.sqrt(length or 1)  # normalised, as load_identifier's identifiers are made
    np.exp(scores - scores.max(), out=scores)
    scores /= scores.sum()
    for i, j in folds:
        scores[i] += scores[j]
        scores[j] = 0.0
    best = int(scores.argmax())
    confidence = float(scores[best])
    if identifier.min_confidence is not None and confidence < identifier.min_confidence:
        return "und", confidence
    return identifier.nb_classes[best], confidence
