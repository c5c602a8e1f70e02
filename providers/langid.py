"""py3langid's shipped model, decompressed once per machine into a cache folder and memory-mapped from there.

py3langid ships its model LZMA-compressed; its loader (`modelio.load_model`) decompresses it on every
process start, ~0.35-0.45 s, more than the rest of extracting a small incremental run. The arrays it
returns are written once, uncompressed, to `<cache>/py3langid-<version>-<model sha256>/`, and every
later process builds the identifier with py3langid's public constructor from them (~0.04 s). The
big score table is memory-mapped, so worker processes share its pages.

The cache folder is `$INLET_CACHE_DIR`, else `$XDG_CACHE_HOME/inlet`, else `~/.cache/inlet`. The
folder name carries py3langid's version and the model file's sha256, so an upgrade or another model
makes a new entry. A cache that cannot be written or read is reported in the log and the model is
loaded from the package as py3langid does: the answers are the same either way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from array import array
from importlib.metadata import version
from pathlib import Path

import numpy as np
from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier
from py3langid.modelio import load_model

log = logging.getLogger(__name__)
_FORMAT = 1  # bump when the files written here change


def cache_root() -> Path:
    """The folder Inlet keeps machine-wide caches in (INLET_CACHE_DIR, else XDG_CACHE_HOME/inlet, else ~/.cache/inlet)."""
    if os.environ.get("INLET_CACHE_DIR"):
        return Path(os.environ["INLET_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inlet"


def model_path() -> Path:
    """py3langid's shipped model file."""
    return Path(MODEL_DIR) / MODEL_FILE


def cache_folder(model: Path) -> Path:
    """The cache entry for this py3langid version and model file."""
    digest = hashlib.sha256(model.read_bytes()).hexdigest()[:16]
    return cache_root() / f"py3langid-{version('py3langid')}-{digest}-v{_FORMAT}"


def _write(folder: Path, model: Path) -> None:
    """Decompress the model with py3langid's loader and write its arrays beside a manifest, atomically."""
    ptc, pc, classes, nextmove, row, out_feat = load_model(model)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        np.save(tmp / "ptc.npy", np.ascontiguousarray(ptc))
        np.save(tmp / "pc.npy", np.asarray(pc))
        (tmp / "nextmove.bin").write_bytes(nextmove.tobytes())
        (tmp / "row.bin").write_bytes(row.tobytes())
        np.save(tmp / "out_feat.npy", np.asarray(out_feat, dtype=np.int32))
        manifest = {"classes": list(classes), "nextmove": nextmove.typecode, "row": row.typecode}
        (tmp / "manifest.json").write_text(json.dumps(manifest))
        try:
            tmp.rename(folder)  # another process may have won the race: its entry is as good
        except OSError:
            if not (folder / "manifest.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read(folder: Path) -> LanguageIdentifier:
    """Build the identifier from a cache entry with py3langid's constructor."""
    manifest = json.loads((folder / "manifest.json").read_text())
    nextmove = array(manifest["nextmove"])
    nextmove.frombytes((folder / "nextmove.bin").read_bytes())
    row = array(manifest["row"])
    row.frombytes((folder / "row.bin").read_bytes())
    return LanguageIdentifier(
        np.load(folder / "ptc.npy", mmap_mode="r"), np.load(folder / "pc.npy"), manifest["classes"], nextmove,
        np.load(folder / "out_feat.npy").tolist(), norm_probs=True, tk_row=row)


def load_identifier() -> LanguageIdentifier:
    """py3langid's shipped model with normalised probabilities, from the cache (made on first use)."""
    model = model_path()
    try:
        folder = cache_folder(model)
        if not (folder / "manifest.json").exists():
            _write(folder, model)
        try:
            return _read(folder)
        except (OSError, ValueError, KeyError) as exc:  # a damaged entry (a full disk, a hand edit): made again
            log.warning("language model cache %s damaged (%s: %s); writing it again", folder, type(exc).__name__, exc)
            shutil.rmtree(folder, ignore_errors=True)
            _write(folder, model)
            return _read(folder)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("language model cache unusable (%s: %s); loading py3langid's compressed model", type(exc).__name__, exc)
        return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


_LOADING = threading.Lock()
_IDENTIFIER: list[LanguageIdentifier] = []  # one per process, made on first use


def language_identifier() -> LanguageIdentifier:
    """The process's identifier, loaded once whichever thread asks first."""
    with _LOADING:
        if not _IDENTIFIER:
            _IDENTIFIER.append(load_identifier())
        return _IDENTIFIER[0]
