"""py3langid's shipped model, unpacked once per machine into Inlet's cache folder (providers/cache.py).

py3langid ships its model LZMA-compressed; its loader (`modelio.load_model`) decompresses it on every
process start, ~0.35-0.45 s, more than the rest of extracting a small incremental run. The arrays it
returns are written once, uncompressed, to `<cache>/py3langid-<version>-<model file key>/`, and every
later process builds the identifier with py3langid's public constructor from them, memory-mapped (the
score table as a NumPy array, the automaton's transitions as integer views, indexed as py3langid
indexes its own arrays), so a process reads only the pages it uses and worker processes share them. A cache that cannot be written or read is
reported in the log and the packaged model is loaded as py3langid does: the answers are the same.
"""

from __future__ import annotations

import json
import logging
import mmap
import threading
from importlib.metadata import version
from pathlib import Path

import numpy as np
from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier
from py3langid.modelio import load_model

from providers.cache import cache_root, drop_entry, make_entry, source_key

log = logging.getLogger(__name__)
_FORMAT = 2  # bump when the files written here change


def model_path() -> Path:
    """py3langid's shipped model file."""
    return Path(MODEL_DIR) / MODEL_FILE


def cache_folder(model: Path) -> Path:
    """The cache entry for this py3langid version and model file."""
    return cache_root() / f"py3langid-{version('py3langid')}-{source_key(model)}-v{_FORMAT}"


def _writer(model: Path):  # noqa: ANN202 - a closure for make_entry
    def write(tmp: Path) -> None:
        ptc, pc, classes, nextmove, row, out_feat = load_model(model)
        np.save(tmp / "ptc.npy", np.ascontiguousarray(ptc))
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
