"""`inlet mcp`: the knowledge base as Model Context Protocol tools (the official Python SDK's MCPServer).

Four read-only tools: search, get_context, list_sources, versions. Over stdio, and over HTTP without a keys file, the
caller and clearance are the server's, fixed when it starts. Over HTTP with a keys file (the one `inlet api` reads),
every request carries `Authorization: Bearer KEY`, checked through the SDK's token-verifier hook, and is answered at
that key's clearance; a request without a known key gets 401 with `WWW-Authenticate` and no tool runs. No tool takes
a clearance. One resource, KB_URI, says which version is served; a client
listening for it (the protocol's subscriptions/listen) is told within NOTICE_S of a run publishing a new one.
"""

# No `from __future__ import annotations`: the SDK reads the tools' annotations at definition, and k's bound
# is a local.
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, TypeVar

import anyio
from mcp.server import MCPServer
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated
from mcp_types import ToolAnnotations
from pydantic import Field

from query.guard import guarded, who_asks
from query.service import (
    MAX_NEIGHBORS,
    UNKNOWN,
    Caller,
    KnowledgeBase,
    Served,
    callers_of,
    key_digest,
    watch_call,
)
from schemas.answers import ContextAnswer, Filters, SearchAnswer, SourcesAnswer, VersionsAnswer
from schemas.config import ApiKeys
from schemas.errors import InletError

T = TypeVar("T")
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
INSTRUCTIONS = ("Search the documents Inlet keeps fresh. Call search first; cite each answer with the hit's "
                "citation; call get_context for the text around a hit; list_sources and versions say what is "
                "indexed and how fresh it is.")


KB_URI = "inlet://knowledge-base"
NOTICE_S = 0.5  # how often the served version is read for change notices (one small manifest read)


async def follow_versions(kb: KnowledgeBase, bus: InMemorySubscriptionBus, every: float = NOTICE_S) -> None:
    """Publish ResourceUpdated(KB_URI) each time the served version moves (a run published, a rollback)."""
    last = await anyio.to_thread.run_sync(kb.published_version)
    while True:
        await anyio.sleep(every)
        now = await anyio.to_thread.run_sync(kb.published_version)
        if now != last:
            last = now
            await bus.publish(ResourceUpdated(uri=KB_URI))


async def _answer(kb: KnowledgeBase, who: Caller, fn: Callable[..., T], *args: object) -> T:
    """Run an operation for who within serving.timeout_s; Inlet's errors become the tool's error result (the agent
    reads the message)."""
    try:
        return await kb.in_time(who, fn, *args)
    except InletError as exc:
        raise ToolError(str(exc)) from None


class KeyVerifier:
    """The SDK's token-verifier hook over a keys file: a bearer token is known by its sha256 (the file holds no key).

    The token's client id is the key's sha256, so the SDK binds each HTTP session to one key: a request with
    another key cannot use it.
    """

    def __init__(self, keys: ApiKeys) -> None:
        self.callers = callers_of(keys) or {}

    async def verify_token(self, token: str) -> AccessToken | None:
        """The key's access token, or None for a token not in the file (the SDK then answers 401)."""
        digest = key_digest(token)
        return AccessToken(token=token, client_id=digest, scopes=[]) if digest in self.callers else None

    def caller(self, token: AccessToken | None) -> Caller | None:
        """The caller a verified token stands for."""
        return None if token is None else self.callers.get(token.client_id)


