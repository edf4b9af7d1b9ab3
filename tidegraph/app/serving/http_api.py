"""``tidegraph serve``: the memory over HTTP for agents (docs/serving.md "Serving memory to
agents").

A FastAPI app over one ``MemoryService``: add episodes, search, context, facts as of a time,
entities, an episode's status, dead-letter counts; ``/healthz``, ``/readyz``, ``/metrics`` and
the OpenAPI docs at ``/docs``. Every ``/v1`` route needs an API key (``Authorization: Bearer``
or ``X-API-Key``) when keys are configured, and is scoped to the key's groups.

Every error, the framework's own included (unknown route, method, bad JSON, invalid UTF-8, a
body too large or too slow), is answered as one JSON shape, ``ErrorOut``; a failure no handler
answered is a 500 of that shape, logged once.
"""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Annotated, Any

import orjson
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidegraph.app.serving.models import (
    AddEpisodeIn,
    AddEpisodeOut,
    ContextIn,
    ContextOut,
    EpisodeStatusOut,
    ErrorOut,
    FactsIn,
    GroupIn,
    GroupsIn,
    SearchIn,
    SearchOut,
    error_body,
    send_error,
)
from tidegraph.app.serving.server import BodyGuard
from tidegraph.app.serving.service import MemoryService, ServiceError, warm_time_phrases
from tidegraph.app.serving.settings import KeyRing, Principal, bearer_or_header
from tidegraph.metrics import HTTP_ERRORS, HTTP_LATENCY, HTTP_REQUESTS
from tidegraph.records import jsontext

log = logging.getLogger("tidegraph.serve")

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 408, 409, 413, 422, 429)
}
ADD_STATUS = {"written": 201, "skipped": 200, "queued": 202, "failed": 422}
# Every field name of a request, for "did you mean" in an unknown field's 422.
KNOWN_FIELDS = sorted({*ContextIn.model_fields, *AddEpisodeIn.model_fields, "group_id"})
# The framework's own errors, by status: their error codes.
HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}


class Unauthorized(ServiceError):
    status, code = 401, "unauthorized"


