"""sources -> listing: every file each configured folder holds, with its size, mtime and metadata."""

from __future__ import annotations

import functools
import hashlib
import json
import mimetypes
import os
import re
import stat as stat_module
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import quote_from_bytes

import pyarrow as pa
import pyarrow.compute as pc
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import ValidationError
from wcmatch import glob as wcglob

from runtime.artifacts import join, write_artifact
from schemas.arrow import LISTING_SCHEMA
from schemas.config import InletConfig, SourceConfig, SourceMetadata
from schemas.errors import ConfigError, ExtractionError
from tasks import web
from tasks.bundle import NotABundleError, keep_member, member_uri, parse_bundle
from tasks.clean import decode_text


def metadata_for(src: SourceConfig, rel: str) -> SourceMetadata:
    """Return a document's source metadata: the source's, with its matching path rules applied in order."""
    update: dict[str, object] = {}
    for rule in src.metadata_rules:
        update |= rule.fields_for(rel) or {}
    if not update:
        return src.metadata
    if isinstance(update.get("tags"), str):
        update["tags"] = [update["tags"]]
    try:
        return SourceMetadata.model_validate({**src.metadata.model_dump(), **update})
    except ValidationError as exc:
        msg = f"source '{src.name}': metadata_rules give {rel} invalid metadata: {exc.errors()[0]['msg']}"
        raise ConfigError(msg) from None


def metadata_fields(src: SourceConfig, rel: str = "") -> dict:
    """Return the metadata columns a source stamps on a document (rules by path applied), with their hash."""
    meta = metadata_for(src, rel)
    fields = {"doc_type": meta.doc_type, "tags": list(meta.tags), "access_level": meta.access_level,
              "language": meta.language, "extra": json.dumps(meta.extra_fields(), sort_keys=True)}
    if meta.expires_at is not None:  # only when set, so that stores from before the field keep their hashes
        fields["expires_at"] = meta.expires_at.isoformat()
    fields["meta_hash"] = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    fields["expires_at"] = meta.expires_at
    return fields


def file_uri(path: str) -> str:
    """Return the file:// URI of an absolute path, as Path.as_uri() writes it (without building a Path)."""
    if not os.path.isabs(path):  # as Path.as_uri(): a relative path has no URI (load_config makes paths absolute)
        msg = f"relative path '{path}' can't be expressed as a file URI"
        raise ValueError(msg)
    return "file://" + quote_from_bytes(os.fsencode(path))


def _suffix(path: str) -> str:
    """Return a file name's suffix as Path.suffix does ('' for '.bashrc' and for 'name.')."""
    suffix = os.path.splitext(path)[1]
    return "" if suffix == "." else suffix


@functools.cache
def _mime(suffix: str) -> str | None:
    return mimetypes.guess_type(f"x{suffix}")[0]


_GLOB_FLAGS = wcglob.GLOBSTAR | wcglob.BRACE  # ** spans folders, {md,txt} alternatives


_ANY_WITH_SUFFIX = re.compile(r"\*\*/\*(\.[A-Za-z0-9_-]+)")  # "**/*.md": the common include pattern


def path_filter(include: tuple[str, ...], exclude: tuple[str, ...]) -> Callable[[str], bool]:
    """Return a test of relative paths: matched by an include pattern and by no exclude pattern.

    Patterns that are all "**/*.<suffix>" with no exclude are tested as what they mean to wcmatch (a
    suffix, case and all, and no hidden folder or file on the way): its matcher cost ~5 us a file, more
    than listing it (tests/test_crawl_safety.py checks both agree).
    """
    suffixes = [m.group(1) for m in map(_ANY_WITH_SUFFIX.fullmatch, include) if m]
    if include and not exclude and len(suffixes) == len(include):
        ends = tuple(suffixes)
        return lambda rel: rel.endswith(ends) and not rel.startswith(".") and "/." not in rel
    wanted = wcglob.compile(include, flags=_GLOB_FLAGS)
    unwanted = wcglob.compile(exclude, flags=_GLOB_FLAGS) if exclude else None
    return lambda rel: bool(wanted.match(rel)) and not (unwanted and unwanted.match(rel))


