"""A local HTTP server speaking the Gemini REST calls the real google-genai client makes (tests only).

Answers are derived from the input, so they are the same on every run. Fault switches inject
latency, 429s with a retry delay, 500s, time-outs and malformed JSON, each by a seeded draw per request.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

_ROUTE = re.compile(r"^/v1(?:beta)?/models/(?P<model>[^:/]+):(?P<method>\w+)$")
_BATCH = re.compile(r"^/v1(?:beta)?/batches/(?P<job>[^:/]+)$")
_STATUS_NAMES = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL"}


@dataclass
class BatchJob:
    """A batch job the server holds: its requests, and how many times its state was asked for."""

    name: str
    model: str
    requests: list[dict]
    polls: int = 0
    kind: str = "generate"  # generate: inlined requests and answers; embed: JSONL files in and out
    output: str | None = None  # name of the answers file, once written


@dataclass
class Faults:
    """What the server gets wrong, and how often."""

    latency_s: float = 0.0
    gate: threading.Event | None = None  # every answer waits until the test sets it (at most 300 s)
    p429: float = 0.0
    p500: float = 0.0
    p_malformed: float = 0.0
    p_timeout: float = 0.0  # the request is held for hang_s, past a short client time-out
    hang_s: float = 2.0
    first_429s: int = 0  # the first n requests are refused with a 429 whatever the draw
    batch_polls: int = 1  # state checks a batch job answers RUNNING before it succeeds
    batch_hold: bool = False  # batch jobs stay RUNNING until this is switched off
    p_batch_row_error: float = 0.0  # rows of a finished batch job that come back as errors
    retry_delay_s: float = 1
    seed: int = 7
    reject_text: str | None = None  # an embedding request holding a text with this in it is refused (400)


@dataclass
class Traffic:
    """What the server saw: requests per method and texts per embedding request."""

    calls: dict[str, int] = field(default_factory=dict)
    embed_batch_sizes: list[int] = field(default_factory=list)
    api_keys: set[str] = field(default_factory=set)
    request_times: list[float] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


def fake_vector(text: str, dim: int) -> list[float]:
    """Return a deterministic, deliberately unnormalised vector for text."""
    seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return (np.random.default_rng(seed).normal(size=dim) * 3.0).astype(float).round(6).tolist()


def _text_of(content: dict) -> str:
    return "".join(p.get("text", "") for p in content.get("parts", []))


class _Handler(BaseHTTPRequestHandler):
    server: GeminiServer

    def log_message(self, *_args: object) -> None:  # keep test output quiet
        return

    def _send(self, status: int, body: bytes) -> None:
        self._answered()  # in flight until answered: the client may send its next request the moment it reads this
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, details: list | None = None) -> None:
        status_name = _STATUS_NAMES.get(status, "UNKNOWN")
        error = {"code": status, "message": message, "status": status_name}
        if details:
            error["details"] = details
        self._send(status, json.dumps({"error": error}).encode())

    def _answered(self) -> None:
        """Count this request out of flight, once (before its answer is written, or when it ends without one)."""
        if getattr(self, "_in_flight", False):
            self._in_flight = False
            with self.server.lock:
                self.server.traffic.in_flight -= 1

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        srv = self.server
        with srv.lock:
            srv.traffic.in_flight += 1
            srv.traffic.max_in_flight = max(srv.traffic.max_in_flight, srv.traffic.in_flight)
        self._in_flight = True
        try:
            self._serve(srv)
        finally:
            self._answered()

    def _serve(self, srv: GeminiServer) -> None:
        match = _ROUTE.match(self.path.split("?")[0])
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith(("/upload/", "/upload-session/")):  # the Files API's resumable upload
            self._upload(raw)
            return
        payload = json.loads(raw or b"{}")
        with srv.lock:
            srv.traffic.request_times.append(time.monotonic())
            srv.traffic.api_keys.add(self.headers.get("x-goog-api-key", ""))
            draw = srv.rng.random()
            refused = srv.served < srv.faults.first_429s
            srv.served += 1
        if srv.faults.latency_s:
            time.sleep(srv.faults.latency_s)
        if srv.faults.gate is not None:
            srv.faults.gate.wait(timeout=300)
        if match is None:
            self._error(404, f"no route for {self.path}")
            return
        method = match.group("method")
        with srv.lock:
            srv.traffic.calls[method] = srv.traffic.calls.get(method, 0) + 1
        faults = srv.faults
        if refused or draw < faults.p429:
            retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{faults.retry_delay_s}s"}
            self._error(429, "Resource has been exhausted (e.g. check quota).", [retry])
            return
        if draw < faults.p429 + faults.p500:
            self._error(500, "An internal error has occurred.")
            return
        malformed = draw < faults.p429 + faults.p500 + faults.p_malformed
        if not malformed and draw < faults.p429 + faults.p500 + faults.p_malformed + faults.p_timeout:
            time.sleep(faults.hang_s)  # the client has given up by now; its retry is a new request
        if method == "batchEmbedContents":
            self._embed(payload)
        elif method == "generateContent":
            self._generate(payload, malformed)
        elif method == "batchGenerateContent":
            self._create_batch(match.group("model"), payload)
        elif method == "asyncBatchEmbedContent":
            self._create_embed_batch(match.group("model"), payload)
        else:
            self._error(404, f"method {method} is not served here")

    def _upload(self, raw: bytes) -> None:
        srv = self.server
        if self.path.startswith("/upload/"):  # start: hand out an upload URL
            with srv.lock:
                session = f"s{len(srv.files) + 1}"
                srv.files[f"upload:{session}"] = b""
            body = b"{}"
            self.send_response(200)
            self.send_header("x-goog-upload-url", f"{self.server.base_url}/upload-session/{session}")
            self.send_header("x-goog-upload-status", "active")
        else:  # upload, finalize: the whole file in one piece (files here are small)
            session = self.path.rsplit("/", 1)[1]
            with srv.lock:
                name = f"files/in{len(srv.files) + 1}"
                srv.files[name] = raw
            body = json.dumps({"file": {"name": name, "sizeBytes": str(len(raw)), "mimeType": "application/jsonl",
                                        "state": "ACTIVE", "uri": f"{srv.base_url}/v1beta/{name}"}}).encode()
            self.send_response(200)
            self.send_header("x-goog-upload-status", "final")
            del session
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _create_embed_batch(self, model: str, payload: dict) -> None:
        srv = self.server
        source = payload["batch"]["inputConfig"]
        file_name = source.get("fileName") or source.get("file_name")  # proto JSON takes either spelling
        lines = srv.files.get(file_name or "", b"").decode().splitlines()
        if not lines:
            self._error(400, f"input file {file_name} is missing or empty")
            return
        with srv.lock:
            name = f"batches/job{len(srv.jobs) + 1}"
            srv.jobs[name] = BatchJob(name, model, [json.loads(line) for line in lines], kind="embed")
        metadata = {"name": name, "model": f"models/{model}", "state": "BATCH_STATE_PENDING"}
        self._send(200, json.dumps({"name": name, "metadata": metadata}).encode())

    def _embed_output(self, job: BatchJob) -> str:
        """Write a finished embedding job's answers as a JSONL file; return its name."""
        srv = self.server
        lines = []
        for row in job.requests:
            with srv.lock:
                failed = srv.rng.random() < srv.faults.p_batch_row_error
            if failed:
                lines.append({"key": row["key"], "error": {"code": 500, "message": "internal error on this row"}})
                continue
            req = row["request"]
            text = _text_of(req["content"]) + "|" + req.get("title", "") + "|" + req.get("taskType", "")
            lines.append({"key": row["key"], "response": {"embedding": {
                "values": fake_vector(text, int(req.get("outputDimensionality", 3072)))}}})
        name = f"files/out-{job.name.rsplit('/', 1)[1]}"
        with srv.lock:
            srv.files[name] = "\n".join(json.dumps(line) for line in lines).encode()
        return name

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        srv = self.server
        if ":download" in self.path:
            name = "files/" + self.path.split("/files/", 1)[1].split(":download", 1)[0]
            with srv.lock:
                srv.traffic.calls["files.download"] = srv.traffic.calls.get("files.download", 0) + 1
                data = srv.files.get(name)
            if data is None:
                self._error(404, f"no file {name}")
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        match = _BATCH.match(self.path.split("?")[0])
        with srv.lock:
            srv.traffic.calls["batches.get"] = srv.traffic.calls.get("batches.get", 0) + 1
            job = srv.jobs.get(f"batches/{match.group('job')}") if match else None
        if job is None:
            self._error(404, f"no batch job at {self.path}")
            return
        job.polls += 1
        done = job.polls >= srv.faults.batch_polls and not srv.faults.batch_hold
        metadata = {"@type": "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch",
                    "name": job.name, "model": f"models/{job.model}",
                    "state": "BATCH_STATE_SUCCEEDED" if done else "BATCH_STATE_RUNNING"}
        if done and job.kind == "embed":
            job.output = job.output or self._embed_output(job)
            metadata["output"] = {"responsesFile": job.output}
        elif done:
            metadata["output"] = {"inlinedResponses": {"inlinedResponses": [self._batch_row(r) for r in job.requests]}}
        self._send(200, json.dumps({"name": job.name, "metadata": metadata, "done": done}).encode())

    def _batch_row(self, row: dict) -> dict:
        srv = self.server
        with srv.lock:
            failed = srv.rng.random() < srv.faults.p_batch_row_error
        if failed:
            return {"error": {"code": 500, "message": "internal error on this row"}, "metadata": row.get("metadata")}
        return {"response": self._answer(row["request"], False), "metadata": row.get("metadata")}

    def _create_batch(self, model: str, payload: dict) -> None:
        srv = self.server
        requests = payload["batch"]["inputConfig"]["requests"]["requests"]
        with srv.lock:
            name = f"batches/job{len(srv.jobs) + 1}"
            srv.jobs[name] = BatchJob(name, model, requests)
        metadata = {"name": name, "model": f"models/{model}", "state": "BATCH_STATE_PENDING",
                    "displayName": payload["batch"].get("displayName", "")}
        self._send(200, json.dumps({"name": name, "metadata": metadata}).encode())

    def _embed(self, payload: dict) -> None:
        requests = payload.get("requests", [])
        if len(requests) > 100:
            self._error(400, "at most 100 requests can be in one batch")
            return
        marker = self.server.faults.reject_text
        if marker is not None and any(marker in _text_of(r["content"]) for r in requests):
            # Gemini's answer to an input it will not take, whatever the retries: the input's fault, not the service's.
            self._error(400, "Request contains an invalid argument.")
            return
        with self.server.lock:
            self.server.traffic.embed_batch_sizes.append(len(requests))
        embeddings = [{"values": fake_vector(_text_of(r["content"]) + "|" + r.get("title", "") + "|"
                                             + r.get("taskType", ""), int(r.get("outputDimensionality", 3072)))}
                      for r in requests]
        self._send(200, json.dumps({"embeddings": embeddings}).encode())

    def _generate(self, payload: dict, malformed: bool) -> None:
        self._send(200, json.dumps(self._answer(payload, malformed)).encode())

    @staticmethod
    def _answer(payload: dict, malformed: bool) -> dict:
        prompt = " ".join(_text_of(c) for c in payload.get("contents", []))
        words = re.findall(r"[A-Za-z]{4,}", prompt)
        schema = payload.get("generationConfig", {}).get("responseSchema", {})
        answer = {}
        for name, spec in schema.get("properties", {"text": {"type": "STRING"}}).items():
            kind = str(spec.get("type", "STRING")).upper()
            answer[name] = sorted(set(w.lower() for w in words))[:5] if kind == "ARRAY" else " ".join(words[:12])
        text = json.dumps(answer)
        if malformed:
            text = text[: len(text) // 2]  # truncated JSON, as a cut-off answer looks
        return {
            "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": len(prompt.split()), "candidatesTokenCount": len(text.split()),
                              "totalTokenCount": len(prompt.split()) + len(text.split())},
            "modelVersion": "fake-gemini",
        }


class GeminiServer(ThreadingHTTPServer):
    """The server; start() runs it on a free loopback port in a daemon thread."""

    daemon_threads = True

    def __init__(self, faults: Faults | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.faults = faults or Faults()
        self.traffic = Traffic()
        self.lock = threading.Lock()
        self.rng = random.Random(self.faults.seed)
        self.served = 0
        self.jobs: dict[str, BatchJob] = {}
        self.files: dict[str, bytes] = {}
        self._thread: threading.Thread | None = None

    def handle_error(self, request: object, client_address: object) -> None:
        """Stay quiet when a client gave up on a held request (a time-out test); report anything else."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    @property
    def base_url(self) -> str:
        """Return the URL to give the client as http_options.base_url."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> GeminiServer:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.shutdown()
        self.server_close()
