"""Inlet's machine-wide cache folder: model data unpacked once, read fast by every later process.

The folder is `$INLET_CACHE_DIR`, else `$XDG_CACHE_HOME/inlet`, else `~/.cache/inlet`. Each entry is a
folder named for what it was made from (a package version and its source file's size and time), written
aside and renamed into place, so a reader sees a whole entry or none. Deleting the folder is always safe.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """The folder Inlet keeps machine-wide caches in."""
    if os.environ.get("INLET_CACHE_DIR"):
        return Path(os.environ["INLET_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inlet"


def source_key(path: Path) -> str:
    """A short key for a source file: its size and modification time (a reinstall or an upgrade changes it)."""
    stat = path.stat()
    return f"{stat.st_size}-{stat.st_mtime_ns}"


def make_entry(folder: Path, write: Callable[[Path], None]) -> Path:
    """Return folder, first filling it with write(tmp) aside and renaming it into place if it is not there yet."""
    done = folder / "done"
    if done.exists():
        return folder
    if folder.exists():  # a removal cut short (drop_entry, a hand clean-up): never complete, so never read
        drop_entry(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        write(tmp)
        (tmp / "done").write_text("")
        try:
            tmp.rename(folder)
        except OSError:  # another process made it first: its entry is as good
            if not done.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def drop_entry(folder: Path) -> None:
    """Remove a damaged entry, so that the next make_entry writes it again."""
    shutil.rmtree(folder, ignore_errors=True)