def _start_points(root: Path, only: list[str] | None) -> list[tuple[str, str, str | None]]:
    """Where a listing starts: (folder, its relative prefix, the one name wanted there or None for all, recursively).

    only (relative paths): a folder is listed whole; a file (or a path now gone) by reading its parent folder
    alone, so that it meets the same checks as in a full listing.
    """
    if only is None:
        return [(str(root), "", None)]
    points = []
    for rel in dict.fromkeys(r.strip("/") for r in only):
        full = os.path.join(str(root), rel)
        if rel and os.path.isdir(full) and not os.path.islink(full):
            points.append((full, f"{rel}/", None))
        elif rel:
            parent, _, name = rel.rpartition("/")
            points.append((os.path.join(str(root), parent) if parent else str(root), f"{parent}/" if parent else "",
                           name))
    return points


def matching_files(root: Path, include: tuple[str, ...], exclude: tuple[str, ...],
                   outside: list[str] | None = None, unnamed: list[str] | None = None,
                   special: list[str] | None = None, only: list[str] | None = None,
                   ) -> list[tuple[str, str, os.stat_result]]:
    """Return (relative posix path, path, stat) of files under root matched by include and not by exclude, sorted.

    Paths are strings, as os.scandir gives them: a pathlib object per file cost more than the listing itself.

    Symlinked folders are not followed; a symlinked file is taken only when it resolves inside root,
    so no link can lead the crawl elsewhere. Links that would are named in outside. A file that
    vanishes while listed (or a dangling link) is left out, and so is one whose path is not valid UTF-8
    (named in unnamed, escaped): no id, URI or Arrow string can hold it. So is anything but a regular file
    (a named pipe, a socket, a device: named in special), whose read would wait forever.
    only: list just these relative paths (files, or folders with all they hold), as live mode does for the
    paths its events named.
    """
    taken = path_filter(include, exclude)
    real_root = root.resolve()
    out = []
    pending = _start_points(root, only)
    # os.scandir: one directory read gives names, kinds and (for plain files) no extra lstat; several
    # times faster than Path.glob, and symlinked folders are not entered.
    while pending:
        folder, prefix, wanted = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            if not prefix and only is None:  # the root itself
                raise
            continue
        for entry in entries:
            if wanted is not None and entry.name != wanted:
                continue
            rel = f"{prefix}{entry.name}"
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append((entry.path, f"{rel}/", None))
                    continue
                if entry.is_symlink() and entry.is_dir():
                    continue  # a symlinked folder: never entered
                if not taken(rel):
                    continue
                if entry.is_symlink() and not Path(entry.path).resolve().is_relative_to(real_root):
                    if outside is not None:
                        outside.append(os.fsencode(rel).decode("utf-8", "backslashreplace"))
                    continue
                stat = entry.stat()  # follows a link (inside root) to its file
            except OSError:
                continue
            if not stat_module.S_ISREG(stat.st_mode):
                if special is not None:
                    special.append(os.fsencode(rel).decode("utf-8", "backslashreplace"))
                continue
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:  # bytes the file system holds but no text does (os gave surrogates)
                if unnamed is not None:
                    unnamed.append(os.fsencode(rel).decode("utf-8", "backslashreplace"))
                continue
            out.append((rel, entry.path, stat))
    return sorted(dict.fromkeys(out), key=lambda item: item[0]) if only is not None else sorted(
        out, key=lambda item: item[0])


@dataclass
class Listed:
    """One source's listing: its rows, or why listing failed, and what was left out on purpose."""

    rows: list[dict] = field(default_factory=list)
    failure: str | None = None
    notices: list[str] = field(default_factory=list)
    table: pa.Table | None = None  # the rows as a listing table already (folder sources)

    def listing(self) -> pa.Table:
        """The rows as a listing table."""
        return self.table if self.table is not None else pa.Table.from_pylist(self.rows, schema=LISTING_SCHEMA)


