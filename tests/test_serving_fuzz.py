"""Hostile input, found by machines: requests generated from `inlet api`'s OpenAPI schema (schemathesis) and tool
arguments generated from `inlet mcp`'s input schemas (schemathesis too, the schemas put in an OpenAPI document),
plus hand-picked hostile values, on a store the ingest flow built. No 5xx, no traceback in an answer, every refusal a 4xx (or a tool error) with a reason.
Fixed seeds (derandomize) and bounded example counts keep the run short and the same every time."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
import schemathesis
import yaml
from anyio.from_thread import start_blocking_portal
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from mcp import Client

from flows.ingest import ingest
from query.guard import guarded
from query.http_api import build_app
from query.mcp_server import build_server
from query.service import Caller, callers_of, open_knowledge_base
from schemas.config import load_api_keys, load_config

pytestmark = [pytest.mark.flow]
ROOT = Path(__file__).resolve().parent.parent
KEY = "fuzz-key-0001"
FUZZ = settings(max_examples=25, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
HOSTILE = ["' OR 1=1 --", "x'); DROP TABLE chunks; --", "\x00", "a\x00b", "\"", "\\", "%", "_", "*",
           "9" * 400, "-1", "1e309", "NaN", "access_level = 'confidential'", "🚤" * 50]


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory: pytest.TempPathFactory, prefect_harness: None) -> Path:
    """data/sample, a confidential note and a keys file, ingested by the flow; no rate limit (the fuzzer is fast)."""
    root = tmp_path_factory.mktemp("fuzz")
    corpus = root / "corpus"
    shutil.copytree(ROOT / "data" / "sample", corpus)
    (corpus / "vault.md").write_text("---\naccess_level: confidential\n---\n# Vault\n\nThe vault code is 4711.\n",
                                     encoding="utf-8")
    keys = {"keys": [{"caller": "fuzzer", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "clearance": "public"}]}
    (root / "keys.yaml").write_text(yaml.safe_dump(keys), encoding="utf-8")
    config = {"sources": [{"name": "docs", "path": str(corpus)}], "embedding": {"kind": "hashing", "dim": 64},
              "store": {"uri": str(root / "store" / "lancedb"), "artifacts": str(root / "store" / "runs")},
              "serving": {"api_keys": "keys.yaml", "rate_limit": None}}
    path = root / "inlet.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    ingest(config_path=str(path))
    return path


def _kb(config: Path):  # noqa: ANN202 - a KnowledgeBase
    return open_knowledge_base(load_config(config), config.parent / "access.jsonl")


@pytest.fixture(scope="module")
def api_app(fuzz_store: Path):  # noqa: ANN201 - an ASGI app
    kb = _kb(fuzz_store)
    keys = load_api_keys(fuzz_store.parent / "keys.yaml")
    who = Caller("app", "public")
    return guarded(build_app(kb, who, keys), kb, who, callers_of(keys))


def _no_leak(status: int, text: str) -> None:
    assert status < 500, text
    assert "Traceback" not in text and "File \"/" not in text, text
    assert "4711" not in text, "nothing above the key's clearance"


@pytest.mark.parametrize("path", ["/search", "/context/{chunk_id}", "/sources", "/versions"])
def test_the_http_api_answers_whatever_its_schema_generates_without_a_server_error(api_app, path):
    # schemathesis' strategies for each operation of the app's own OpenAPI document, run by Hypothesis here
    # (its pytest loader for fixtures needs a pytest private attribute that pytest 9 no longer has).
    schema = schemathesis.openapi.from_asgi("/openapi.json", api_app)
    operations = [r.ok() for r in schema.get_all_operations() if r.ok().path == path]
    assert operations, f"{path} is in the OpenAPI document"
    for operation in operations:
        @FUZZ
        @given(case=operation.as_strategy())
        def call(case) -> None:  # noqa: ANN001 - a schemathesis Case
            response = case.call(headers={"Authorization": f"Bearer {KEY}"})
            _no_leak(response.status_code, response.text)
            if response.status_code >= 400:
                assert response.json().get("detail"), "a refusal says why"

        call()


def test_hostile_values_in_every_http_field_are_refused_or_answered_never_a_server_error(api_app):
    client = TestClient(api_app)
    auth = {"Authorization": f"Bearer {KEY}"}
    bodies = [{"query": v} for v in HOSTILE] + [{"query": "boat", "filters": {v: v}} for v in HOSTILE]
    bodies += [{"query": "boat", "filters": {"tags": [v, v]}} for v in HOSTILE]
    bodies += [{"query": "boat", "k": v} for v in (0, -1, 10**30, 1.5, "5", None)]
    bodies += [{"query": "boat", "as_of": v} for v in HOSTILE]
    bodies += [{"query": "boat", "mode": v} for v in HOSTILE]
    deep: object = "x"
    for _ in range(200):
        deep = {"a": deep}
    bodies += [{"query": "boat", "filters": {"f": deep}}, {"query": "boat", "clearance": "confidential"}]
    for body in bodies:
        answer = client.post("/search", json=body, headers=auth)
        _no_leak(answer.status_code, answer.text)
    for raw in (b"\xff\xfe{\"query\": \"boat\"}", b"{\"query\": \"bo\xc3\x28at\"}", b"[" * 5000, b"{", b"",
                b"{\"query\": \"\\ud800 lone surrogate\"}"):
        answer = client.post("/search", content=raw, headers={**auth, "Content-Type": "application/json"})
        _no_leak(answer.status_code, answer.text)
        assert 400 <= answer.status_code < 500
    for v in HOSTILE:
        answer = client.get("/context/" + quote(v, safe=""), params={"neighbors": 1}, headers=auth)
        _no_leak(answer.status_code, answer.text)
    assert client.get("/context/x", params={"neighbors": 10**20}, headers=auth).status_code == 422


@pytest.fixture(scope="module")
def mcp_session(fuzz_store: Path):  # noqa: ANN201 - (portal, client): the SDK's client on the server, in process
    server = build_server(_kb(fuzz_store), Caller("agent", "public"))
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(Client(server)) as client:
        tools = portal.call(client.list_tools).tools
        yield portal, client, {tool.name: tool.input_schema for tool in tools}


def _call(mcp_session, name: str, args: dict) -> None:  # noqa: ANN001 - the fixture's tuple
    portal, client, _ = mcp_session
    result = portal.call(client.call_tool, name, args)
    text = json.dumps(result.model_dump(mode="json"), ensure_ascii=False)
    _no_leak(200, text)
    if result.is_error:
        assert result.content and result.content[0].text.strip(), "a refusal says why"


def _tool_document(schemas: dict[str, dict]) -> dict:
    """The MCP tools' input schemas as an OpenAPI document (one POST per tool), so that schemathesis generates them."""
    return {"openapi": "3.1.0", "info": {"title": "inlet mcp tools", "version": "1"},
            "paths": {f"/{name}": {"post": {"requestBody": {"required": True, "content": {
                "application/json": {"schema": schema}}}, "responses": {"200": {"description": "the tool's answer"}}}}
                      for name, schema in schemas.items()}}


