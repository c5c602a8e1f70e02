"""`inlet api`: the knowledge base's operations as a small HTTP JSON API (FastAPI), with an OpenAPI page at /docs.

With a keys file, each request carries `Authorization: Bearer KEY` and is answered at that key's clearance; a
request without a known key gets 401 and nothing else. Without one, every request is the server's caller.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations, and Who is a local.
import json
from collections.abc import Callable
from typing import Annotated, Literal, TypeVar

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from query.service import MAX_NEIGHBORS, UNKNOWN, Caller, KnowledgeBase, Served, callers_of, key_digest
from schemas.answers import ContextAnswer, Filters, SearchAnswer, SourcesAnswer, VersionsAnswer
from schemas.config import ApiKeys
from schemas.errors import AnswerTimeoutError, InletError, NotAvailableError, QueryError

T = TypeVar("T")
RETRY_AFTER_S = 5  # after a 503 for serving.timeout_s: long enough for a busy moment to pass


class SearchRequest(BaseModel):
    """A search: the query and how to narrow it. The clearance is the caller's, never the request's."""

    model_config = {"extra": "forbid"}

    query: str = Field(min_length=1, description="What to look for, in words.")
    k: int = Field(5, ge=1, description="How many hits (at most serving.max_k).")
    filters: Filters | None = Field(None, description="Metadata filters {field: value or [values]}.")
    mode: Literal["vector", "fulltext", "hybrid"] | None = Field(None, description="Default: the store's.")
    as_of: str | None = Field(None, description="A run id, table version or ISO time (default: the published "
                              "version).")


def build_app(kb: KnowledgeBase, default: Caller, keys: ApiKeys | None = None) -> FastAPI:
    """The API over kb: callers by API key when keys are given, else every request is default."""
    by_hash = callers_of(keys) or {}
    bearer = HTTPBearer(auto_error=False, description="An API key from the server's keys file."
                        if keys else "Not needed: this server has no keys file.")
    app = FastAPI(title="Inlet knowledge base", version="1",
                  description="Search the documents Inlet keeps fresh, with citations, at the caller's clearance.")

    def caller_of(credentials: HTTPAuthorizationCredentials | None) -> Caller | None:
        if not keys:
            return default
        if credentials is None:
            return None
        return by_hash.get(key_digest(credentials.credentials))

    async def caller(request: Request,
                     credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Caller:
        found = caller_of(credentials)
        if found is None:
            served = Served(denied=1)
            kb.log.write(UNKNOWN, request.url.path, "", served, "401: no valid API key")
            raise HTTPException(401, "a valid API key is needed: Authorization: Bearer KEY",
                                headers={"WWW-Authenticate": "Bearer"})
        return found

    Who = Annotated[Caller, Depends(caller)]

    @app.exception_handler(RequestValidationError)
    async def refused(request: Request, exc: RequestValidationError) -> Response:
        """Log a request its schema refused (one line per call), then answer 422 as FastAPI would.

        The body is ASCII-escaped JSON: the errors echo the input, which may hold a lone surrogate (a JSON string
        can; UTF-8 cannot), and JSONResponse's UTF-8 rendering failed on it (a 500, found by tests/test_serving_fuzz.py).
        """
        credentials = await bearer(request)
        who = caller_of(credentials) or UNKNOWN
        errors = json.dumps(exc.errors(), default=str)
        kb.log.write(who, request.url.path, errors, Served(), "422: invalid request")
        return Response(f'{{"detail": {errors}}}', status_code=422, media_type="application/json")

    async def answer(who: Caller, fn: Callable[..., T], *args: object) -> T:
        """Run an operation for who within serving.timeout_s, Inlet's errors as HTTP statuses."""
        try:
            return await kb.in_time(who, fn, *args)
        except AnswerTimeoutError as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except NotAvailableError as exc:
            raise HTTPException(404, str(exc)) from None
        except QueryError as exc:
            raise HTTPException(400, str(exc)) from None
        except InletError as exc:  # the store cannot answer now (none ingested yet, a version unreadable)
            raise HTTPException(503, str(exc)) from None

    @app.post("/search", response_model=SearchAnswer, summary="The chunks that best answer a query, with citations")
    async def search(body: SearchRequest, who: Who) -> SearchAnswer:
        return await answer(who, kb.search, body.query, body.k, body.filters, body.mode, body.as_of)

    @app.get("/context/{chunk_id}", response_model=ContextAnswer, summary="A chunk with its neighbours, in order")
    async def get_context(chunk_id: str, who: Who,
                          neighbors: Annotated[int, Query(ge=0, le=MAX_NEIGHBORS)] = 1) -> ContextAnswer:
        return await answer(who, kb.get_context, chunk_id, neighbors)

    @app.get("/sources", response_model=SourcesAnswer, summary="What is indexed, and how fresh it is")
    async def list_sources(who: Who) -> SourcesAnswer:
        return await answer(who, kb.list_sources)

    @app.get("/versions", response_model=VersionsAnswer, summary="The ingest runs, and which one is served")
    async def versions(who: Who) -> VersionsAnswer:
        return await answer(who, kb.versions)

    return app