def list_bundle(src: SourceConfig) -> Listed:
    """List an llms-full.txt bundle's pages, filtered by the source's keep/drop URL rules.

    Each page is a document of its own (doc id and URI from its URL or path) whose content hash is
    known here, so a bundle with one edited page re-processes that page only.
    """
    try:
        stat = src.path.stat()
        members = parse_bundle(decode_text(src.path.read_bytes()))
    except OSError as exc:
        return Listed(failure=f"bundle {src.path} could not be read ({exc.strerror or exc})")
    except (NotABundleError, ExtractionError) as exc:
        return Listed(failure=f"bundle {src.path}: {exc}")
    kept = [m for m in members if keep_member(m.key, src.keep, src.drop)]
    rows = [{"doc_id": f"{src.name}:{m.key}", "source": src.name, "path": str(src.path),
             "uri": member_uri(m.key, src.base_url, src.path), "size": len(m.text.encode("utf-8")),
             "mtime_ns": stat.st_mtime_ns, "mime": "text/markdown", **metadata_fields(src, m.key), "member": m.key,
             "listed_hash": m.digest}
            for m in kept]
    return Listed(rows)


def list_web(src: SourceConfig, known: dict[str, dict], fetched_dir: str, max_bytes: int) -> Listed:
    """Fetch a web source's pages, conditionally where the store knows a validator; bodies land in fetched_dir.

    A 304 lists the page with its stored hash and stat, so detection calls it unchanged without
    reading anything; 404/410 leaves it out (deleted, unless the guard holds); a failure keeps the
    stored version and is reported; a body over the size limit is listed by size and quarantined.
    """
    hosts = src.hosts()
    with web.client(src.timeout_s, src.max_redirects) as http:
        urls = list(src.urls)
        if src.sitemap:
            try:
                urls += web.sitemap_urls(http, src.sitemap, hosts)
            except web.SitemapError as exc:
                return Listed(failure=str(exc))
        urls = [u for u in dict.fromkeys(urls) if keep_member(u, src.keep, src.drop)]
        rows, notices = [], []
        for url in urls:
            doc_id = f"{src.name}:{url}"
            old = known.get(doc_id)
            page = web.fetch(http, url, old["validator"] if old and old["status"] == "ok" else None, hosts,
                             max_bytes, fetched_dir)
            row = {"doc_id": doc_id, "source": src.name, "uri": page.final_url or url, "member": None,
                   **metadata_fields(src, url)}
            if page.status == "fetched":
                rows.append({**row, "path": page.body_path, "size": page.size, "mtime_ns": page.mtime_ns,
                             "mime": page.mime, "validator": page.validator, "listed_hash": page.digest})
            elif page.status == "too_large":
                rows.append({**row, "path": "", "size": page.size, "mtime_ns": 0, "mime": None, "validator": None,
                             "listed_hash": None})
            elif page.status == "not_modified" or (page.status == "failed" and old is not None):
                if page.status == "failed":
                    notices.append(f"source '{src.name}': {url} failed ({page.error}): its last version is kept")
                rows.append({**row, "uri": old["uri"], "path": "", "size": old["size"], "mtime_ns": old["mtime_ns"],
                             "mime": old["mime"], "validator": old["validator"], "listed_hash": old["content_hash"]})
            elif page.status == "failed":
                notices.append(f"source '{src.name}': {url} failed ({page.error}): not indexed")
    return Listed(rows, None, notices)


