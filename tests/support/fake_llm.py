"""A scripted OpenAI-compatible HTTP server for tests and benchmarks.

``ScriptedLLMServer`` listens on 127.0.0.1 (ephemeral port) in a background thread and speaks
just enough of the OpenAI API for tidegraph: ``POST /v1/chat/completions`` (structured output
requests, answered by a handler registered per JSON-schema name), ``POST /v1/embeddings``
(deterministic unit vectors) and ``GET /v1/models``.

    with ScriptedLLMServer() as server:
        server.on("ExtractedEntities", lambda req: {"entities": []})
        server.inject("429", times=2)          # the next two chat requests get HTTP 429
        client = LLMClient(base_url=server.base_url, api_key="test", model="fake")
        ...
        assert server.count("ExtractedEntities") == 1

Faults (``inject``) apply to the next matching requests: ``schema_name=None`` matches any chat
completion request; embeddings requests are matched only by ``schema_name=EMBEDDINGS``.
Fault kinds:

* an HTTP status as a string (``"429"``, ``"500"``, ``"401"``, ...): an OpenAI-style error;
* ``"timeout"``: the request is held unanswered until the client disconnects (or
  ``hold_seconds`` pass, or the server closes); recorded with status ``TIMEOUT_STATUS`` (0);
* ``"disconnect"``: the connection is closed without an answer (status 0 as well);
* ``"malformed"``: a 200 answer whose content is not valid JSON;
* ``"invalid_schema"``: a 200 answer whose content is ``{}`` (valid JSON, required fields
  missing).

By default (``check_strict=True``) a request whose schema breaks OpenAI's strict-mode rules
(objects need ``additionalProperties: false`` and every property in ``required``) is refused
with HTTP 400, as OpenAI does.

Size: one module (about 550 lines) on purpose: the server, its fault injection and its
request record are one test double that tests and benchmarks import whole.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import itertools
import logging
import math
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import orjson

log = logging.getLogger(__name__)

EMBEDDINGS = "<embeddings>"
"""Pseudo schema name under which embeddings requests are recorded and matched by faults."""
TIMEOUT_STATUS = 0
"""Status recorded for a request the server never answered (``timeout``/``disconnect``)."""

_CONTENT_FAULTS = ("malformed", "invalid_schema")
_NO_ANSWER_FAULTS = ("timeout", "disconnect")
_MALFORMED_CONTENT = '{"answer": "this JSON stops in the middle'


@dataclass(frozen=True)
class FakeRequest:
    """One request as the server saw it."""

    schema_name: str
    system: str
    user: str
    body: dict[str, Any]

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON schema of the request's ``response_format`` (empty for embeddings)."""
        fmt = self.body.get("response_format") or {}
        return (fmt.get("json_schema") or {}).get("schema") or {}


Handler = Callable[[FakeRequest], dict[str, Any]]


@dataclass
class _Fault:
    kind: str
    remaining: int
    schema_name: str | None
    retry_after: float | None

    def matches(self, schema_name: str) -> bool:
        if self.schema_name is None:
            return schema_name != EMBEDDINGS
        return self.schema_name == schema_name


@dataclass
class _Answer:
    status: int
    payload: dict[str, Any] | None = None  # None: a body that is not JSON
    headers: dict[str, str] = field(default_factory=dict)
    no_answer: str | None = None  # "timeout" or "disconnect": send nothing at all


def _no_answer(kind: str) -> _Answer:
    return _Answer(TIMEOUT_STATUS, no_answer=kind)


def estimate_tokens(text: str) -> int:
    """The server's token estimate: one token per four characters, at least one."""
    return max(1, math.ceil(len(text) / 4))


