"""``tidegraph serve``: the memory over HTTP for agents (docs/serving.md "Serving memory to
agents").

A FastAPI app over one ``MemoryService``: add episodes, search, context, facts as of a time,
entities, an episode's status, dead-letter counts; the lifecycle (forget, browse episodes and
groups, the change stream as a long poll or server-sent events); ``/healthz``, ``/readyz``,
``/metrics`` and the OpenAPI docs at ``/docs``. Every ``/v1`` route needs an API key
(``Authorization: Bearer`` or ``X-API-Key``) when keys are configured, and is scoped to the
key's groups.

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
from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidegraph.app.browse import ChangePage, ForgetResult
from tidegraph.app.serving.errors import (
    BadRequest,
    ServiceError,
    store_down,
)
from tidegraph.app.serving.models import (
    MAX_SEQ,
    AddEpisodeIn,
    AddEpisodeOut,
    ChangesIn,
    ContextIn,
    ContextOut,
    EpisodesIn,
    EpisodeStatusOut,
    ErrorOut,
    FactsIn,
    ForgetEpisodeIn,
    ForgetIn,
    GroupIn,
    GroupsIn,
    SearchIn,
    SearchOut,
    error_body,
    send_error,
)
from tidegraph.app.serving.server import BodyGuard
from tidegraph.app.serving.service import MemoryService
from tidegraph.app.serving.settings import KeyRing, Principal, bearer_or_header
from tidegraph.app.serving.times import warm_time_phrases
from tidegraph.metrics import HTTP_ERRORS, HTTP_LATENCY, HTTP_REQUESTS
from tidegraph.pipelines.collector import settle_collector
from tidegraph.records import jsontext
from tidegraph.stores.errors import StoreUnreachable

log = logging.getLogger("tidegraph.serve")

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 408, 409, 413, 422, 429)
}
ADD_STATUS = {"written": 201, "skipped": 200, "queued": 202, "failed": 422}
FORGET_STATUS = {"forgotten": 200, "dry_run": 200, "queued": 202}
# Every field name of a request, for "did you mean" in an unknown field's 422.
KNOWN_FIELDS = sorted(
    {
        *ContextIn.model_fields,
        *AddEpisodeIn.model_fields,
        *ForgetIn.model_fields,
        *EpisodesIn.model_fields,
        *ChangesIn.model_fields,
    }
)
STREAM_PING_SECONDS = 15  # a comment line on an idle change stream keeps proxies from closing it
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
    settle_gc: bool = False,
) -> FastAPI:
    """The app; ``open_service`` is awaited at startup (in the server's event loop) and the
    memory closed at shutdown. ``settle_gc``: the process is the server's own
    (``settle_collector`` once started)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = await open_service()
        app.state.service = service
        await warm_time_phrases()
        await service.start()  # the outbox pruned once before the first request
        if settle_gc:
            settle_collector()
        try:
            yield
        finally:
            await service.close()

    app = FastAPI(
        title="tidegraph memory",
        version="1",
        description="Bi-temporal knowledge-graph memory for agents: add episodes, search, "
        "context, facts as of a time. Every /v1 route is scoped to the API key's groups.",
        lifespan=lifespan,
        default_response_class=ORJSONResponse,
        responses=ERRORS,
        # A path with a trailing slash is no route (404), never a redirect: Starlette builds
        # a redirect's Location from the client's Host header.
        redirect_slashes=False,
    )
    app.router.route_class = ExactJSONRoute
    app.add_middleware(BodyGuard, max_bytes=max_body_bytes, timeout=body_timeout_seconds)
    app.add_middleware(Measured)

    _add_error_handlers(app)
    who, svc = _dependencies(keys)
    _add_write_routes(app, who, svc)
    _add_read_routes(app, who, svc)
    _add_forget_routes(app, who, svc)
    _add_browse_routes(app, who, svc)
    _add_change_routes(app, who, svc)
    _add_operation_routes(app)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in the one shape (``ErrorOut``): the service's, a field that is not valid
    (422, field by field), the framework's own (unknown route, method, ...)."""

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> Response:
        request.scope["tidegraph.error"] = exc.code
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        if "retry_after_seconds" in exc.extra:
            headers = {"Retry-After": str(exc.extra["retry_after_seconds"])}
        return ORJSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(StoreUnreachable)
    async def store_unreachable(request: Request, exc: StoreUnreachable) -> Response:
        return await service_error(request, store_down(exc))

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


def _dependencies(keys: KeyRing) -> tuple[Any, Any]:
    """The route parameters ``who`` (the caller of the request's API key, or a 401) and
    ``svc`` (the app's ``MemoryService``). Both are coroutines: FastAPI runs a plain
    function dependency on a worker thread, a hand-off per request for a dictionary read."""

    async def service(request: Request) -> MemoryService:
        return request.app.state.service

    async def principal(request: Request) -> Principal:
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

    return Depends(principal), Depends(service)


# The route groups below take the dependencies ``Who`` and ``Svc`` as parameter defaults.
def _add_write_routes(app: FastAPI, Who: Any, Svc: Any) -> None:
    """Adding an episode."""

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


def _add_read_routes(app: FastAPI, Who: Any, Svc: Any) -> None:
    """Reading the memory: search, context, facts, entities, an episode's status,
    dead-letter counts."""

    @app.post("/v1/search", response_model=SearchOut, tags=["memory"])
    async def search_post(body: SearchIn, who: Principal = Who, svc: MemoryService = Svc):
        """Facts, entities, episodes and communities answering ``query``, valid at
        ``valid_at`` as known at ``known_at``; ``wait_for`` tokens first (409 when not
        queryable within the wait)."""
        return ORJSONResponse(await svc.search(who, body))  # built as SearchOut says

    @app.get("/v1/search", response_model=SearchOut, tags=["memory"])
    async def search_get(
        body: Annotated[SearchIn, Query()], who: Principal = Who, svc: MemoryService = Svc
    ):
        """``POST /v1/search`` with query parameters (repeat ``group_ids`` and ``wait_for``
        for several)."""
        return ORJSONResponse(await svc.search(who, body))

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


def _add_forget_routes(app: FastAPI, Who: Any, Svc: Any) -> None:
    """Forgetting (docs/serving.md "Lifecycle"): an episode, a subject, a group."""

    forgot: dict[int | str, dict[str, Any]] = {
        200: {"description": "forgotten, or what would go (dry_run)"},
        202: {"description": "queued (via Kafka: a forget record, run in the group's order)"},
    }

    def forget_answer(result: ForgetResult) -> Response:
        return ORJSONResponse(result.as_json(), status_code=FORGET_STATUS[result.status])

    @app.delete("/v1/episodes/{episode_id}", tags=["lifecycle"], responses=forgot)
    async def forget_episode(
        episode_id: Annotated[str, Path(max_length=512)],
        body: Annotated[ForgetEpisodeIn, Query()],
        who: Principal = Who,
        svc: MemoryService = Svc,
    ) -> Response:
        """Forget one episode (its episode_id, or its uuid): the graph is then the one the
        group's other episodes give (docs/architecture.md "Forgetting"). 200 with what went
        (``dry_run``: what would go, nothing written), 202 queued via Kafka, 404 when the group
        holds no such episode, 409 forget_refused when it cannot be done (the message says
        why)."""
        result = await svc.forget_episode(who, body.group_id, episode_id, dry_run=body.dry_run)
        return forget_answer(result)

    @app.post("/v1/forget", tags=["lifecycle"], responses=forgot)
    async def forget(body: ForgetIn, who: Principal = Who, svc: MemoryService = Svc) -> Response:
        """Forget episodes by id, every episode that mentions a subject (an entity's uuid, key
        or name: a person asking to be erased), or a whole group (a tenant leaving); exactly
        one of ``episode_ids``, ``subject``, ``group``. 200 with what went (``dry_run``: what
        would go), 202 queued via Kafka, 409 forget_refused when it cannot be done (no such
        subject, several entities of that name, the LLM needed to replay)."""
        return forget_answer(await svc.forget(who, body))


def _add_browse_routes(app: FastAPI, Who: Any, Svc: Any) -> None:
    """Browsing (docs/serving.md "Lifecycle"): a group's episodes, one episode, the groups
    a key may read."""

    @app.get("/v1/episodes", tags=["lifecycle"])
    async def episodes(
        body: Annotated[EpisodesIn, Query()], who: Principal = Who, svc: MemoryService = Svc
    ) -> dict[str, Any]:
        """The group's episodes by event time, a page at a time: pass ``next_cursor`` back as
        ``cursor`` (null: the last page). ``status`` dead_lettered reads the dead-letter topic
        (in-process: the adds that failed in this server). 400 for a cursor not of this
        listing."""
        return await svc.episodes(who, body)

    @app.get("/v1/episodes/{episode_id}", tags=["lifecycle"])
    async def episode(
        episode_id: Annotated[str, Path(max_length=512)],
        body: Annotated[GroupIn, Query()],
        who: Principal = Who,
        svc: MemoryService = Svc,
    ) -> dict[str, Any]:
        """One episode (its episode_id, or its uuid) with what it produced: the entities it
        mentions and the facts it supports; a forgotten one as its tombstone; 404 when the
        group holds none such."""
        return await svc.episode(who, body.group_id, episode_id)

    @app.get("/v1/groups", tags=["lifecycle"])
    async def groups(who: Principal = Who, svc: MemoryService = Svc) -> dict[str, Any]:
        """The groups this key may read, each with its episodes, entities, facts and the
        change stream's last seq (without API keys: every group of the store)."""
        return await svc.readable_groups(who)


def _add_change_routes(app: FastAPI, Who: Any, Svc: Any) -> None:
    """The change stream (docs/streaming.md "Change stream"): a read, a long poll or
    server-sent events."""

    streamed: dict[int | str, dict[str, Any]] = {
        200: {
            "description": "the changes after the cursor; with Accept: text/event-stream a "
            "stream of them, one event each (id: its seq)",
            "content": {"text/event-stream": {}},
        }
    }

    @app.get("/v1/changes", tags=["lifecycle"], responses=streamed)
    async def changes(
        request: Request,
        body: Annotated[ChangesIn, Query()],
        last_event_id: Annotated[str | None, Header(max_length=32)] = None,
        who: Principal = Who,
        svc: MemoryService = Svc,
    ) -> Response:
        """The group's committed changes after ``after``, in commit order, with the cursor to
        pass back (docs/streaming.md "Change stream"); ``wait_seconds``: a long poll,
        answered as soon as a change is committed. With ``Accept: text/event-stream``, a
        stream of server-sent events (``change``, id = its seq; a reconnect's
        ``Last-Event-ID`` resumes after it) for as long as the client reads. A poll that waits
        and a stream each hold one of the key's TIDEGRAPH_SERVE_WAITS_PER_KEY slots. 400 for
        a cursor past the group's last change."""
        if "text/event-stream" not in request.headers.get("accept", ""):
            return ORJSONResponse(await svc.changes(who, body))
        after = body.after if last_event_id is None else _event_id(last_event_id)
        group = await svc.change_cursor(who, body.group_id, after)
        release = svc.hold_wait(who, "stream")
        pages = svc.change_stream(who, group, after, body.limit, release)
        return ChangeEvents(_events(pages), release, ping=STREAM_PING_SECONDS)


def _add_operation_routes(app: FastAPI) -> None:
    """``/healthz``, ``/readyz``, ``/metrics``."""

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


def _event_id(value: str) -> int:
    """The seq of a ``Last-Event-ID`` header (an event id this server sent)."""
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_SEQ:
        raise BadRequest(
            "Last-Event-ID: not an event id of this stream (a change's seq)", field="Last-Event-ID"
        )
    return int(text)


async def _events(pages: AsyncIterator[ChangePage]) -> AsyncIterator[ServerSentEvent]:
    """Each change of ``pages`` as an event; a cursor that stops holding ends the stream
    with an ``error`` event of the error shape."""
    try:
        async for page in pages:
            for change in page.changes:
                data = orjson.dumps(change.model_dump(mode="json")).decode()
                yield ServerSentEvent(data, event="change", id=str(change.seq))
    except ServiceError as exc:
        yield ServerSentEvent(orjson.dumps(exc.body()).decode(), event="error")
    finally:
        await pages.aclose()  # type: ignore[attr-defined]


class ChangeEvents(EventSourceResponse):
    """A change stream that frees its wait slot however it ends (the client gone before the
    first event, the server stopping, an error)."""

    def __init__(self, content: Any, release: Callable[[], None], **options: Any) -> None:
        super().__init__(content, **options)
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


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
