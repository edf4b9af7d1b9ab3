"""``tidegraph serve``: the memory over HTTP for agents (docs/serving.md "Serving memory to
agents").

A FastAPI app over one ``MemoryService``: add episodes, search, context, facts as of a time,
entities, an episode's status, dead-letter counts; ``/healthz``, ``/readyz``, ``/metrics`` and
the OpenAPI docs at ``/docs``. Every ``/v1`` route needs an API key (``Authorization: Bearer``
or ``X-API-Key``) when keys are configured, and is scoped to the key's groups.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidegraph.app.serving.models import (
    AddEpisodeIn,
    AddEpisodeOut,
    ContextIn,
    ContextOut,
    EpisodeStatusOut,
    ErrorOut,
    SearchIn,
    SearchOut,
    send_error,
)
from tidegraph.app.serving.service import MemoryService, ServiceError
from tidegraph.app.serving.settings import KeyRing, Principal, bearer_or_header
from tidegraph.metrics import HTTP_ERRORS, HTTP_LATENCY, HTTP_REQUESTS

log = logging.getLogger("tidegraph.serve")

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 409, 413, 422)
}
ADD_STATUS = {"written": 201, "skipped": 200, "queued": 202, "failed": 422}


class Unauthorized(ServiceError):
    status, code = 401, "unauthorized"


class ORJSONResponse(JSONResponse):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def create_app(
    open_service: Callable[[], Awaitable[MemoryService]],
    keys: KeyRing,
    *,
    max_body_bytes: int = 1_048_576,
) -> FastAPI:
    """The app; ``open_service`` is awaited at startup (in the server's event loop) and the
    memory closed at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = await open_service()
        app.state.service = service
        try:
            yield
        finally:
            await service.memory.close()

    app = FastAPI(
        title="tidegraph memory",
        version="1",
        description="Bi-temporal knowledge-graph memory for agents: add episodes, search, "
        "context, facts as of a time. Every /v1 route is scoped to the API key's groups.",
        lifespan=lifespan,
        default_response_class=ORJSONResponse,
        responses=ERRORS,
    )
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(Measured)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> Response:
        request.scope["tidegraph.error"] = exc.code
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return ORJSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        request.scope["tidegraph.error"] = "invalid"
        problems = [
            {"field": ".".join(str(p) for p in e["loc"][1:]) or "body", "message": e["msg"]}
            for e in exc.errors()
        ]
        first = problems[0] if problems else {"field": "body", "message": "invalid"}
        body = {
            "error": "invalid",
            "message": f"{first['field']}: {first['message']}",
            "field": first["field"],
            "problems": problems,
        }
        return ORJSONResponse(body, status_code=422)

    def service(request: Request) -> MemoryService:
        return request.app.state.service

    def principal(request: Request) -> Principal:
        key = bearer_or_header(
            request.headers.get("authorization"), request.headers.get("x-api-key")
        )
        found = keys.principal(key)
        if found is None:
            raise Unauthorized(
                "missing API key: send Authorization: Bearer <key> or X-API-Key: <key>"
                if key is None
                else "unknown API key"
            )
        request.scope["tidegraph.key"] = found.key_id
        return found

    Who = Depends(principal)
    Svc = Depends(service)

    # ---------------------------------------------------------------------- writing
    @app.post("/v1/episodes", response_model=AddEpisodeOut, status_code=201, tags=["memory"])
    async def add_episode(body: AddEpisodeIn, who: Principal = Who, svc: MemoryService = Svc):
        """Add an episode (``reference_time`` required). 201 written, 200 skipped (the same
        episode_id again), 202 queued (via Kafka; read it with ``wait_for``: the token), 422
        failed (``reason``). The token makes a later read wait for this episode."""
        result, token = await svc.add(who, body)
        out = AddEpisodeOut(**result.as_json(), token=token)
        return ORJSONResponse(
            out.model_dump(exclude_none=True), status_code=ADD_STATUS[result.status]
        )

    # ---------------------------------------------------------------------- reading
    @app.post("/v1/search", response_model=SearchOut, tags=["memory"])
    async def search_post(body: SearchIn, who: Principal = Who, svc: MemoryService = Svc):
        """Facts, entities, episodes and communities answering ``query``, valid at
        ``valid_at`` as known at ``known_at``; ``wait_for`` tokens first (409 when not
        queryable within the wait)."""
        return await svc.search(who, body)

    @app.get("/v1/search", response_model=SearchOut, tags=["memory"])
    async def search_get(
        query: str,
        group_id: list[str] | None = Query(None, description="Repeat for several groups."),
        valid_at: str | None = None,
        known_at: str | None = None,
        recipe: str = "combined",
        limit: int | None = None,
        include_invalid: bool = False,
        wait_for: list[str] | None = Query(None, description="Tokens; repeat for several."),
        wait_timeout_seconds: float | None = None,
        who: Principal = Who,
        svc: MemoryService = Svc,
    ):
        """``POST /v1/search`` with query parameters."""
        body = _validated(
            SearchIn,
            query=query,
            group_ids=group_id,
            valid_at=valid_at,
            known_at=known_at,
            recipe=recipe,
            limit=limit,
            include_invalid=include_invalid,
            wait_for=wait_for or [],
            wait_timeout_seconds=wait_timeout_seconds,
        )
        return await svc.search(who, body)

    @app.post("/v1/context", response_model=ContextOut, tags=["memory"])
    async def context(body: ContextIn, who: Principal = Who, svc: MemoryService = Svc):
        """The context text for an agent's prompt (facts with their dates, entities,
        communities, episode excerpts) within ``max_chars``."""
        return await svc.context(who, body)

    @app.get("/v1/facts", tags=["memory"])
    async def facts(
        group_id: str | None = None,
        valid_at: str | None = None,
        known_at: str | None = None,
        include_invalid: bool = False,
        wait_for: list[str] | None = Query(None),
        wait_timeout_seconds: float | None = Query(None, gt=0, le=60),
        who: Principal = Who,
        svc: MemoryService = Svc,
    ) -> dict[str, Any]:
        """Facts valid at ``valid_at`` as believed at ``known_at`` (like ``tidegraph
        facts``)."""
        rows = await svc.facts(
            who,
            group_id,
            valid_at=valid_at,
            known_at=known_at,
            include_invalid=include_invalid,
            wait_for=wait_for,
            wait_timeout_seconds=wait_timeout_seconds,
        )
        return {"facts": rows}

    @app.get("/v1/entities", tags=["memory"])
    async def entities(
        group_id: str | None = None, who: Principal = Who, svc: MemoryService = Svc
    ) -> dict[str, Any]:
        """The group's entities, by name."""
        return {"entities": await svc.entities(who, group_id)}

    @app.get("/v1/episodes/{episode_id}/status", response_model=EpisodeStatusOut, tags=["memory"])
    async def episode_status(
        episode_id: str, group_id: str | None = None, who: Principal = Who, svc: MemoryService = Svc
    ):
        """written, not_extracted (stored, facts pending an LLM), queued, dead_lettered or
        failed (with the reason); 404 when this server never saw it."""
        return await svc.episode_status(who, group_id, episode_id)

    @app.get("/v1/dlq", tags=["memory"])
    async def dead_letters(
        group_id: list[str] | None = Query(None), who: Principal = Who, svc: MemoryService = Svc
    ) -> dict[str, Any]:
        """Dead letters of the key's groups, counted by group, stage and reason."""
        return await svc.dead_letter_counts(who, group_id)

    # ---------------------------------------------------------------------- operations
    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        """Liveness: the process and its event loop answer."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"])
    async def readyz(request: Request) -> Response:
        """Readiness: the store answers."""
        svc: MemoryService | None = getattr(request.app.state, "service", None)
        if svc is None:
            return ORJSONResponse({"status": "starting"}, status_code=503)
        try:
            await svc.ready()
        except Exception as exc:  # any store failure means not ready
            body = {"status": "unavailable", "failed": ["store"], "error": type(exc).__name__}
            return ORJSONResponse(body, status_code=503)
        return ORJSONResponse({"status": "ready", "store": svc.store.name})

    @app.get("/metrics", tags=["operations"])
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return app


def _validated(model: type[SearchIn], **values: Any) -> SearchIn:
    from pydantic import ValidationError

    try:
        return model(**values)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("query", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None


# ----------------------------------------------------------------------------- middleware
class TooLarge(Exception):
    pass


class BodyLimit:
    """413 for a request body over ``max_bytes`` (by Content-Length, or counted as it
    streams in)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(scope, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except TooLarge:
            await self._refuse(scope, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        scope["tidegraph.error"] = "too_large"
        message = (
            f"the request body is over {self.max_bytes} bytes "
            "(TIDEGRAPH_SERVE_MAX_BODY_BYTES): send less content per episode"
        )
        await send_error(send, 413, "too_large", message, [(b"connection", b"close")])


class Measured:
    """Requests, latency and errors per route template (``tidegraph_http_*``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:  # a failure no handler answered: a 500 that keeps the connection
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            scope["tidegraph.error"] = "internal"
            if not status:
                status = 500
                body = orjson.dumps(
                    {"error": "internal", "message": f"the server failed: {type(exc).__name__}"}
                )
                headers = [(b"content-type", b"application/json")]
                await send({"type": "http.response.start", "status": 500, "headers": headers})
                await send({"type": "http.response.body", "body": body})
        finally:
            status = status or 500
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope.get("method", "")
            HTTP_REQUESTS.labels(route, method, str(status)).inc()
            HTTP_LATENCY.labels(route, method).observe(time.perf_counter() - started)
            if status >= 400:
                HTTP_ERRORS.labels(route, scope.get("tidegraph.error") or str(status)).inc()
            if route not in ("/metrics", "/healthz", "/readyz"):
                log.info(
                    "%s %s status=%s ms=%.1f key=%s",
                    method,
                    route,
                    status,
                    (time.perf_counter() - started) * 1000,
                    scope.get("tidegraph.key", "-"),
                )
