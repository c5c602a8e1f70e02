"""`inlet mcp` and `inlet api`: the real MCP client over stdio and HTTP, httpx against the HTTP API, on a store the
real ingest flow built: typed tools, cited hits equal to query.search's, a clearance no argument can raise, one
access-log line per call, and a run published while the server runs seen by the next call."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import httpx2
import lancedb
import pytest
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ResourceUpdated

from flows.ingest import ingest
from query import search
from query.mcp_server import KB_URI
from schemas.config import ACCESS_LEVELS, load_api_keys, load_config
from schemas.errors import ConfigError

pytestmark = [pytest.mark.flow]
ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "sample"
MODES = ("vector", "fulltext", "hybrid")
SECRET = "The harbour vault combination is kept by the treasurer and changes every spring equinox."
STAFF = "Instructors log every capsize drill in the staff binder before the boathouse closes on Sundays."
OLD = "The autumn fuel discount for members ended when the harbour pumps were replaced last year."
FRACTIONS = "Grade seven fractions: to add two fractions, rewrite both over a common denominator first."
KEY_PUBLIC, KEY_INTERNAL = "key-for-the-public-bot-0001", "key-for-the-staff-bot-0002"


def _note(body: str, **front: object) -> str:
    lines = [f"{k}: {v}" for k, v in front.items()]
    return ("---\n" + "\n".join(lines) + "\n---\n" if lines else "") + f"# Note\n\n{body}\n"


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory, prefect_harness: None) -> Path:
    """A store built by the ingest flow: the sample corpus, plus internal, confidential, expired and maths notes."""
    root = tmp_path_factory.mktemp("agents")
    corpus = root / "corpus"
    shutil.copytree(SAMPLE, corpus)
    (corpus / "vault.md").write_text(_note(SECRET, access_level="confidential"), encoding="utf-8")
    (corpus / "staff.md").write_text(_note(STAFF, access_level="internal"), encoding="utf-8")
    (corpus / "fuel.md").write_text(_note(OLD, expires_at="2020-01-01"), encoding="utf-8")
    (corpus / "maths").mkdir()
    (corpus / "maths" / "fractions.md").write_text(_note(FRACTIONS), encoding="utf-8")
    keys = {"keys": [{"caller": "public-bot", "sha256": hashlib.sha256(KEY_PUBLIC.encode()).hexdigest(),
                      "clearance": "public"},
                     {"caller": "staff-bot", "sha256": hashlib.sha256(KEY_INTERNAL.encode()).hexdigest(),
                      "clearance": "internal"}]}
    (root / "keys.yaml").write_text(yaml.safe_dump(keys), encoding="utf-8")
    config = {"sources": [{"name": "club", "path": str(corpus),
                           "metadata_rules": [{"path": "^maths/", "set": {"subject": "math", "grade": 7}}]}],
              "embedding": {"kind": "hashing", "dim": 64},
              "store": {"uri": str(root / "store" / "lancedb"), "artifacts": str(root / "store" / "runs")},
              "serving": {"api_keys": "keys.yaml"}}
    path = root / "inlet.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    ingest(config_path=str(path))
    return path


def _log(config: Path) -> list[dict]:
    log = load_config(config).serving.access_log
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serving(*args: str, ready: str, printed: list[str] | None = None) -> Iterator[subprocess.Popen]:
    """Run `inlet ARGS` until the block ends, once GET ready answers (any status); what it printed goes to printed."""
    err = tempfile.TemporaryFile(mode="w+")  # not a pipe: a server logging every request would fill it and stall
    proc = subprocess.Popen([sys.executable, "-m", "inlet.cli", *args], env=_env(), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(ready, timeout=2)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err.seek(0)
                    pytest.fail(f"inlet {args[0]} did not start: {err.read()}")
                time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if printed is not None:
            err.seek(0)
            printed.append(err.read())
        err.close()


def _hits(result) -> list[dict]:  # noqa: ANN001 - a CallToolResult
    assert not result.is_error, result.content
    return result.structured_content["hits"]


def _same_as_query_search(hits: list[dict], config: Path, text: str, clearance: str, **kw: object) -> None:
    expected = search(text, config=config, clearance=clearance, **kw)
    assert [(h["chunk_id"], h["text"], h["score"]) for h in hits] == [(r.chunk_id, r.text, r.score) for r in expected]
    assert [h["citation"]["text"] for h in hits] == [str(r.citation) for r in expected]


def test_mcp_over_stdio_lists_typed_tools_and_serves_cited_hits_equal_to_query_search(kb):
    before = len(_log(kb))
    params = StdioServerParameters(command=sys.executable, args=["-m", "inlet.cli", "mcp", "--config", str(kb)],
                                   env=_env(), cwd=str(ROOT))

    async def session() -> None:
        async with Client(params) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == {"search", "get_context", "list_sources", "versions"}
            assert set(tools["search"].input_schema["properties"]) == {"query", "k", "filters", "mode", "as_of"}
            assert all("clearance" not in json.dumps(t.input_schema) for t in tools.values()), "no tool takes one"
            assert all(t.description and t.output_schema for t in tools.values())
            hits = _hits(await client.call_tool("search", {"query": "winterize the outboard engine", "k": 3}))
            _same_as_query_search(hits, kb, "winterize the outboard engine", "public", k=3)
            assert hits[0]["citation"]["uri"].startswith("file://") and "enrichment" not in hits[0]
            maths = _hits(await client.call_tool("search", {"query": "fractions", "filters": {"subject": "math",
                                                                                             "grade": 7}}))
            assert [h["text"].split("\n\n")[-1] for h in maths] == [FRACTIONS]
            context = await client.call_tool("get_context", {"chunk_id": hits[0]["chunk_id"], "neighbors": 2})
            chunk = context.structured_content
            indexes = [n["chunk_index"] for n in chunk["before"]] + [chunk["chunk"]["metadata"]["chunk_index"]] + [
                n["chunk_index"] for n in chunk["after"]]
            assert indexes == sorted(indexes) and len(indexes) > 1, "the chunk with its neighbours, in order"
            sources = (await client.call_tool("list_sources", {})).structured_content
            assert sources["sources"][0]["name"] == "club" and sources["published_run"] is not None
            runs = (await client.call_tool("versions", {})).structured_content["versions"]
            assert runs[-1]["published"] and sum(r["published"] for r in runs) == 1, "the latest run is served"

            # A run published while the session lasts is what the next call reads.
            corpus = Path(load_config(kb).sources[0].path)
            (corpus / "buoys.md").write_text(_note("Yellow racing buoys mark the summer course off the pier."),
                                             encoding="utf-8")
            try:
                # A listening client is told of the new version (subscriptions/listen on the served-version resource).
                async with client.listen(resource_subscriptions=[KB_URI]) as changes:
                    assert KB_URI in (changes.honored.resource_subscriptions or [])
                    served = json.loads((await client.read_resource(KB_URI)).contents[0].text)["version"]
                    ingest(config_path=str(kb))
                    with anyio.fail_after(10):
                        event = await anext(aiter(changes))
                    assert event == ResourceUpdated(uri=KB_URI)
                    now = json.loads((await client.read_resource(KB_URI)).contents[0].text)["version"]
                    assert now > served
                fresh = _hits(await client.call_tool("search", {"query": "yellow racing buoys", "mode": "fulltext"}))
                assert fresh and fresh[0]["doc_id"].endswith("buoys.md")
            finally:
                (corpus / "buoys.md").unlink()
                ingest(config_path=str(kb))

    asyncio.run(session())
    lines = _log(kb)[before:]
    assert [line["tool"] for line in lines] == ["search", "search", "get_context", "list_sources", "versions",
                                                "search"]
    assert all(line["caller"] == "agent" and line["clearance"] == "public" and "query" not in line for line in lines)
    assert lines[0]["doc_ids"] and len(lines[0]["query_sha256"]) == 64, "documents served and a hash, no text"


def _keyed(url: str, key: str) -> Client:
    """The SDK's client over streamable HTTP, every request carrying Authorization: Bearer key."""
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"})))