def fake_embedding(text: str, dim: int) -> list[float]:
    """A deterministic unit vector derived from a hash of ``text``."""
    values: list[float] = []
    for block in itertools.count():
        digest = hashlib.sha256(f"{block}\x00{text}".encode()).digest()
        values.extend(n / 2**31 - 1.0 for n in struct.unpack("<8I", digest))
        if len(values) >= dim:
            break
    values = values[:dim]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def strict_schema_problems(schema: Any, path: str = "$") -> list[str]:
    """Where ``schema`` breaks OpenAI strict-mode rules for objects (empty list: none)."""
    problems: list[str] = []
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            problems += strict_schema_problems(item, f"{path}[{i}]")
        return problems
    if not isinstance(schema, dict):
        return problems
    props = schema.get("properties")
    if schema.get("type") == "object" or isinstance(props, dict):
        if schema.get("additionalProperties") is not False:
            problems.append(f"{path}: object without additionalProperties: false")
        if not isinstance(props, dict):
            problems.append(f"{path}: object without properties")
        elif sorted(schema.get("required") or []) != sorted(props):
            problems.append(f"{path}: every property must be listed in required")
    for key in ("oneOf", "allOf", "not", "patternProperties", "prefixItems"):
        if key in schema:
            problems.append(f"{path}: {key} is not supported in strict mode")
    for key, value in schema.items():
        if key in ("properties", "$defs"):
            for name, sub in value.items():
                problems += strict_schema_problems(sub, f"{path}.{key}.{name}")
        elif key in ("items", "anyOf"):
            problems += strict_schema_problems(value, f"{path}.{key}")
    return problems