def _mtime_ns(info: dict) -> int:
    """An object's modification time in ns, from whichever key its filesystem uses."""
    for key in ("LastModified", "mtime", "updated", "last_modified", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return int(value * 1e9)
        if isinstance(value, str):
            value = datetime.fromisoformat(value)  # 3.11 reads a trailing Z
        return int(value.timestamp() * 1e9)
    return 0


def list_objects(src: SourceConfig) -> Listed:
    """List a folder on object storage (fsspec): size, mtime and ETag of every object include/exclude take.

    The ETag is the object's validator: an object whose ETag is the stored one is unchanged without
    being downloaded. Keys with '..' segments are refused: they cannot lead outside the prefix.
    """
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(src.uri, **src.storage_options)
        found = fs.find(root, detail=True)
    except Exception as exc:  # noqa: BLE001 - any listing failure (credentials, network, bucket) is reported
        return Listed(failure=f"{src.uri} could not be listed ({type(exc).__name__}: {exc})"[:500])
    protocol = src.uri.split("://", 1)[0]
    taken = path_filter(src.include, src.exclude)
    prefix = root.rstrip("/") + "/"
    rows, refused = [], []
    for key, info in sorted(found.items()):
        if info.get("type", "file") != "file" or not key.startswith(prefix):
            continue
        rel = key[len(prefix):]
        if ".." in rel.split("/"):
            refused.append(rel)
            continue
        if not taken(rel):
            continue
        etag = info.get("ETag") or info.get("etag") or info.get("md5Hash")
        uri = f"{protocol}://{key}"
        rows.append({"doc_id": f"{src.name}:{rel}", "source": src.name, "path": uri, "uri": uri,
                     "size": int(info.get("size") or 0), "mtime_ns": _mtime_ns(info),
                     "mime": mimetypes.guess_type(rel)[0], "validator": etag, "member": None, "listed_hash": None,
                     **metadata_fields(src, rel)})
    notices = [f"source '{src.name}': {len(refused)} object key(s) with '..' refused: {', '.join(refused[:5])}"
               ] if refused else []
    return Listed(rows, None, notices)


def list_source(src: SourceConfig, known: dict[str, dict] | None = None, fetched_dir: str | None = None,
                max_bytes: int = 100 << 20, only: list[str] | None = None) -> Listed:
    """List one source's documents as listing rows; a source that cannot be listed is a failed listing.

    only (a local folder source): list just these relative paths (live mode's scope, scope_of_paths).
    """
    if src.kind == "bundle":
        return list_bundle(src)
    if src.kind == "web":
        return list_web(src, known or {}, fetched_dir or "fetched", max_bytes)
    if src.uri is not None:
        return list_objects(src)
    if not src.path.is_dir():
        return Listed(failure=f"folder {src.path} does not exist or is not a folder")
    outside: list[str] = []
    unnamed: list[str] = []
    special: list[str] = []
    try:
        files = matching_files(src.path, src.include, src.exclude, outside, unnamed, special, only)
    except OSError as exc:
        return Listed(failure=f"folder {src.path} could not be listed ({exc})")
    notices = []
    if outside:
        notices.append(f"source '{src.name}': {len(outside)} symlinked file(s) lead outside {src.path}, not crawled: "
                       f"{_first(outside)}")
    if unnamed:
        notices.append(f"source '{src.name}': {len(unnamed)} file(s) whose names are not valid UTF-8, not crawled "
                       f"(rename them): {_first(unnamed)}")
    if special:
        notices.append(f"source '{src.name}': {len(special)} entries that are not regular files (named pipes, "
                       f"sockets, devices), not crawled: {_first(special)}")
    return Listed(table=folder_listing(src, files), notices=notices)


def _first(names: list[str]) -> str:
    return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")


_SAFE_IN_URI = re.compile(r"[A-Za-z0-9_.~/-]*").fullmatch  # what quote() leaves as it is


def _uris(files: list[tuple[str, str, os.stat_result]]) -> list[str]:
    """file_uri of every path, quoting each folder prefix once and a relative path only when it needs it."""
    prefixes: dict[str, str] = {}
    uris = []
    for rel, path, _ in files:
        prefix = path[: len(path) - len(rel)]  # the source folder, the same for all: quoting is byte by byte
        head = prefixes.get(prefix) or prefixes.setdefault(prefix, file_uri(prefix))
        uris.append(head + (rel if _SAFE_IN_URI(rel) else quote_from_bytes(os.fsencode(rel))))
    return uris


def folder_listing(src: SourceConfig, files: list[tuple[str, str, os.stat_result]]) -> pa.Table:
    """A folder source's listing rows, built column by column (a dict per file cost more than the listing itself)."""
    n = len(files)
    if src.metadata_rules:
        metas = [metadata_fields(src, rel) for rel, _, _ in files]
        meta = {k: [m[k] for m in metas] for k in (metas[0] if metas else {})}
    else:
        meta = {k: [v] * n for k, v in metadata_fields(src).items()}  # the same for every file: made once
    columns = {"doc_id": [f"{src.name}:{rel}" for rel, _, _ in files], "source": [src.name] * n,
               "path": [path for _, path, _ in files], "uri": _uris(files),
               "size": [stat.st_size for _, _, stat in files], "mtime_ns": [stat.st_mtime_ns for _, _, stat in files],
               "mime": [_mime(_suffix(rel)) for rel, _, _ in files], **meta}
    return pa.Table.from_pydict({f.name: columns.get(f.name, [None] * n) for f in LISTING_SCHEMA},
                                schema=LISTING_SCHEMA)


def scope_of_paths(cfg: InletConfig, paths: list[str] | None) -> dict[str, list[str]]:
    """Map absolute paths (live mode's events) to the local folder sources holding them: source -> relative paths.

    A source no path falls under is not in the map: it is listed whole.
    """
    scope: dict[str, list[str]] = {}
    for src in cfg.sources:
        if src.kind != "folder" or src.path is None:
            continue
        root = str(src.path).rstrip(os.sep) + os.sep
        rels = [p[len(root):].replace(os.sep, "/") for p in paths or [] if p.startswith(root)]
        if rels:
            scope[src.name] = sorted(set(rels))
    return scope


def in_scope(doc_ids: pa.ChunkedArray | pa.Array, source: str, rels: list[str]) -> pa.ChunkedArray | pa.Array:
    """Mask the doc ids of a folder source (source:rel) that a scope's relative paths name or hold."""
    prefix = f"{source}:"
    mask = pc.is_in(doc_ids, value_set=pa.array([prefix + r for r in rels], pa.string()))
    for rel in rels:
        mask = pc.or_(mask, pc.starts_with(doc_ids, prefix + rel + "/"))
    return mask


def crawl_sources(cfg: InletConfig, known: pa.Table | None = None, run_dir: str | Path = ".",
                  scope: dict[str, list[str]] | None = None) -> tuple[pa.Table, dict[str, str], list[str]]:
    """List every configured source; return the listing, the sources whose listing failed (and why), notices.

    known (the documents table) gives web pages their validators; fetched pages are saved under run_dir.
    scope (scope_of_paths): the folder sources listed only at these relative paths.
    """
    # Only web sources read the known rows (their validators): no Python copy of the table otherwise.
    web = known is not None and any(src.kind == "web" for src in cfg.sources)
    by_id = {r["doc_id"]: r for r in known.to_pylist()} if web else {}
    parts: list[pa.Table] = []
    failed: dict[str, str] = {}
    notices: list[str] = []
    max_bytes = int(cfg.extraction.max_file_mb * 1024 * 1024)
    for src in cfg.sources:
        listed = list_source(src, by_id, join(run_dir, "fetched", src.name), max_bytes, (scope or {}).get(src.name))
        parts.append(listed.listing())
        notices.extend(listed.notices)
        if listed.failure:
            failed[src.name] = listed.failure
    parts = [t for t in parts if t.num_rows]
    if len(parts) <= 1:
        return (parts[0] if parts else LISTING_SCHEMA.empty_table()), failed, notices
    return pa.concat_tables(parts).combine_chunks(), failed, notices


@task(name="crawl", cache_policy=NO_CACHE)
def crawl_stage(cfg: InletConfig, run_dir: str, known: pa.Table | None = None,
                scope: dict[str, list[str]] | None = None) -> tuple[str, dict[str, str], list[str]]:
    """List the sources (scoped ones at their paths only) and write the listing artifact; return it, failures, notices."""
    listing, failed, notices = crawl_sources(cfg, known, run_dir, scope)
    logger = get_run_logger()
    logger.info("crawled %d files from %d sources%s", listing.num_rows, len(cfg.sources),
                f" ({sum(len(v) for v in scope.values())} paths named by events)" if scope else "")
    for name, why in failed.items():
        logger.warning("source '%s': listing failed: %s", name, why)
    for notice in notices:
        logger.warning(notice)
    return write_artifact(listing, run_dir, "listing", LISTING_SCHEMA), failed, notices
