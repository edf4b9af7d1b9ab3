"""How ``tidegraph serve`` and ``tidegraph mcp --transport http`` meet slow or oversized
clients (docs/serving.md "Serving memory to agents"): uvicorn with a deadline for a request's
headers (``TimedH11Protocol``), and ``BodyGuard``, which receives a request's body, within a
size and a deadline, before the app sees it. Both answer in the one error shape
(``ErrorOut``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from tidegraph.app.serving.models import error_body, send_error
from tidegraph.app.serving.settings import ServeSettings


class BodyGuard:
    """Reads a request's body before the app sees it: 413 for one over ``max_bytes`` (by
    Content-Length, or counted as it streams in, chunked or not), 408 for one not received
    within ``timeout`` seconds. The app then reads the body from memory."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._too_large(scope, send)
            return
        chunks: list[bytes] = []
        seen = 0
        deadline = asyncio.get_running_loop().time() + self.timeout
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                scope["tidegraph.error"] = "body_timeout"
                text = f"the request body did not arrive within {self.timeout:g} s"
                await send_error(send, 408, "body_timeout", text, [(b"connection", b"close")])
                return
            if message["type"] == "http.disconnect":  # gone, or its bytes were not HTTP
                scope["tidegraph.error"] = "disconnected"
                return
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                await self._too_large(scope, send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, send: Send) -> None:
        scope["tidegraph.error"] = "too_large"
        message = (
            f"the request body is over {self.max_bytes} bytes "
            "(TIDEGRAPH_SERVE_MAX_BODY_BYTES): send less content per episode"
        )
        await send_error(send, 413, "too_large", message, [(b"connection", b"close")])


class TimedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's headers: a connection
    that opens (or, between requests, starts one) and has not sent the whole head within
    ``header_timeout`` seconds is answered 408 and closed. uvicorn itself only bounds idle
    keep-alive time, so a client sending a byte a second held its connection for good."""

    header_timeout = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        waiting_for_head = before is None or before.response_complete
        if waiting_for_head:
            self._arm()
        super().data_received(data)
        if self.cycle is not before:  # a request's head arrived: its cycle began
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """A request that is not HTTP/1.1 (bad bytes in its head, a head over h11's limit):
        400 in the one error shape, then close."""
        self._disarm()
        body = error_body("bad_http", f"not a valid HTTP/1.1 request: {msg}")
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers)))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:  # the connection is past answering
            pass
        self.transport.close()

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered: its own deadlines apply
        body = error_body(
            "header_timeout",
            f"the request's headers did not arrive within {self.header_timeout:g} s",
        )
        head = (
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        self.transport.write(head + body)
        self.transport.close()


def uvicorn_config(
    app: Any, host: str, port: int, settings: ServeSettings, **options: Any
) -> uvicorn.Config:
    """The uvicorn configuration both servers run with (the header deadline of
    ``settings``)."""

    class Protocol(TimedH11Protocol):
        header_timeout = settings.serve_header_timeout_seconds

    return uvicorn.Config(app, host=host, port=port, http=Protocol, server_header=False, **options)