def test_mcp_over_http_answers_each_key_at_its_clearance_and_never_above_it_whatever_it_is_asked(kb):
    cfg = load_config(kb)
    rows = lancedb.connect(str(cfg.store.uri)).open_table("chunks").to_arrow().to_pylist()
    expired = {r["chunk_id"] for r in rows if r["doc_id"].endswith("fuel.md")}
    above = {"public": {r["chunk_id"] for r in rows if r["access_level"] != "public"},
             "internal": {r["chunk_id"] for r in rows if r["access_level"] in ("restricted", "confidential")}}
    staff = {r["chunk_id"] for r in rows if r["doc_id"].endswith("staff.md")}
    assert staff and staff <= above["public"] and not staff & above["internal"]
    port = _free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    before = len(_log(kb))
    calls = refused = 0
    with _serving("mcp", "--http", f"127.0.0.1:{port}", "--config", str(kb), ready=url):
        # No key, or a key not in the file: 401 with the spec's WWW-Authenticate, and no tool runs.
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search",
                                                                            "arguments": {"query": SECRET}}}
        for headers in ({}, {"Authorization": "Bearer not-a-key"}, {"Authorization": f"Basic {KEY_INTERNAL}"}):
            answer = httpx.post(url, json=hello, headers={"Accept": "application/json, text/event-stream", **headers})
            refused += 1
            assert answer.status_code == 401 and SECRET not in answer.text, answer.text
            assert answer.headers["www-authenticate"].startswith("Bearer ")
            assert "resource_metadata=" in answer.headers["www-authenticate"]

        meta = httpx.get(f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp").json()
        assert meta["resource"] == url
        # A session belongs to the key that opened it: another key asking for it is told it does not exist.
        opened = httpx.post(url, headers={"Accept": "application/json, text/event-stream",
                                          "Authorization": f"Bearer {KEY_INTERNAL}"},
                            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                                "protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "test", "version": "1"}}})
        assert opened.status_code == 200, opened.text
        taken = httpx.post(url, json=hello, headers={"Accept": "application/json, text/event-stream",
                                                     "Authorization": f"Bearer {KEY_PUBLIC}",
                                                     "Mcp-Session-Id": opened.headers["mcp-session-id"]})
        assert taken.status_code == 404 and SECRET not in taken.text and STAFF not in taken.text

        async def wrong_key() -> None:
            async with _keyed(url, "not-a-key") as client:
                await client.call_tool("search", {"query": SECRET})

        with pytest.raises(Exception):  # noqa: B017, PT011 - the SDK's client fails to connect on a 401, however it says so
            asyncio.run(wrong_key())
        refused += 1

        async def session(key: str, clearance: str) -> set[str]:
            nonlocal calls
            hidden = above[clearance] | expired
            seen: set[str] = set()
            async with _keyed(url, key) as client:
                for text in (SECRET, STAFF, OLD):  # a chunk's own text is the strongest query for it
                    for mode in MODES:
                        for args in ({}, {"filters": {"access_level": ["internal", "confidential"]}},
                                     {"clearance": "confidential"}, {"as_of": "1"}):
                            result = await client.call_tool("search", {"query": text, "mode": mode, "k": 10, **args})
                            calls += 1
                            served = [] if result.is_error else _hits(result)
                            seen |= {h["chunk_id"] for h in served}
                            assert not {h["chunk_id"] for h in served} & hidden, (clearance, text, mode, args)
                            assert all(ACCESS_LEVELS.index(h["metadata"]["access_level"]) <=
                                       ACCESS_LEVELS.index(clearance) for h in served)
                for chunk_id in sorted(hidden):
                    result = await client.call_tool("get_context", {"chunk_id": chunk_id})
                    calls += 1
                    assert result.is_error and "is available to this caller" in result.content[0].text
                missing = await client.call_tool("get_context", {"chunk_id": "no-such-chunk"})
                calls += 1
                assert missing.content[0].text.replace("no-such-chunk", "X") == result.content[0].text.replace(
                    chunk_id, "X"), "a hidden chunk and a missing one get the same answer"
            return seen

        assert not asyncio.run(session(KEY_PUBLIC, "public")) & staff
        assert asyncio.run(session(KEY_INTERNAL, "internal")) & staff, "the staff key is answered at its clearance"
    lines = _log(kb)[before:]
    denied = [line for line in lines if (line["error"] or "")[:3] in ("401", "404")]
    assert lines[: len(denied)] == denied, "the refusals came first"
    unknown = [line for line in denied if line["caller"] == "unknown"]
    # The SDK's client may knock more than once before it gives up (discovery, then the handshake): each is a line.
    assert len(unknown) >= refused and all(line["denied"] == 1 and line["error"].startswith("401") for line in unknown)
    taken = [line for line in denied if line["caller"] != "unknown"]
    assert [(line["caller"], line["error"][:20]) for line in taken] == [("public-bot", "404: no such session")]
    keyed = lines[len(denied):]
    assert len(keyed) == calls, "one access-log line per tool call, refused ones too"
    assert {line["caller"] for line in keyed} == {"public-bot", "staff-bot"}
    hidden_docs = {r["doc_id"] for r in rows if r["chunk_id"] in above["internal"] | expired}
    assert not {d for line in lines for d in line["doc_ids"]} & hidden_docs
    assert not {d for line in lines if line["caller"] == "public-bot" for d in line["doc_ids"]} & {
        r["doc_id"] for r in rows if r["chunk_id"] in staff}


def test_the_http_api_answers_per_api_key_and_sees_a_run_published_while_it_serves(kb, tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    before = len(_log(kb))
    public = {"Authorization": f"Bearer {KEY_PUBLIC}"}
    staff = {"Authorization": f"Bearer {KEY_INTERNAL}"}
    with _serving("api", "--port", str(port), "--config", str(kb), ready=f"{url}/openapi.json"):
        spec = httpx.get(f"{url}/openapi.json").json()
        assert {"/search", "/context/{chunk_id}", "/sources", "/versions"} <= set(spec["paths"])
        assert httpx.get(f"{url}/docs").status_code == 200
        assert httpx.post(f"{url}/search", json={"query": "vault"}).status_code == 401
        assert httpx.post(f"{url}/search", json={"query": "vault"},
                          headers={"Authorization": "Bearer wrong"}).status_code == 401

        question = {"query": "winterize the outboard engine", "k": 4, "mode": "hybrid"}
        hits = httpx.post(f"{url}/search", json=question, headers=public).json()["hits"]
        _same_as_query_search(hits, kb, question["query"], "public", k=4, mode="hybrid")
        for headers, seen in ((public, False), (staff, True)):
            found = httpx.post(f"{url}/search", json={"query": STAFF, "mode": "fulltext", "k": 10},
                               headers=headers).json()["hits"]
            assert any(STAFF in h["text"] for h in found) is seen
            assert all(ACCESS_LEVELS.index(h["metadata"]["access_level"]) <= 1 for h in found)
        refused = httpx.post(f"{url}/search", json={**question, "clearance": "confidential"}, headers=public)
        assert refused.status_code == 422, "a clearance in the request is refused, not obeyed"
        assert httpx.get(f"{url}/context/no-such-chunk", headers=staff).status_code == 404
        sources = httpx.get(f"{url}/sources", headers=public).json()
        first_run = sources["published_run"]
        assert httpx.post(f"{url}/search", json=question, headers=public).json()["version"] == sources[
            "published_version"], "an answer names the version it was read from"

        # A run is published while the server runs: the next request reads it, no restart.
        corpus = Path(load_config(kb).sources[0].path)
        (corpus / "tides.md").write_text(_note("Spring tides at the club slipway peak two hours after noon."),
                                         encoding="utf-8")
        try:
            run = ingest(config_path=str(kb))
            fresh = httpx.post(f"{url}/search", json={"query": "spring tides slipway", "mode": "fulltext"},
                               headers=public).json()["hits"]
            assert fresh and fresh[0]["doc_id"].endswith("tides.md")
            assert httpx.get(f"{url}/sources", headers=public).json()["published_run"] == run["run_id"] != first_run
        finally:
            (corpus / "tides.md").unlink()
            ingest(config_path=str(kb))
    lines = _log(kb)[before:]
    assert len(lines) == 11, "one line per request: 2 refused for want of a key, 1 for its schema, 8 answered"
    assert [line["caller"] for line in lines[:2]] == ["unknown", "unknown"] and lines[0]["denied"] == 1
    assert {line["caller"] for line in lines[2:]} == {"public-bot", "staff-bot"}


def test_an_api_keys_file_is_checked_naming_the_file_and_the_key(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text("keys:\n  - caller: bot\n    sha256: not-a-hash\n    clearance: internal\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"keys.yaml: keys.0.sha256"):
        load_api_keys(path)
    digest = hashlib.sha256(b"k").hexdigest()
    path.write_text(f"keys:\n  - {{caller: a, sha256: {digest}, clearance: public}}\n"
                    f"  - {{caller: b, sha256: {digest}, clearance: internal}}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"keys.1.sha256: the same key is listed twice"):
        load_api_keys(path)


def test_the_access_log_keeps_query_text_only_when_configured(tmp_path):
    from query.service import AccessLog, Caller, Served

    log = AccessLog(tmp_path / "a.jsonl")
    log.write(Caller("x", "public"), "search", "secret words", Served({"d"}, 1, 0), None)
    AccessLog(tmp_path / "a.jsonl", log_queries=True).write(Caller("x", "public"), "search", "open words", Served(),
                                                            None)
    first, second = (json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines())
    assert "query" not in first and "secret words" not in json.dumps(first)
    assert first["query_sha256"] == hashlib.sha256(b"secret words").hexdigest() and first["doc_ids"] == ["d"]
    assert second["query"] == "open words"


def test_the_servers_refuse_a_bad_clearance_or_address_before_serving(kb):
    from typer.testing import CliRunner

    from inlet.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["mcp", "--clearance", "secret", "--config", str(kb)])
    assert bad.exit_code == 2 and "clearance 'secret' is not one of public, internal" in bad.output
    bad = runner.invoke(app, ["mcp", "--http", "localhost", "--config", str(kb)])
    assert bad.exit_code == 2 and "--http expects HOST:PORT" in bad.output
    bad = runner.invoke(app, ["api", "--clearance", "internal", "--config", str(kb)])
    assert bad.exit_code == 2 and "each key has its own" in bad.output, "a keys file and a server clearance clash"
    bad = runner.invoke(app, ["mcp", "--http", "127.0.0.1:1", "--clearance", "internal", "--config", str(kb)])
    assert bad.exit_code == 2 and "each key has its own" in bad.output
    bad = runner.invoke(app, ["mcp", "--keys", str(kb.parent / "keys.yaml"), "--config", str(kb)])
    assert bad.exit_code == 2 and "--keys is for --http" in bad.output
    # Without keys, a server is the local user's alone: another address is refused unless the user insists.
    open_config = kb.parent / "no-keys.yaml"
    data = yaml.safe_load(kb.read_text(encoding="utf-8"))
    data.pop("serving")
    open_config.write_text(yaml.safe_dump(data), encoding="utf-8")
    for args in (["mcp", "--http", "0.0.0.0:1"], ["api", "--host", "0.0.0.0", "--port", "1"],
                 ["mcp", "--http", "192.0.2.7:1"]):
        bad = runner.invoke(app, [*args, "--config", str(open_config)])
        assert bad.exit_code == 2 and "without a keys file would answer anyone" in bad.output, bad.output
        assert "--insecure-no-auth" in bad.output


def test_an_empty_store_and_an_unwritable_log_get_clear_answers(tmp_path):
    from fastapi.testclient import TestClient

    from query.http_api import build_app
    from query.service import Caller, open_knowledge_base
    from schemas.config import parse_config

    cfg = parse_config({"sources": [{"name": "s", "path": str(tmp_path)}], "embedding": {"kind": "hashing", "dim": 8},
                        "store": {"uri": str(tmp_path / "lancedb"), "artifacts": str(tmp_path / "runs")}},
                       origin="test").resolved(tmp_path)
    kb = open_knowledge_base(cfg)
    client = TestClient(build_app(kb, Caller("app", "public")))
    empty = client.post("/search", json={"query": "anything"})
    assert empty.status_code == 503 and "run `inlet ingest` first" in empty.json()["detail"]
    assert client.get("/sources").json()["sources"][0]["documents"] == 0, "nothing indexed yet, said as such"
    (tmp_path / "blocked").write_text("a file where the log's folder should be", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"serving.access_log: cannot write .*blocked/access.jsonl"):
        open_knowledge_base(cfg, tmp_path / "blocked" / "access.jsonl")


def test_a_server_loads_what_searches_need_before_its_first_caller_and_logs_no_call_for_it(kb, tmp_path):
    from query.service import open_knowledge_base
    from schemas.config import parse_config

    log = tmp_path / "access.jsonl"
    said = open_knowledge_base(load_config(kb), log).warm()
    assert said.startswith("indexes, query embedder and vector, fulltext, hybrid search loaded in"), said
    assert not log.exists() or log.read_text(encoding="utf-8") == "", "no caller made these searches"
    empty = parse_config({"sources": [{"name": "s", "path": str(tmp_path)}], "embedding": {"kind": "hashing", "dim": 8},
                          "store": {"uri": str(tmp_path / "lancedb"), "artifacts": str(tmp_path / "runs")}},
                         origin="test").resolved(tmp_path)
    said = open_knowledge_base(empty, log).warm()
    assert said.startswith("nothing loaded ahead") and "run `inlet ingest` first" in said, "said, not raised"
    cfg = load_config(kb)
    remote = cfg.model_copy(update={"embedding": cfg.embedding.model_copy(update={"kind": "gemini"})})
    said = open_knowledge_base(remote, log).warm()
    assert said.startswith("indexes, fulltext search loaded in"), "no paid API call to embed a probe at each start"
    printed: list[str] = []
    with _serving("api", "--port", str(port := _free_port()), "--config", str(kb),
                  ready=f"http://127.0.0.1:{port}/openapi.json", printed=printed):
        pass  # its port opened only after the loading
    assert "inlet api: indexes, query embedder and vector, fulltext, hybrid search loaded in" in printed[0]


def test_an_exposed_server_needs_keys_or_an_explicit_insecure_flag():
    from query.service import check_exposure

    for host in ("127.0.0.1", "localhost", "::1"):
        assert check_exposure(host, None, False, "inlet mcp") is None, "loopback without keys: the local user's"
    with pytest.raises(ConfigError, match="0.0.0.0 without a keys file"):
        check_exposure("0.0.0.0", None, False, "inlet mcp")
    warning = check_exposure("0.0.0.0", None, True, "inlet api")
    assert warning and "WITHOUT AUTHENTICATION" in warning
    from schemas.config import ApiKey, ApiKeys

    keys = ApiKeys(keys=(ApiKey(caller="bot", sha256=hashlib.sha256(b"k").hexdigest(), clearance="public"),))
    assert check_exposure("0.0.0.0", keys, False, "inlet mcp") is None, "with keys any address is served"


def _club(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the sample corpus and a config over it (hashing embedder): (corpus, config path)."""
    corpus = tmp_path / "corpus"
    shutil.copytree(SAMPLE, corpus)
    path = tmp_path / "inlet.yaml"
    path.write_text(yaml.safe_dump({"sources": [{"name": "club", "path": str(corpus)}],
                                    "embedding": {"kind": "hashing", "dim": 16},
                                    "store": {"uri": str(tmp_path / "lancedb"), "artifacts": str(tmp_path / "runs")}}),
                    encoding="utf-8")
    return corpus, path


def test_sources_are_counted_per_version_and_clearance(tmp_path, prefect_harness):
    # Each version's tally is counted once per clearance and kept: a new version is counted again, and one
    # clearance's count is never another's.
    from query.service import Caller, open_knowledge_base

    corpus, path = _club(tmp_path)
    (corpus / "staff.md").write_text(_note(STAFF, access_level="internal"), encoding="utf-8")
    ingest(config_path=str(path))
    kb = open_knowledge_base(load_config(path), tmp_path / "access.jsonl")
    docs = lambda clearance: kb.list_sources(Caller("x", clearance)).sources[0].documents  # noqa: E731
    public = docs("public")
    assert docs("internal") == public + 1 and docs("public") == public, "each clearance its own count"
    (corpus / "buoys.md").write_text(_note("Yellow racing buoys mark the summer course."), encoding="utf-8")
    ingest(config_path=str(path))
    assert (docs("public"), docs("internal")) == (public + 1, public + 2), "a new version is counted anew"
    # The chunks, not the documents, of each clearance: as many as the published table holds at that level.
    from query.search import published_table

    table, _ = published_table(load_config(path))
    for clearance, levels in (("public", "'public'"), ("internal", "'public', 'internal'")):
        held = table.count_rows(f"access_level IN ({levels})")
        source = kb.list_sources(Caller("x", clearance)).sources[0]
        assert source.chunks == held > source.documents, f"{clearance}: chunks counted as the table holds them"


def test_each_clearance_tally_is_cut_from_one_grouping_of_the_version():
    # One read of a version serves every clearance: its groups, cut by level and, where rows expire, by the clock.
    from datetime import UTC, datetime, timedelta

    import pyarrow as pa

    from query.service import _tally_of

    now = datetime(2026, 1, 1, tzinfo=UTC)
    groups = pa.table({"source": ["a", "a", "a", "b"], "doc_id": ["d1", "d2", "d2", "d3"],
                       "access_level": ["public", "internal", "public", "confidential"],
                       "expires_at": pa.array([None, None, now - timedelta(seconds=1), now + timedelta(days=1)],
                                              pa.timestamp("us", tz="UTC")),
                       "count_all": [3, 2, 4, 1]})
    assert _tally_of(groups, "public", None) == ({"a": 7}, {"a": {"d1", "d2"}})
    assert _tally_of(groups, "public", now) == ({"a": 3}, {"a": {"d1"}}), "an expired group is not counted"
    assert _tally_of(groups, "internal", now) == ({"a": 5}, {"a": {"d1", "d2"}})
    assert _tally_of(groups, "confidential", now) == ({"a": 5, "b": 1}, {"a": {"d1", "d2"}, "b": {"d3"}})
    assert _tally_of(groups, "confidential", now + timedelta(days=2))[0] == {"a": 5}, "expired once its time passed"


def test_the_servers_runs_history_sees_new_rows_rewritten_rows_and_a_table_made_anew(tmp_path):
    # A server reads only the runs rows written since its last read: a new run, a gate rewritten by a publish by
    # hand, and a runs table dropped and made anew (its row ids start again) must each show as the table holds them.
    import lancedb

    from flows.publishing import record_rollback
    from query.history import RunsHistory
    from store.tables import open_runs_table

    db = lancedb.connect(tmp_path / "lancedb")
    runs = open_runs_table(db)
    for n in (1, 2):
        record_rollback(runs, f"r{n}", "x", {"chunks": n}, n, None)
    history = RunsHistory()
    listed = history.read(runs, None, "chunks")
    assert [(e["run_id"], e["chunks_version"], e["gate"]) for e in listed] == [("r1", 1, None), ("r2", 2, None)]
    record_rollback(runs, "r3", "x", {"chunks": 3}, 3, None)
    runs.update(where="run_id = 'r1'", values={"gate": "published by hand"})
    listed = history.read(runs, None, "chunks")
    assert [(e["run_id"], e["gate"]) for e in listed] == [("r1", "published by hand"), ("r2", None), ("r3", None)]
    db.drop_table(runs.name)
    runs = open_runs_table(db)
    record_rollback(runs, "r9", "x", {"chunks": 9}, 9, None)
    assert [e["run_id"] for e in history.read(runs, None, "chunks")] == ["r9"], "no row of the dropped table kept"


def test_sources_are_counted_again_once_a_row_expires_and_runs_once_a_run_lands(tmp_path, prefect_harness,
                                                                                 monkeypatch):
    # A version whose rows expire keeps its tally only until the next of them expires; the runs history is
    # read again when a run writes its row. The server's clock is moved on rather than waited for.
    from datetime import UTC, datetime, timedelta

    import query.service
    from query.search import next_expiry, published_table
    from query.service import Caller, open_knowledge_base

    class Later(datetime):
        shift = timedelta(0)

        @classmethod
        def now(cls, tz=None):  # noqa: ANN001, ANN206 - datetime.now's own signature
            return datetime.now(tz) + cls.shift

    monkeypatch.setattr(query.service, "datetime", Later)
    corpus, path = _club(tmp_path)
    ingest(config_path=str(path))
    kb = open_knowledge_base(load_config(path), tmp_path / "access.jsonl")
    caller = Caller("x", "public")
    before = kb.list_sources(caller)
    assert len(kb.versions(caller).versions) == 1
    ends = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    (corpus / "notice.md").write_text(_note("The slipway is closed for repairs.", expires_at=ends.isoformat()),
                                      encoding="utf-8")
    ingest(config_path=str(path))
    assert [v.run_id for v in kb.versions(caller).versions][:1] == [before.last_run], "the new run is listed"
    assert len(kb.versions(caller).versions) == 2
    table, version = published_table(load_config(path))
    assert next_expiry(table, str(tmp_path / "lancedb"), version, datetime.now(UTC)) == ends
    assert kb.list_sources(caller).sources[0].documents == before.sources[0].documents + 1, "not yet expired"
    Later.shift = timedelta(hours=2)
    assert next_expiry(table, str(tmp_path / "lancedb"), version, Later.now(UTC)) is None
    assert kb.list_sources(caller).sources[0].documents == before.sources[0].documents, "counted again: gone"
