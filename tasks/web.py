"""Web source: pages listed by URL or sitemap, fetched with conditional requests.

An unchanged page costs one request answered 304 (its ETag, or Last-Modified, is kept in the
documents table as its validator) and no extraction. Every hop of a redirect must stay on the
allowed hosts; bodies are read up to the size limit and no further; each request has a time-out.
A page that answers 404 or 410 is gone (deleted, unless the mass-deletion guard holds the
source); one that fails otherwise (time-out, 5xx) keeps its last good version for this run.
"""

from __future__ import annotations

import hashlib
import mimetypes
import re
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from runtime.artifacts import write_bytes

USER_AGENT = "Inlet (knowledge-base refresher)"


@dataclass(frozen=True)
class Page:
    """The outcome of fetching one URL."""

    url: str
    status: str  # fetched | not_modified | gone | failed | too_large
    final_url: str | None = None
    body_path: str | None = None
    digest: str | None = None
    size: int = 0
    mtime_ns: int = 0
    validator: str | None = None
    mime: str | None = None
    error: str | None = None


class SitemapError(RuntimeError):
    """The sitemap could not be fetched or read: the source's listing failed."""


def host_of(url: str) -> str:
    """The host of a URL, lower case, with its port if it has one."""
    parts = urlsplit(url)
    return (parts.hostname or "") + (f":{parts.port}" if parts.port else "")


def _allowed(url: str, hosts: frozenset[str]) -> bool:
    return host_of(url) in hosts or (urlsplit(url).hostname or "") in hosts


def client(timeout_s: float, max_redirects: int) -> httpx.Client:
    """An HTTP client that follows at most max_redirects redirects and gives up after timeout_s per request."""
    return httpx.Client(follow_redirects=True, max_redirects=max_redirects, timeout=timeout_s,
                        headers={"User-Agent": USER_AGENT})


def sitemap_urls(http: httpx.Client, url: str, hosts: frozenset[str], depth: int = 2) -> list[str]:
    """Every <loc> of a sitemap (following sitemap indexes `depth` deep) on the allowed hosts, in order."""
    try:
        response = http.get(url)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        msg = f"sitemap {url} could not be fetched ({type(exc).__name__}: {exc})"
        raise SitemapError(msg) from exc
    locs = [loc.strip() for loc in re.findall(r"<loc>\s*([^<]+?)\s*</loc>", response.text)]
    if "<sitemapindex" in response.text[:2048] and depth > 0:
        return [u for loc in locs if _allowed(loc, hosts) for u in sitemap_urls(http, loc, hosts, depth - 1)]
    if not locs and "<urlset" not in response.text[:2048]:
        msg = f"sitemap {url} is not a sitemap (no <urlset>)"
        raise SitemapError(msg)
    return [loc for loc in locs if _allowed(loc, hosts)]


def _suffix(content_type: str | None, url: str) -> str:
    mime = (content_type or "").split(";")[0].strip().lower()
    return mimetypes.guess_extension(mime) or Path(urlsplit(url).path).suffix or ".html"


def _mtime_ns(last_modified: str | None) -> int:
    try:
        return int(parsedate_to_datetime(last_modified).timestamp() * 1e9) if last_modified else 0
    except (TypeError, ValueError):
        return 0


def fetch(http: httpx.Client, url: str, validator: str | None, hosts: frozenset[str], max_bytes: int,
          dest: str) -> Page:
    """Fetch one page, conditionally when a validator is known; save its body under dest (a folder or URI)."""
    headers = {}
    if validator:
        is_etag = validator.startswith(('"', 'W/"'))
        headers["If-None-Match" if is_etag else "If-Modified-Since"] = validator
    try:
        with http.stream("GET", url, headers=headers) as response:
            hops = [*response.history, response]
            off = next((str(h.url) for h in hops if not _allowed(str(h.url), hosts)), None)
            if off is not None:
                return Page(url, "failed", error=f"redirected to {off}, a host outside the allowed ones")
            if response.status_code == 304:
                return Page(url, "not_modified", str(response.url))
            if response.status_code in (404, 410):
                return Page(url, "gone", str(response.url), error=f"HTTP {response.status_code}")
            if response.status_code >= 400:
                return Page(url, "failed", str(response.url), error=f"HTTP {response.status_code}")
            declared = int(response.headers.get("Content-Length") or 0)
            if declared > max_bytes:
                return Page(url, "too_large", str(response.url), size=declared)
            body = bytearray()
            for block in response.iter_bytes():
                body.extend(block)
                if len(body) > max_bytes:  # stop reading: the rest is never downloaded
                    return Page(url, "too_large", str(response.url), size=len(body))
            digest = hashlib.sha256(body).hexdigest()
            name = f"{digest[:32]}{_suffix(response.headers.get('Content-Type'), str(response.url))}"
            path = write_bytes(dest, name, bytes(body))
            return Page(url, "fetched", str(response.url), path, digest, len(body),
                        _mtime_ns(response.headers.get("Last-Modified")),
                        response.headers.get("ETag") or response.headers.get("Last-Modified"),
                        (response.headers.get("Content-Type") or "").split(";")[0].strip() or None)
    except httpx.TooManyRedirects:
        return Page(url, "failed", error="too many redirects")
    except httpx.HTTPError as exc:
        return Page(url, "failed", error=f"{type(exc).__name__}: {exc}")
