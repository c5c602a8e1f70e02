"""sources -> listing: every file each configured folder holds, with its size, mtime and metadata."""

from __future__ import annotations

import hashlib
import json
import mimetypes
import os
from pathlib import Path

import pyarrow as pa
from prefect import get_run_logger
from wcmatch import glob as wcglob

from schemas.arrow import LISTING_SCHEMA
from schemas.config import InletConfig, SourceConfig
from schemas.errors import ConfigError
from tasks.artifacts import write_artifact
from tasks.stage import stage


def metadata_fields(src: SourceConfig) -> dict:
    """Return the metadata columns a source stamps on its documents, with their hash."""
    meta = src.metadata
    fields = {"doc_type": meta.doc_type, "tags": list(meta.tags), "access_level": meta.access_level,
              "language": meta.language, "extra": json.dumps(meta.extra_fields(), sort_keys=True)}
    if meta.expires_at is not None:  # only when set, so that stores from before the field keep their hashes
        fields["expires_at"] = meta.expires_at.isoformat()
    fields["meta_hash"] = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    fields["expires_at"] = meta.expires_at
    return fields


_GLOB_FLAGS = wcglob.GLOBSTAR | wcglob.BRACE  # ** spans folders, {md,txt} alternatives


def matching_files(root: Path, include: tuple[str, ...], exclude: tuple[str, ...]) -> list[tuple[str, Path]]:
    """Return (relative posix path, path) of files under root matched by include and not by exclude, sorted."""
    wanted = wcglob.compile(include, flags=_GLOB_FLAGS)
    unwanted = wcglob.compile(exclude, flags=_GLOB_FLAGS) if exclude else None
    out = []
    # os.walk does not follow symlinked folders, and is several times faster than Path.glob here.
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        prefix = base.relative_to(root).as_posix()
        for name in filenames:
            rel = name if prefix == "." else f"{prefix}/{name}"
            if wanted.match(rel) and not (unwanted and unwanted.match(rel)):
                out.append((rel, base / name))
    return sorted(out)


def list_source(src: SourceConfig) -> list[dict]:
    """List one source's files as listing rows."""
    if not src.path.is_dir():
        msg = f"source '{src.name}': path {src.path} is not a folder"
        raise ConfigError(msg)
    meta = metadata_fields(src)
    rows = []
    for rel, path in matching_files(src.path, src.include, src.exclude):
        try:
            stat = path.stat()
        except OSError:  # a dangling symlink or a file removed while listing: not a document now
            continue
        rows.append({"doc_id": f"{src.name}:{rel}", "source": src.name, "path": str(path),
                     "uri": path.as_uri(), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                     "mime": mimetypes.guess_type(path.name)[0], **meta})
    return rows


def crawl_sources(cfg: InletConfig) -> pa.Table:
    """List every configured source."""
    rows = [row for src in cfg.sources for row in list_source(src)]
    return pa.Table.from_pylist(rows, schema=LISTING_SCHEMA)


@stage("crawl")
def crawl_stage(cfg: InletConfig, run_dir: str) -> str:
    """List the sources and write the listing artifact."""
    listing = crawl_sources(cfg)
    get_run_logger().info("crawled %d files from %d sources", listing.num_rows, len(cfg.sources))
    return write_artifact(listing, run_dir, "listing", LISTING_SCHEMA)
