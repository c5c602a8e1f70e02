"""llms-full.txt bundles: many Markdown documents in one file, each becoming its own virtual document.

Two formats occur in the wild:

- path blocks: a `---` line, a line naming the page (`how-tos/use-remote-graph.md`), a `---` line,
  then the page. Bare `---` lines (Markdown rules, YAML) also occur inside pages: only the
  three-line block starts a new one.
- title and source: a `# Title` line directly followed by `Source: <url>`, then the page.

Whichever shape occurs more often is the bundle's format. Text before the first page is ignored.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from tasks.clean import decode_text

_PATH_LINE = re.compile(r"^[^\s]+\.mdx?$")
_SOURCE_LINE = re.compile(r"^Source:\s*(\S+)\s*$")
_TITLE_LINE = re.compile(r"^# +(.+?)\s*$")


@dataclass(frozen=True)
class Member:
    """One page of a bundle: its key (URL or path), title (when the bundle gives one) and Markdown."""

    key: str
    title: str | None
    text: str

    @property
    def digest(self) -> str:
        """sha256 of the page's bytes: its content hash, known without reading anything else."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


class NotABundleError(ValueError):
    """The file holds no llms-full.txt pages (an HTML page saved under the name, say)."""


def _path_block_starts(lines: list[str]) -> list[int]:
    return [i for i in range(len(lines) - 2)
            if lines[i] == "---" and lines[i + 2] == "---" and _PATH_LINE.match(lines[i + 1])]


def _source_starts(lines: list[str]) -> list[int]:
    return [i for i in range(len(lines) - 1) if _TITLE_LINE.match(lines[i]) and _SOURCE_LINE.match(lines[i + 1])]


def _unique(key: str, seen: dict[str, int]) -> str:
    """A page listed twice keeps both copies: the second is key#2."""
    seen[key] = seen.get(key, 0) + 1
    return key if seen[key] == 1 else f"{key}#{seen[key]}"


def parse_bundle(text: str) -> list[Member]:
    """Split a bundle into its pages; raise NotABundleError when it holds none."""
    head = text.lstrip()[:512].lower()
    if head.startswith(("<!doctype html", "<html")):
        msg = "the file is an HTML page, not an llms-full.txt bundle (saved from a browser?)"
        raise NotABundleError(msg)
    lines = text.replace("\r\n", "\n").split("\n")
    blocks, sources = _path_block_starts(lines), _source_starts(lines)
    if not blocks and not sources:
        msg = "no pages found: neither '---/<path>.md/---' blocks nor '# Title' + 'Source: <url>' headers"
        raise NotABundleError(msg)
    seen: dict[str, int] = {}
    members = []
    if len(blocks) >= len(sources):
        for n, start in enumerate(blocks):
            end = blocks[n + 1] if n + 1 < len(blocks) else len(lines)
            body = "\n".join(lines[start + 3 : end]).strip("\n") + "\n"
            members.append(Member(_unique(lines[start + 1], seen), None, body))
        return members
    for n, start in enumerate(sources):
        end = sources[n + 1] if n + 1 < len(sources) else len(lines)
        title = _TITLE_LINE.match(lines[start]).group(1)
        url = _SOURCE_LINE.match(lines[start + 1]).group(1)
        # The heading stays (the chunker's heading path starts there); the Source line is metadata.
        body = "\n".join([lines[start], *lines[start + 2 : end]]).strip("\n") + "\n"
        members.append(Member(_unique(url, seen), title, body))
    return members


def url_matches(key: str, pattern: str) -> bool:
    """A pattern with * or ? is a glob over the whole URL; otherwise a substring (e.g. /oss/python/)."""
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(key, pattern)
    return pattern in key


def keep_member(key: str, keep: tuple[str, ...], drop: tuple[str, ...]) -> bool:
    """Apply the source's URL rules: kept if it matches a keep pattern (or there are none) and no drop pattern."""
    if keep and not any(url_matches(key, p) for p in keep):
        return False
    return not any(url_matches(key, p) for p in drop)


def member_uri(key: str, base_url: str | None, bundle: Path) -> str:
    """A page's URI: its own URL, the base URL joined to its path, or the bundle file with the path as fragment."""
    if re.match(r"^[a-z][a-z0-9+.-]*://", key):
        return key
    if base_url:
        return base_url.rstrip("/") + "/" + key.lstrip("/")
    return f"{bundle.resolve().as_uri()}#{key}"


@functools.lru_cache(maxsize=8)
def _members_of(path: str, mtime_ns: int, size: int) -> dict[str, Member]:
    """Parse a bundle once per version of the file (extraction asks for its pages one at a time)."""

    return {m.key: m for m in parse_bundle(decode_text(Path(path).read_bytes()))}


def member_bytes(path: str, key: str) -> bytes:
    """Return one page's Markdown as bytes; KeyError when the bundle no longer holds it."""
    stat = Path(path).stat()
    return _members_of(path, stat.st_mtime_ns, stat.st_size)[key].text.encode("utf-8")