def build_server(kb: KnowledgeBase, caller: Caller, keys: ApiKeys | None = None, url: str | None = None) -> MCPServer:
    """An MCPServer whose tools write each call to kb's access log, answering at caller's clearance, or with keys (HTTP
    only: url is where it is served) at the clearance of the request's key."""
    verifier = KeyVerifier(keys) if keys else None
    if verifier is not None and url is None:
        msg = "keys are checked over HTTP only: build_server needs the URL it is served at"
        raise ValueError(msg)

    def current() -> Caller:
        """The caller of the request being answered."""
        if verifier is None:
            return caller
        found = verifier.caller(get_access_token())
        if found is None:  # the SDK refuses a request without a valid key before any tool: never reached
            raise ToolError("a valid API key is needed")
        return found

    async def log_refused_calls(ctx: Any, call_next: Any) -> Any:
        """Write the access-log line of a tool call the SDK refused before it reached an operation."""
        if ctx.method != "tools/call":
            return await call_next(ctx)
        params = ctx.params if isinstance(ctx.params, dict) else {}
        who = current()
        with watch_call() as call:
            try:
                result = await call_next(ctx)
            except Exception as exc:
                if not call["logged"]:
                    kb.log.write(who, str(params.get("name")), json.dumps(params.get("arguments"), sort_keys=True,
                                                                          default=str), Served(), repr(exc))
                raise
        if not call["logged"]:
            shown = result.model_dump() if hasattr(result, "model_dump") else result if isinstance(result, dict) else {}
            error = " ".join(str(c.get("text", "")) for c in shown.get("content") or []) or "refused"
            kb.log.write(who, str(params.get("name")), json.dumps(params.get("arguments"), sort_keys=True,
                                                                  default=str), Served(), error)
        return result

    bus = InMemorySubscriptionBus()

    @asynccontextmanager
    async def notices(_: MCPServer) -> AsyncIterator[dict]:
        async with anyio.create_task_group() as group:
            group.start_soon(follow_versions, kb, bus)
            yield {}
            group.cancel_scope.cancel()

    # Static keys, not OAuth: no authorization server hands them out, so the server names itself as issuer; a client
    # is given its key by the operator (docs/agents.md). validate_token_resource off: a key is not bound to a URL.
    auth = (AuthSettings(issuer_url=url.removesuffix("/mcp"), resource_server_url=url, validate_token_resource=False)
            if verifier is not None else None)
    server = MCPServer("inlet", instructions=INSTRUCTIONS, middleware=[log_refused_calls], subscriptions=bus,
                       lifespan=notices, token_verifier=verifier, auth=auth)
    max_k = kb.cfg.serving.max_k

    @server.tool(annotations=READ_ONLY)
    async def search(
        query: Annotated[str, Field(description="What to look for, in words.", min_length=1)],
        k: Annotated[int, Field(ge=1, le=max_k, description="How many hits.")] = 5,
        filters: Annotated[Filters | None, Field(description="Metadata filters {field: value or [values]}, e.g. "
                                                 "{\"subject\": \"math\", \"grade\": 7} or {\"tags\": [\"a\", "
                                                 "\"b\"]} (any listed tag).")] = None,
        mode: Annotated[Literal["vector", "fulltext", "hybrid"] | None,
                        Field(description="Search mode (default: the store's).")] = None,
        as_of: Annotated[str | None, Field(description="Search the store as it was: a run id, a table version or "
                                           "an ISO time (default: the published version).")] = None,
    ) -> SearchAnswer:
        """Find the chunks that best answer a query, each with its text, score and citation."""
        return await _answer(kb, current(), kb.search, query, k, filters, mode, as_of)

    @server.tool(annotations=READ_ONLY)
    async def get_context(
        chunk_id: Annotated[str, Field(description="A hit's chunk_id.")],
        neighbors: Annotated[int, Field(ge=0, le=MAX_NEIGHBORS, description="Chunks to add before and after.")] = 1,
    ) -> ContextAnswer:
        """Return a chunk with its neighbouring chunks, in document order."""
        return await _answer(kb, current(), kb.get_context, chunk_id, neighbors)

    @server.tool(annotations=READ_ONLY)
    async def list_sources() -> SourcesAnswer:
        """List the indexed sources with their documents and chunks, and when the store was last updated."""
        return await _answer(kb, current(), kb.list_sources)

    @server.tool(annotations=READ_ONLY)
    async def versions() -> VersionsAnswer:
        """List the ingest runs, oldest first, and which one's version is served now."""
        return await _answer(kb, current(), kb.versions)

    @server.resource(KB_URI, name="knowledge-base", mime_type="application/json",
                     description="The version readers are served now; listen to it to hear of each new one.")
    def knowledge_base() -> str:
        """The served chunks-table version and the store, as JSON."""
        return json.dumps({"version": kb.published_version(), "store": str(kb.cfg.store.uri)})

    return server


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (or :PORT, on 127.0.0.1) as a host and a port."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        msg = f"--http expects HOST:PORT, got '{text}'"
        raise ValueError(msg)
    return host or "127.0.0.1", int(port)


def log_refusals(app: Any, kb: KnowledgeBase, default: Caller, callers: dict[str, Caller] | None) -> Any:
    """Wrap an ASGI app so that each request it refuses before any tool is a line in the access log: 401 or 403 (no
    key, an unknown key) and 404 for a session id it does not know for this key (expired, or another key's).

    default: the server's caller without keys; callers: the keys file's callers by key sha256, None without keys."""

    def has_session(scope: Any) -> bool:
        """Whether the request names an MCP session (a 404 to any other request is not about a session)."""
        return any(key.lower() == b"mcp-session-id" for key, _ in scope.get("headers") or ())

    async def logged(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def watching(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] in (401, 403):
                kb.log.write(UNKNOWN, scope.get("path", ""), "", Served(denied=1),
                             f"{message['status']}: no valid API key")
            elif (message["type"] == "http.response.start" and message["status"] == 404
                  and has_session(scope)):
                caller = who_asks(scope, callers)[1] or (default if callers is None else UNKNOWN)
                kb.log.write(caller, scope.get("path", ""), "", Served(denied=1),
                             "404: no such session for this key (expired, or opened with another key)")
            await send(message)

        await app(scope, receive, watching)

    return logged


def serve_http(server: MCPServer, kb: KnowledgeBase, host: str, port: int, caller: Caller,
               keys: ApiKeys | None) -> None:
    """Serve streamable HTTP at http://HOST:PORT/mcp with uvicorn: size and rate limits first, refusals logged."""
    import uvicorn

    app = server.streamable_http_app(host=host)
    callers = callers_of(keys)
    uvicorn.run(guarded(log_refusals(app, kb, caller, callers), kb, caller, callers), host=host, port=port,
                log_level="warning")