class ORJSONResponse(JSONResponse):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class ExactJSONRequest(Request):
    """A request whose JSON body is read by ``jsontext.loads``: integers exact, and invalid
    UTF-8 or a lone surrogate escape a JSON error (a 422) like any other bad JSON."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = jsontext.loads(await self.body())
        return self._json


class ExactJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(ExactJSONRequest(request.scope, request.receive))

        return route


def create_app(
    open_service: Callable[[], Awaitable[MemoryService]],
    keys: KeyRing,
    *,
    max_body_bytes: int = 1_048_576,
    body_timeout_seconds: float = 30.0,
) -> FastAPI:
    """The app; ``open_service`` is awaited at startup (in the server's event loop) and the
    memory closed at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = await open_service()
        app.state.service = service
        await warm_time_phrases()
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
    app.router.route_class = ExactJSONRoute
    app.add_middleware(BodyGuard, max_bytes=max_body_bytes, timeout=body_timeout_seconds)
    app.add_middleware(Measured)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> Response:
        request.scope["tidegraph.error"] = exc.code
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return ORJSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        request.scope["tidegraph.error"] = "invalid"
        problems = [_problem(e) for e in exc.errors()]
        first = problems[0] if problems else {"field": "body", "message": "invalid"}
        body = {
            "error": "invalid",
            "message": f"{first['field']}: {first['message']}",
            "field": first["field"],
            "problems": problems,
        }
        return ORJSONResponse(body, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def framework_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        request.scope["tidegraph.error"] = code
        message = {
            404: f"no route {request.url.path}: see /docs for the routes",
            405: f"{request.method} is not a method of {request.url.path}: see /docs",
        }.get(exc.status_code, str(exc.detail))
        body = orjson.loads(error_body(code, message))
        return ORJSONResponse(body, status_code=exc.status_code, headers=exc.headers)

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
    added: dict[int | str, dict[str, Any]] = {
        201: {"description": "written"},
        200: {"model": AddEpisodeOut, "description": "skipped (added before)"},
        202: {"model": AddEpisodeOut, "description": "queued (via Kafka)"},
    }

    @app.post(
        "/v1/episodes",
        response_model=AddEpisodeOut,
        status_code=201,
        tags=["memory"],
        responses=added,
    )
    async def add_episode(body: AddEpisodeIn, who: Principal = Who, svc: MemoryService = Svc):
        """Add an episode (``reference_time`` required). 201 written, 200 skipped (the same
        episode_id again), 202 queued (via Kafka; read it with ``wait_for``: the token), 422
        failed (``reason``). The token makes a later read wait for this episode."""
        result, token = await svc.add(who, body)
        failed = "episode_failed" if result.status == "failed" else None
        out = AddEpisodeOut(**result.as_json(), token=token, error=failed)
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
        body: Annotated[SearchIn, Query()], who: Principal = Who, svc: MemoryService = Svc
    ):
        """``POST /v1/search`` with query parameters (repeat ``group_ids`` and ``wait_for``
        for several)."""
        return await svc.search(who, body)

    @app.post("/v1/context", response_model=ContextOut, tags=["memory"])
    async def context(body: ContextIn, who: Principal = Who, svc: MemoryService = Svc):
        """The context text for an agent's prompt (facts with their dates, entities,
        communities, episode excerpts) within ``max_chars``."""
        return await svc.context(who, body)

    @app.get("/v1/facts", tags=["memory"])
    async def facts(
        body: Annotated[FactsIn, Query()], who: Principal = Who, svc: MemoryService = Svc
    ) -> dict[str, Any]:
        """Facts valid at ``valid_at`` as believed at ``known_at`` (like ``tidegraph
        facts``)."""
        return {"facts": await svc.facts(who, body)}

    @app.get("/v1/entities", tags=["memory"])
    async def entities(
        body: Annotated[GroupIn, Query()], who: Principal = Who, svc: MemoryService = Svc
    ) -> dict[str, Any]:
        """The group's entities, by name."""
        return {"entities": await svc.entities(who, body.group_id)}

    @app.get("/v1/episodes/{episode_id}/status", response_model=EpisodeStatusOut, tags=["memory"])
    async def episode_status(
        episode_id: Annotated[str, Path(max_length=512)],
        body: Annotated[GroupIn, Query()],
        who: Principal = Who,
        svc: MemoryService = Svc,
    ):
        """written, not_extracted (stored, facts pending an LLM), queued, dead_lettered or
        failed (with the reason); 404 when this server never saw it."""
        return await svc.episode_status(who, body.group_id, episode_id)

    @app.get("/v1/dlq", tags=["memory"])
    async def dead_letters(
        body: Annotated[GroupsIn, Query()], who: Principal = Who, svc: MemoryService = Svc
    ) -> dict[str, Any]:
        """Dead letters of the key's groups, counted by group, stage and reason."""
        return await svc.dead_letter_counts(who, body.group_ids)

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
        """Prometheus metrics (text exposition format)."""
        from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return app


def _problem(error: Any) -> dict[str, str]:
    """One field problem of a 422: the field (dotted, without body/query) and what to do."""
    if error["type"] == "json_invalid":  # its location is a position in the text
        detail = error.get("ctx", {}).get("error", "invalid")
        return {"field": "body", "message": f"the body is not JSON: {detail}"}
    where = [str(p) for p in error["loc"][1:]]
    field = ".".join(where) or "body"
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden" and where:
        message = "unknown field"
        known = [name for name in KNOWN_FIELDS if name != where[-1]]
        if close := difflib.get_close_matches(where[-1], known, n=1):
            message += f"; did you mean {close[0]!r}?"
    return {"field": field, "message": message}


# ----------------------------------------------------------------------------- middleware
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
                text = f"the server failed: {type(exc).__name__} (see the server's log)"
                await send_error(send, 500, "internal", text, [])
        finally:
            # No answer sent and nothing failed: the client went away first (nginx's 499).
            status = status or 499
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
