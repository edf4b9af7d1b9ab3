"""``tidegraph mcp``: the memory as Model Context Protocol tools (docs/serving.md "Serving memory to
agents"), on the official SDK's FastMCP, over stdio or streamable HTTP.

Tools: add_memory, search_facts, search_entities, search_episodes, get_context, facts_as_of,
episode_status. Every tool is scoped: over stdio to the ``--group`` ids the server was started
with; over HTTP to the caller's API key's groups (and, when given, only those of them also in
``--group``), or to ``--group`` when no keys are configured (then loopback only). A tool asked
for another group fails with an error naming the group.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

import anyio
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidegraph.app.serving.models import (
    AddEpisodeIn,
    ContextIn,
    FactsIn,
    SearchIn,
    send_error,
)
from tidegraph.app.serving.server import BodyGuard
from tidegraph.app.serving.service import MemoryService, ServiceError
from tidegraph.app.serving.settings import KeyRing, Principal, ServeSettings, bearer_or_header
from tidegraph.metrics import MCP_TOOL_CALLS
from tidegraph.records import jsontext

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")

log = logging.getLogger("tidegraph.mcp")

INSTRUCTIONS = """\
tidegraph is a bi-temporal memory: every fact has when it was true (valid_at/invalid_at) and
when it was learned. Add what happens with add_memory, always with its reference_time (when it
happened, ISO 8601). Recall with get_context (a ready-to-read summary) or search_facts /
search_entities / search_episodes; facts_as_of lists what was true at a moment. To read your
own write, pass the token add_memory returned as wait_for."""


class ClosedStreamIsNoError(logging.Filter):
    """The SDK (mcp 1.30, ``streamable_http.standalone_sse_writer``) logs a traceback when a
    client ends its session while its notification stream is open (anyio's
    ClosedResourceError): an ordinary close, logged here as one DEBUG line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, anyio.ClosedResourceError):
            log.debug("an MCP client closed its stream: %s", record.getMessage())
            return False
        return True


logging.getLogger("mcp.server.streamable_http").addFilter(ClosedStreamIsNoError())


class Scoping:
    """Who a tool call is: the fixed groups (stdio, or HTTP without keys) or the API key of
    the HTTP request, narrowed to ``groups`` when given."""

    def __init__(self, keys: KeyRing, groups: list[str] | None) -> None:
        self.keys = keys
        self.groups = frozenset(groups) if groups else None

    def principal(self, ctx: Context[Any, Any, Any]) -> Principal:
        request = ctx.request_context.request
        if request is None or not self.keys.enabled:  # stdio, or HTTP on loopback without keys
            if self.groups is None:
                raise ToolError("this MCP server was started without --group: it serves none")
            return Principal(self.groups, "mcp", server_scope=True)
        headers = getattr(request, "headers", {})
        found = self.keys.principal(
            bearer_or_header(headers.get("authorization"), headers.get("x-api-key"))
        )
        if found is None or found.groups is None:
            raise ToolError("missing or unknown API key")
        allowed = found.groups & self.groups if self.groups is not None else found.groups
        return Principal(allowed, found.key_id)


class Holder:
    """One memory per process, opened on first use."""

    def __init__(self, open_service: Callable[[], Awaitable[MemoryService]]) -> None:
        self.open_service = open_service
        self.service: MemoryService | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> MemoryService:
        async with self._lock:
            if self.service is None:
                self.service = await self.open_service()
            return self.service

    async def close(self) -> None:
        if self.service is not None:
            await self.service.memory.close()
            self.service = None