@pytest.mark.parametrize("tool", ["search", "get_context", "list_sources", "versions"])
def test_each_mcp_tool_answers_whatever_its_input_schema_generates(mcp_session, tool):
    # schemathesis generates the bodies (its JSON Schema strategies); they go to the tool through the SDK's client.
    schema = schemathesis.openapi.from_dict(_tool_document({tool: mcp_session[2][tool]}))
    operation = next(r.ok() for r in schema.get_all_operations())

    @FUZZ
    @given(case=operation.as_strategy())
    def call(case) -> None:  # noqa: ANN001 - a schemathesis Case
        _call(mcp_session, tool, case.body if isinstance(case.body, dict) else {})

    call()


def test_hostile_values_in_every_mcp_argument_are_refused_or_answered(mcp_session):
    for v in HOSTILE:
        for args in ({"query": v}, {"query": "boat", "filters": {v: v}}, {"query": "boat", "filters": {"tags": [v]}},
                     {"query": "boat", "as_of": v}, {"query": "boat", "mode": v}, {"query": "boat", "k": v}):
            _call(mcp_session, "search", args)
        _call(mcp_session, "get_context", {"chunk_id": v, "neighbors": 2})
    _call(mcp_session, "search", {"query": "boat", "k": 10**30})
    _call(mcp_session, "get_context", {"chunk_id": "x", "neighbors": -(10**30)})