def _error(status: int, message: str, code: str | None = None) -> _Answer:
    kind = {
        401: "invalid_request_error",
        429: "rate_limit_exceeded",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return _Answer(
        status, {"error": {"message": message, "type": kind, "param": None, "code": code}}
    )


def _role_text(messages: list[dict[str, Any]], role: str) -> str:
    return "\n".join(_message_text(m.get("content")) for m in messages if m.get("role") == role)


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class ScriptedLLMServer:
    """OpenAI-compatible server on loopback answering from registered handlers.

    The server starts at construction; ``close()`` (or leaving the ``with`` block) stops it
    and waits for its handler threads, which never outlive it.
    """

    def __init__(
        self,
        *,
        embedding_dim: int = 384,
        latency_seconds: float = 0.0,
        hold_seconds: float = 30.0,
        api_key: str | None = None,
        check_strict: bool = True,
        model: str = "fake-model",
    ) -> None:
        self.embedding_dim = embedding_dim
        self.latency_seconds = latency_seconds
        self.hold_seconds = hold_seconds
        self.api_key = api_key
        self.check_strict = check_strict
        self.model = model
        self._handlers: dict[str, Handler] = {}
        self._faults: list[_Fault] = []
        self._requests: list[tuple[str, FakeRequest, int]] = []
        self._lock = threading.Lock()
        self._recorded = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._ids = itertools.count(1)
        self._httpd = _HTTPServer(self)
        port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.name = f"fake-llm-{port}"
        self._thread.start()
        self._closed = False

    # ---- scripting ---------------------------------------------------------------------
    def on(self, schema_name: str, handler: Handler) -> ScriptedLLMServer:
        """Answer requests whose ``response_format`` schema is named ``schema_name``."""
        with self._lock:
            self._handlers[schema_name] = handler
        return self

    def inject(
        self,
        kind: str,
        times: int = 1,
        schema_name: str | None = None,
        *,
        retry_after: float | None = None,
    ) -> ScriptedLLMServer:
        """Make the next ``times`` matching requests fail with ``kind`` (see module doc)."""
        if not (kind.isdigit() or kind in _CONTENT_FAULTS or kind in _NO_ANSWER_FAULTS):
            raise ValueError(
                f"unknown fault kind {kind!r}: use an HTTP status such as '429' or '500', "
                f"or one of {', '.join(_NO_ANSWER_FAULTS + _CONTENT_FAULTS)}"
            )
        if times < 1:
            raise ValueError("times must be at least 1")
        with self._lock:
            self._faults.append(_Fault(kind, times, schema_name, retry_after))
        return self

    @property
    def requests(self) -> list[tuple[str, FakeRequest, int]]:
        """Every request so far as ``(schema_name, request, status)`` (a copy)."""
        with self._lock:
            return list(self._requests)

    def count(self, schema_name: str | None = None, status: int | None = 200) -> int:
        """Requests for ``schema_name`` (None: any) answered with ``status`` (None: any)."""
        return sum(
            1
            for name, _, st in self.requests
            if (schema_name is None or name == schema_name) and (status is None or st == status)
        )

    def wait_for_requests(self, n: int, timeout: float = 10.0) -> bool:
        """Block until at least ``n`` requests were recorded (False if ``timeout`` passed)."""
        with self._recorded:
            return self._recorded.wait_for(lambda: len(self._requests) >= n, timeout)

    def reset(self) -> None:
        """Forget recorded requests and pending faults and set latency back to 0.

        Handlers stay registered.
        """
        with self._lock:
            self._requests.clear()
            self._faults.clear()
        self.latency_seconds = 0.0

    # ---- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Stop serving, release held requests and join every handler thread."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.drop_connections()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedLLMServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- request handling (handler threads) --------------------------------------------
    def _record(self, name: str, request: FakeRequest, status: int) -> None:
        with self._recorded:
            self._requests.append((name, request, status))
            self._recorded.notify_all()

    def _take_fault(self, schema_name: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(schema_name):
                    fault.remaining -= 1
                    if fault.remaining == 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def _handler_for(self, schema_name: str) -> Handler | None:
        with self._lock:
            return self._handlers.get(schema_name)

    def _delay(self) -> None:
        if self.latency_seconds > 0:
            self._stopping.wait(self.latency_seconds)

    def _authorised(self, authorization: str | None) -> bool:
        return self.api_key is None or authorization == f"Bearer {self.api_key}"

    def chat(self, body: dict[str, Any]) -> tuple[_Answer, str, FakeRequest | None]:
        """Answer a chat completion body: (answer, schema name, parsed request)."""
        fmt = body.get("response_format") or {}
        spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
        if not isinstance(spec, dict) or not spec.get("name"):
            return _error(400, "the fake LLM server needs response_format json_schema"), "", None
        name = str(spec["name"])
        messages = body.get("messages") or []
        request = FakeRequest(
            name, _role_text(messages, "system"), _role_text(messages, "user"), body
        )
        if self.check_strict and spec.get("strict"):
            problems = strict_schema_problems(spec.get("schema") or {})
            if problems:
                msg = f"Invalid schema for response_format '{name}': " + "; ".join(problems)
                return _error(400, msg, "invalid_json_schema"), name, request
        handler = self._handler_for(name)
        if handler is None:
            with self._lock:
                known = ", ".join(sorted(self._handlers)) or "none"
            msg = (
                f"ScriptedLLMServer has no handler for schema {name!r} (registered: {known}); "
                f"register one with server.on({name!r}, handler)"
            )
            return _error(400, msg, "unknown_schema"), name, request
        fault = self._take_fault(name)
        self._delay()
        if fault is not None and fault.kind in _NO_ANSWER_FAULTS:
            return _no_answer(fault.kind), name, request
        if fault is not None and fault.kind.isdigit():
            return self._status_fault(fault), name, request
        if fault is not None:
            content = _MALFORMED_CONTENT if fault.kind == "malformed" else "{}"
        else:
            try:
                content = orjson.dumps(handler(request)).decode()
            except Exception as exc:  # a broken test handler: tell the client why
                log.exception("fake LLM handler for %s failed", name)
                return _error(500, f"handler for {name!r} raised {exc!r}"), name, request
        return _Answer(200, self._completion(request, content)), name, request

    def embeddings(self, body: dict[str, Any]) -> tuple[_Answer, FakeRequest]:
        raw = body.get("input")
        batch = isinstance(raw, list) and bool(raw) and not isinstance(raw[0], int)
        inputs: list[Any] = raw if batch else [raw]  # type: ignore[assignment]
        texts = [t if isinstance(t, str) else str(t) for t in inputs]
        request = FakeRequest(EMBEDDINGS, "", "\n".join(texts), body)
        fault = self._take_fault(EMBEDDINGS)
        self._delay()
        if fault is not None and fault.kind in _NO_ANSWER_FAULTS:
            return _no_answer(fault.kind), request
        if fault is not None and fault.kind.isdigit():
            return self._status_fault(fault), request
        if fault is not None:
            return _Answer(200, None), request  # body that is not JSON
        dim = int(body.get("dimensions") or self.embedding_dim)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(texts):
            vector = fake_embedding(text, dim)
            value: Any = (
                base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode() if as_base64 else vector
            )
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(estimate_tokens(t) for t in texts)
        payload = {
            "object": "list",
            "data": data,
            "model": body.get("model") or self.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return _Answer(200, payload), request

    def _status_fault(self, fault: _Fault) -> _Answer:
        status = int(fault.kind)
        answer = _error(status, f"injected fault: HTTP {status}")
        if fault.retry_after is not None:
            answer.headers["retry-after"] = f"{fault.retry_after:g}"
        return answer

    def _completion(self, request: FakeRequest, content: str) -> dict[str, Any]:
        prompt = estimate_tokens(request.system + request.user)
        completion = estimate_tokens(content)
        return {
            "id": f"chatcmpl-fake-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.body.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins the handler threads
    block_on_close = True
    # Listen backlog (socketserver's default is 5): benchmarks open dozens of connections at
    # once, and a full backlog drops SYNs, which clients only retry after a second.
    request_queue_size = 128

    def __init__(self, owner: ScriptedLLMServer) -> None:
        self.owner = owner
        self._connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _RequestHandler)

    def track(self, conn: socket.socket, alive: bool) -> None:
        with self._conn_lock:
            if alive:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def drop_connections(self) -> None:
        """Shut down open (keep-alive) connections so their handler threads end."""
        with self._conn_lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _RequestHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: the headers and the body are two writes; with Nagle's algorithm the body
    # waits for the client's (delayed, up to 40 ms) ACK of the headers, on some answers only.
    disable_nagle_algorithm = True
    timeout = 120  # idle keep-alive connections; close() ends them earlier
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        self.server.track(self.connection, False)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("fake LLM: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        owner = self.server.owner
        if self.path.rstrip("/") == "/v1/models":
            model = {"id": owner.model, "object": "model", "created": 0, "owned_by": "tidegraph"}
            self._send(_Answer(200, {"object": "list", "data": [model]}))
        else:
            self._send(_error(404, f"no route GET {self.path}"))

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        route = self.path.split("?", 1)[0].rstrip("/")
        if route not in ("/v1/chat/completions", "/v1/embeddings"):
            self._send(_error(404, f"no route POST {self.path}"))
            return
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self._send(_error(400, "request body is not valid JSON"))
            return
        if not owner._authorised(self.headers.get("Authorization")):
            name = EMBEDDINGS if route.endswith("embeddings") else _schema_name(body)
            request = FakeRequest(name, "", "", body)
            owner._record(name, request, 401)
            self._send(_error(401, "Incorrect API key provided.", "invalid_api_key"))
            return
        if route == "/v1/embeddings":
            answer, request = owner.embeddings(body)
            name = EMBEDDINGS
        else:
            answer, name, maybe_request = owner.chat(body)
            request = maybe_request or FakeRequest(name, "", "", body)
        owner._record(name, request, answer.status)
        if answer.no_answer is None:
            self._send(answer)
            return
        # Never answer: hold until the client gives up (timeout), or hang up at once.
        self.close_connection = True
        if answer.no_answer == "timeout":
            self._wait_for_disconnect(owner.hold_seconds, owner._stopping)

    def _wait_for_disconnect(self, bound: float, stopping: threading.Event) -> None:
        deadline = time.monotonic() + bound
        conn = self.connection
        while not stopping.is_set() and time.monotonic() < deadline:
            try:
                readable, _, _ = select.select([conn], [], [], 0.05)
                if readable and not conn.recv(1, socket.MSG_PEEK):
                    return  # the client closed the connection
            except (OSError, ValueError):
                return

    def _send(self, answer: _Answer) -> None:
        if answer.payload is None:
            data = b"<html>not json</html>"
            content_type = "text/html"
        else:
            data = orjson.dumps(answer.payload)
            content_type = "application/json"
        try:
            self.send_response(answer.status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for key, value in answer.headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the client went away


def _schema_name(body: dict[str, Any]) -> str:
    fmt = body.get("response_format") or {}
    spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
    return str(spec.get("name", "")) if isinstance(spec, dict) else ""
