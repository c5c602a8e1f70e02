"""The limits both servers apply (query/guard.py, KnowledgeBase.in_time): per-caller rate, body size, query length,
time to send a body and to answer."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import anyio
import pytest
from fastapi.testclient import TestClient
from mcp import Client

from query.guard import guarded
from query.http_api import build_app
from query.mcp_server import build_server, log_refusals
from query.service import Caller, KnowledgeBase, callers_of, open_knowledge_base
from schemas.config import ApiKey, ApiKeys, parse_config
from schemas.errors import ConfigError

KEY_A, KEY_B = "first-key-0001", "second-key-0002"
KEYS = ApiKeys(keys=(ApiKey(caller="a", sha256=hashlib.sha256(KEY_A.encode()).hexdigest(), clearance="public"),
                     ApiKey(caller="b", sha256=hashlib.sha256(KEY_B.encode()).hexdigest(), clearance="internal")))


def _kb(tmp_path: Path, **serving: object) -> KnowledgeBase:
    cfg = parse_config({"sources": [{"name": "s", "path": str(tmp_path)}], "embedding": {"kind": "hashing", "dim": 8},
                        "store": {"uri": str(tmp_path / "lancedb"), "artifacts": str(tmp_path / "runs")},
                        "serving": serving}, origin="test").resolved(tmp_path)
    return open_knowledge_base(cfg, tmp_path / "access.jsonl")


def _log(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "access.jsonl").read_text(encoding="utf-8").splitlines()]


def _api(kb: KnowledgeBase, keys: ApiKeys | None = KEYS) -> TestClient:
    who = Caller("app", "public")
    return TestClient(guarded(build_app(kb, who, keys), kb, who, callers_of(keys)))


def test_each_key_has_its_own_rate_and_past_it_gets_429_with_retry_after(tmp_path):
    kb = _kb(tmp_path, rate_limit="3/minute")
    client = _api(kb)
    a, b = {"Authorization": f"Bearer {KEY_A}"}, {"Authorization": f"Bearer {KEY_B}"}
    assert [client.get("/sources", headers=a).status_code for _ in range(3)] == [200, 200, 200]
    over = client.get("/sources", headers=a)
    assert over.status_code == 429 and "at most 3/minute per caller" in over.json()["detail"]
    assert 1 <= int(over.headers["retry-after"]) <= 60
    assert client.get("/sources", headers=b).status_code == 200, "another key's allowance is its own"
    refused = [line for line in _log(tmp_path) if line["error"] and line["error"].startswith("429")]
    assert [line["caller"] for line in refused] == ["a"]


def test_without_keys_the_rate_is_per_client_address_and_none_turns_it_off(tmp_path):
    client = _api(_kb(tmp_path, rate_limit="2/minute"), keys=None)
    assert [client.get("/sources").status_code for _ in range(3)] == [200, 200, 429]
    unlimited = _api(_kb(tmp_path / "free", rate_limit=None), keys=None)
    assert {unlimited.get("/sources").status_code for _ in range(20)} == {200}


def test_a_body_over_the_limit_is_refused_whole_or_streamed_and_a_long_query_gets_400(tmp_path):
    kb = _kb(tmp_path, max_body_bytes=1024, max_query_chars=100)
    client = _api(kb, keys=None)
    big = {"query": "x" * 2000}
    assert client.post("/search", json=big).status_code == 413
    streamed = client.post("/search", content=iter([json.dumps(big).encode()[:600], json.dumps(big).encode()[600:]]),
                           headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413 and "serving.max_body_bytes" in streamed.json()["detail"]
    long = client.post("/search", json={"query": "y" * 101})
    assert long.status_code == 400 and "at most 100" in long.json()["detail"]
    assert [line["error"][:3] for line in _log(tmp_path)] == ["413", "413", "Que"]


def test_the_mcp_server_is_behind_the_same_limits(tmp_path):
    kb = _kb(tmp_path, rate_limit="2/minute")
    who = Caller("agent", "public")
    url = "http://127.0.0.1:8766/mcp"
    app = guarded(log_refusals(build_server(kb, who, KEYS, url).streamable_http_app(host="127.0.0.1"), kb, who,
                                 callers_of(KEYS)), kb, who,
                  callers_of(KEYS))
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {KEY_A}"}
    with TestClient(app, base_url="http://127.0.0.1:8766") as client:
        codes = [client.post("/mcp", json=hello, headers=headers).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        assert client.post("/mcp", json=hello, headers={**headers, "Authorization": f"Bearer {KEY_B}"}
                           ).status_code == 200
        assert client.post("/mcp", content=b"{" + b" " * 70000 + b"}",
                           headers={**headers, "Authorization": f"Bearer {KEY_B}"}).status_code == 413


def test_a_rate_limit_that_is_not_a_rate_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"serving.rate_limit.*'lots' is not a rate"):
        _kb(tmp_path, rate_limit="lots")


class _Slow(KnowledgeBase):
    """A knowledge base whose list_sources takes half a second: an answer slower than a small serving.timeout_s."""

    def list_sources(self, caller: Caller):  # noqa: ANN201 - the parent's answer
        time.sleep(0.5)
        return super().list_sources(caller)


def _slow_kb(tmp_path: Path, timeout_s: float) -> KnowledgeBase:
    kb = _kb(tmp_path, timeout_s=timeout_s)
    return _Slow(kb.cfg, kb.log)


def test_an_answer_over_the_timeout_gets_503_with_retry_after_and_its_read_is_still_logged(tmp_path):
    client = _api(_slow_kb(tmp_path, 0.1), keys=None)
    late = client.get("/sources")
    assert late.status_code == 503 and "serving.timeout_s" in late.json()["detail"]
    assert int(late.headers["retry-after"]) >= 1
    deadline = time.monotonic() + 10
    while len(_log(tmp_path)) < 2 and time.monotonic() < deadline:  # the abandoned read ends on its own
        time.sleep(0.05)
    lines = _log(tmp_path)
    assert lines[0]["tool"] == "list_sources" and lines[0]["error"].startswith("503: no answer within")
    assert len(lines) == 2 and lines[1]["tool"] == "list_sources"
    assert _api(_slow_kb(tmp_path / "patient", 5.0), keys=None).get("/sources").status_code != 503


def test_an_mcp_tool_over_the_timeout_is_a_tool_error_naming_the_setting(tmp_path):
    kb = _slow_kb(tmp_path, 0.1)

    async def call() -> tuple[bool, str]:
        async with Client(build_server(kb, Caller("agent", "public"))) as client:
            result = await client.call_tool("list_sources", {})
            return result.is_error, " ".join(c.text for c in result.content)

    is_error, text = anyio.run(call)
    assert is_error and "serving.timeout_s" in text


def test_a_body_that_trickles_past_the_timeout_gets_408_and_the_app_never_runs(tmp_path):
    kb = _kb(tmp_path, timeout_s=0.2)
    ran: list[str] = []

    async def app(scope, receive, send) -> None:  # noqa: ANN001 - ASGI
        ran.append(scope["path"])

    sent: list[dict] = []

    async def receive() -> dict:
        if not sent:
            sent.append({})
            return {"type": "http.request", "body": b'{"query": "', "more_body": True}
        await anyio.sleep(60)  # the rest never comes
        return {"type": "http.disconnect"}

    answers: list[dict] = []

    async def send(message: dict) -> None:
        answers.append(message)

    scope = {"type": "http", "method": "POST", "path": "/search", "headers": [], "client": ("127.0.0.1", 1)}
    async def main() -> None:
        with anyio.fail_after(10):  # a guard that waited for the body would fail here, not hang
            await guarded(app, kb, Caller("app", "public"), None)(scope, receive, send)

    anyio.run(main)
    assert answers[0]["status"] == 408 and b"serving.timeout_s" in answers[1]["body"]
    assert not ran and _log(tmp_path)[0]["error"].startswith("408")


class _Counting(KnowledgeBase):
    """A knowledge base that counts how many list_sources reads run at once."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.lock, self.now, self.most = threading.Lock(), 0, 0

    def list_sources(self, caller: Caller):  # noqa: ANN201 - the parent's answer
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.2)
        with self.lock:
            self.now -= 1
        return super().list_sources(caller)


def _most_at_once(tmp_path: Path, concurrency: int, callers: int = 6) -> int:
    kb = _kb(tmp_path, concurrency=concurrency)
    counting = _Counting(kb.cfg, kb.log)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for _ in range(callers):
                group.start_soon(counting.in_time, Caller("app", "public"), counting.list_sources)

    anyio.run(main)
    return counting.most


def test_reads_beyond_serving_concurrency_wait_their_turn(tmp_path):
    assert _most_at_once(tmp_path / "two", 2) == 2
    assert _most_at_once(tmp_path / "six", 6) == 6, "the setting, not a fixed limit, decides"
    assert len(_log(tmp_path / "two")) == 6, "every read waited for its turn and was answered"
