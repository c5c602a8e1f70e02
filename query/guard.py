"""What `inlet api` and `inlet mcp --http` refuse before any read: a body too large or too slow, a caller too eager.

One ASGI wrapper in front of both servers, so that both refuse alike: a request body over
serving.max_body_bytes gets 413, one not received within serving.timeout_s 408; a caller over serving.rate_limit
(per API key, or per client address on a server without keys) gets 429 with Retry-After. Each refusal is a line
in the access log. (An answer that takes longer than serving.timeout_s is the operations' own limit:
KnowledgeBase.in_time.) The counting is the
`limits` library's moving window (the library slowapi is built on), in this process's memory: a server
restart forgets it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio
from limits import parse
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from query.service import UNKNOWN, Caller, KnowledgeBase, Served, key_digest

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
WITH_BODY = ("POST", "PUT", "PATCH")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def who_asks(scope: Scope, callers: dict[str, Caller] | None) -> tuple[str, Caller | None]:
    """The rate-limit key of a request (its bearer key's sha256, else its client address) and its known caller."""
    auth = _header(scope, b"authorization") or ""
    if auth.lower().startswith("bearer "):
        digest = key_digest(auth[7:])
        return f"key:{digest}", (callers or {}).get(digest)
    client = scope.get("client") or ("?", 0)
    return f"addr:{client[0]}", None


async def _refuse(send: Send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": message}).encode()
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *extra]})
    await send({"type": "http.response.body", "body": body})


def guarded(app: App, kb: KnowledgeBase, default: Caller, callers: dict[str, Caller] | None) -> App:
    """Wrap a server's ASGI app with the body-size and rate limits of kb's serving config.

    default: the caller a server without keys answers as (the access log's name for its requests); callers: the
    keys file's callers by key sha256, None without keys.
    """
    serving = kb.cfg.serving
    limiter = MovingWindowRateLimiter(MemoryStorage())
    item = parse(serving.rate_limit) if serving.rate_limit else None

    async def guard(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        key, known = who_asks(scope, callers)
        caller = known or (default if callers is None else UNKNOWN)
        path = scope.get("path", "")
        if item is not None and not limiter.hit(item, key):
            reset = limiter.get_window_stats(item, key).reset_time
            wait = max(1, math.ceil(reset - time.time()))
            kb.log.write(caller, path, "", Served(), f"429: over serving.rate_limit ({serving.rate_limit})")
            await _refuse(send, 429, f"too many requests: at most {serving.rate_limit} per caller; retry in {wait} s",
                          {"Retry-After": str(wait)})
            return
        if scope.get("method") not in WITH_BODY:
            await app(scope, receive, send)
            return
        # The body is read whole here (up to the limit) and handed on: a refusal needs no help from the app.
        declared = _header(scope, b"content-length")
        body, gone, late = None, None, False
        if not (declared and declared.isdigit() and int(declared) > serving.max_body_bytes):
            late = True
            with anyio.move_on_after(serving.timeout_s):  # a client that trickles its body holds a connection
                body, gone = await _whole_body(receive, serving.max_body_bytes)
                late = False
        if late:
            kb.log.write(caller, path, "", Served(), f"408: body not received within serving.timeout_s "
                         f"({serving.timeout_s:g} s)")
            await _refuse(send, 408, f"request body not received within {serving.timeout_s:g} s (serving.timeout_s)",
                          {"Connection": "close"})
        elif gone is not None:  # the client went away: the app sees it as it would have
            await app(scope, _replay([gone]), send)
        elif body is None:
            kb.log.write(caller, path, "", Served(), f"413: body over serving.max_body_bytes ({serving.max_body_bytes})")
            await _refuse(send, 413, f"request body too large: at most {serving.max_body_bytes} bytes "
                          "(serving.max_body_bytes)")
        else:
            await app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive), send)

    return guard


async def _whole_body(receive: Receive, limit: int) -> tuple[bytes | None, Message | None]:
    """Read a request's body: (body, None); (None, None) once it passes limit bytes; (None, message) if the client left."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None, message
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return None, None
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A receive that gives these messages first, then defers to then (a disconnect once they are spent)."""
    queue = list(messages)

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive
