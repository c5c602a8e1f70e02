"""A small local web site for the web source's tests: ETags, Last-Modified, 304s, redirects, a sitemap, a log."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Site:
    """Pages by path (bytes), redirects by path, slow paths, and every request seen (method, path, status)."""

    pages: dict[str, bytes] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)
    slow: dict[str, float] = field(default_factory=dict)
    log: list[tuple[str, str, int]] = field(default_factory=list)
    base: str = ""

    def statuses(self, path: str) -> list[int]:
        """Statuses served for one path, in order."""
        return [status for _, p, status in self.log if p == path]


def _handler(site: Site) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: object) -> None:  # quiet
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            site.log.append((self.command, self.path, status))
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path in site.slow:
                time.sleep(site.slow[self.path])
            if self.path in site.redirects:
                self._send(302, headers={"Location": site.redirects[self.path]})
                return
            body = site.pages.get(self.path)
            if body is None:
                self._send(404, b"not found")
                return
            etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
            if self.headers.get("If-None-Match") == etag:
                self._send(304, headers={"ETag": etag})
                return
            kind = "application/xml" if self.path.endswith(".xml") else "text/html; charset=utf-8"
            self._send(200, body, {"ETag": etag, "Content-Type": kind,
                                   "Last-Modified": formatdate(1_700_000_000, usegmt=True)})

    return Handler


@contextmanager
def serve(site: Site) -> Iterator[Site]:
    """Serve the site on 127.0.0.1 in a thread; site.base is its root URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(site))
    site.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()