def build_mcp(
    holder: Holder,
    scoping: Scoping,
    *,
    stdio: bool = True,
    host: str = "127.0.0.1",
    port: int = 8765,
) -> FastMCP:
    """The MCP server over ``holder``'s memory (opened on the first tool call, in the
    server's event loop; over stdio closed when the session ends)."""

    @asynccontextmanager
    async def lifespan(_: FastMCP) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if stdio:  # over HTTP it runs per session: the app's shutdown closes the memory
                await holder.close()

    mcp = FastMCP("tidegraph", instructions=INSTRUCTIONS, lifespan=lifespan, host=host, port=port)

    async def call(tool: str, ctx: Context[Any, Any, Any], run: Callable[..., Awaitable[Any]]):
        try:
            who = scoping.principal(ctx)
            result = await run(await holder.get(), who)
        except ServiceError as exc:
            MCP_TOOL_CALLS.labels(tool, "error").inc()
            raise ToolError(f"{exc.code}: {exc.message}") from None
        except ToolError:
            MCP_TOOL_CALLS.labels(tool, "error").inc()
            raise
        except ValueError as exc:  # a pydantic check of the arguments
            MCP_TOOL_CALLS.labels(tool, "error").inc()
            raise ToolError(f"invalid: {exc}") from None
        MCP_TOOL_CALLS.labels(tool, "ok").inc()
        return result

    def add(tool: str, model: type[M], run: Callable[[MemoryService, Principal, M], Awaitable[R]],
            returns: Any, description: str, **fixed: Any) -> None:  # fmt: skip
        """A tool whose arguments are ``model``'s fields (those not ``fixed``): the request
        models of the HTTP API, so a tool and its route take the same words."""

        async def handler(ctx: Context[Any, Any, Any], **arguments: Any) -> Any:
            async def run_one(svc: MemoryService, who: Principal) -> Any:
                return await run(svc, who, model.model_validate({**arguments, **fixed}))

            return await call(tool, ctx, run_one)

        handler.__name__ = tool
        handler.__signature__ = _signature(model, fixed, returns)  # type: ignore[attr-defined]
        handler.__annotations__ = {
            **{p.name: p.annotation for p in handler.__signature__.parameters.values()},  # type: ignore[attr-defined]
            "return": returns,
        }
        mcp.tool(name=tool, description=description)(handler)

    async def add_memory(svc: MemoryService, who: Principal, body: AddEpisodeIn) -> dict[str, Any]:
        if body.source == "json" and isinstance(body.content, str):
            try:  # an MCP client may send the object as JSON text
                body = body.model_copy(update={"content": jsontext.loads(body.content)})
            except ValueError as exc:
                raise ToolError(f"content is not JSON (source=json): {exc}") from None
        result, token = await svc.add(who, body)
        return {**result.as_json(), "token": token}

    add(
        "add_memory",
        AddEpisodeIn,
        add_memory,
        dict[str, Any],
        "Remember an episode (a message, a note, or a JSON record with source=json). "
        "reference_time: when it happened (ISO 8601), required. Returns its status and a "
        "token: pass the token as wait_for to read this write.",
    )

    async def search(svc: MemoryService, who: Principal, body: SearchIn) -> dict[str, Any]:
        return await svc.search(who, body)

    for tool, recipe, what in (
        ("search_facts", "facts_rrf", "Facts (subject, relation, object, with when each was "
         "true) that answer the query, valid at valid_at as known at known_at (default now)."),
        ("search_entities", "entities_rrf", "Entities (people, companies, things) that match "
         "the query."),
        ("search_episodes", "episodes_rrf", "Raw episodes (messages, notes, records) that "
         "match the query."),
    ):  # fmt: skip
        add(
            tool,
            SearchIn,
            search,
            dict[str, Any],
            f"{what} Answers the hits (results) and the moment searched; note says why facts "
            "may be missing. wait_for: tokens of add_memory to wait for.",
            recipe=recipe,
            centre=None,
        )

    async def context(svc: MemoryService, who: Principal, body: ContextIn) -> str:
        return str((await svc.context(who, body))["context"])

    add(
        "get_context",
        ContextIn,
        context,
        str,
        "The memory relevant to the query as text to read: facts with their dates, entities, "
        "communities and episode excerpts, within max_chars.",
    )

    async def facts(svc: MemoryService, who: Principal, body: FactsIn) -> list[dict[str, Any]]:
        return await svc.facts(who, body)

    add(
        "facts_as_of",
        FactsIn,
        facts,
        list[dict[str, Any]],
        "Every fact of the group valid at valid_at as believed at known_at (default now).",
    )

    @mcp.tool()
    async def episode_status(
        episode_id: str, ctx: Context[Any, Any, Any], group_id: str | None = None
    ) -> dict[str, Any]:
        """Where an added episode stands: written, not_extracted, queued, dead_lettered or
        failed (with the reason)."""

        async def run(svc: MemoryService, who: Principal) -> dict[str, Any]:
            return await svc.episode_status(who, group_id, episode_id)

        return await call("episode_status", ctx, run)

    return mcp


def _signature(model: type[BaseModel], fixed: dict[str, Any], returns: Any) -> inspect.Signature:
    """``(ctx, *, <model's fields but the fixed ones>)`` with each field's type, default and
    description: what FastMCP reads to describe and check a tool's arguments."""
    parameters = [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Context)
    ]
    for name, field in model.model_fields.items():
        if name in fixed:
            continue
        annotation = Annotated[field.annotation, Field(description=field.description)]  # type: ignore[name-defined]
        default = (
            inspect.Parameter.empty
            if field.is_required()
            else field.get_default(call_default_factory=True)
        )
        parameters.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
            )
        )
    return inspect.Signature(parameters, return_annotation=returns)


class RequireKey:
    """401 for an HTTP request without a known API key (when keys are configured)."""

    def __init__(self, app: ASGIApp, keys: KeyRing) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.keys.enabled:
            # Header values are bytes of any value: read as Latin-1 like Starlette (never a
            # decoding error); a key with other bytes is simply unknown.
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            key = bearer_or_header(headers.get("authorization"), headers.get("x-api-key"))
            if self.keys.principal(key) is None:
                message = "missing or unknown API key"
                await send_error(
                    send, 401, "unauthorized", message, [(b"www-authenticate", b"Bearer")]
                )
                return
        await self.app(scope, receive, send)


class ClosesMemory:
    """Closes the holder's memory when the app shuts down (ASGI lifespan)."""

    def __init__(self, app: ASGIApp, holder: Holder) -> None:
        self.app = app
        self.holder = holder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await self.holder.close()
            await send(message)

        await self.app(scope, receive, sending)


def http_app(
    mcp: FastMCP, keys: KeyRing, holder: Holder, settings: ServeSettings | None = None
) -> ASGIApp:
    """The streamable HTTP app (path /mcp) behind the API-key check and the body guard."""
    settings = settings or ServeSettings()
    guarded = BodyGuard(
        mcp.streamable_http_app(),
        max_bytes=settings.serve_max_body_bytes,
        timeout=settings.serve_body_timeout_seconds,
    )
    return ClosesMemory(RequireKey(guarded, keys), holder)
