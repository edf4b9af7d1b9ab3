"""``tidegraph mcp``: the memory as Model Context Protocol tools (docs/serving.md "Serving memory to
agents"), on the official SDK's FastMCP, over stdio or streamable HTTP.

Tools: add_memory, search_facts, search_entities, search_episodes, get_context, facts_as_of,
episode_status; the lifecycle: forget_memory (a dry run unless asked otherwise), list_episodes,
get_episode, list_groups, list_changes. Resource: ``tidegraph://changes/{group_id}`` (the
group's latest changes and the cursor), which a client may subscribe to: the session is then
sent ``notifications/resources/updated`` whenever changes of the group are committed
(``ChangeWatch``). Every tool and resource is scoped: over stdio to the ``--group`` ids the
server was started with; over HTTP to the caller's API key's groups (and, when given, only
those of them also in ``--group``), or to ``--group`` when no keys are configured (then
loopback only). A tool asked for another group fails with an error naming the group.

Size: about 600 lines because it is the whole MCP surface (scoping, tools, the changes
resource and its subscriptions, the HTTP transport's key check); the work is the shared
``MemoryService``'s, each tool a few lines around it.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, TypeVar
from urllib.parse import quote, unquote

import anyio
import orjson
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.lowlevel import NotificationOptions
from mcp.server.session import ServerSession
from mcp.shared.exceptions import McpError
from mcp.types import INVALID_PARAMS, ErrorData, ServerCapabilities
from pydantic import AnyUrl, BaseModel, BeforeValidator, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidegraph.app.serving.errors import ServiceError
from tidegraph.app.serving.models import (
    AddEpisodeIn,
    ChangesIn,
    ContextIn,
    EpisodeIn,
    EpisodesIn,
    FactsIn,
    ForgetIn,
    SearchIn,
    number_kind,
    number_text_problem,
    send_error,
)
from tidegraph.app.serving.server import BodyGuard
from tidegraph.app.serving.service import MemoryService
from tidegraph.app.serving.settings import KeyRing, Principal, ServeSettings, bearer_or_header
from tidegraph.metrics import MCP_TOOL_CALLS, SERVE_WAITS
from tidegraph.pipelines.collector import settle_collector
from tidegraph.records import jsontext

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")

log = logging.getLogger("tidegraph.mcp")

CHANGES_URI = "tidegraph://changes/{group_id}"  # the group id percent-encoded (changes_uri)
WATCH_SECONDS = 0.5  # how often ChangeWatch reads the subscribed groups' change logs
NOTIFY_TIMEOUT_SECONDS = 5.0  # a session that takes no notification this long misses it

INSTRUCTIONS = """\
tidegraph is a bi-temporal memory: every fact has when it was true (valid_at/invalid_at) and
when it was learned. Add what happens with add_memory, always with its reference_time (when it
happened, ISO 8601). Recall with get_context (a ready-to-read summary) or search_facts /
search_entities / search_episodes; facts_as_of lists what was true at a moment. To read your
own write, pass the token add_memory returned as wait_for. list_episodes and get_episode show
what the memory holds; forget_memory erases episodes, a person (subject) or a group: it is a
dry run (what would go) unless you pass dry_run=false. To follow what changes, subscribe to
the resource tidegraph://changes/<group_id>, or call list_changes with the last cursor."""


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
        return self.principal_of(ctx.request_context.request)

    def principal_of(self, request: Any | None) -> Principal:
        """The caller of a request (None: over stdio)."""
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
                await self.service.start()
            return self.service

    async def close(self) -> None:
        if self.service is not None:
            await self.service.close()
            self.service = None


def changes_uri(group_id: str) -> str:
    """The change resource of a group (its id percent-encoded: any group id is one path
    segment)."""
    return CHANGES_URI.replace("{group_id}", quote(group_id, safe=""))


def group_of_uri(uri: str) -> str | None:
    """The group of a change resource's uri, or None for another uri."""
    prefix = CHANGES_URI.removesuffix("{group_id}")
    rest = uri.removeprefix(prefix) if uri.startswith(prefix) else ""
    return unquote(rest) if rest and "/" not in rest else None


class SessionState:
    """What one MCP session holds (the lifespan's context, one per session): its change
    subscriptions are dropped when it ends."""


@dataclass
class Subscription:
    session: ServerSession
    uri: str
    group_id: str
    seen: int  # the group's last seq when this session was last told


class ChangeWatch:
    """Sessions' subscriptions to change resources. One task, running while anything is
    subscribed, reads the change logs of every subscribed group every ``WATCH_SECONDS`` (one
    store read a round, whatever the number of groups and sessions) and sends
    ``notifications/resources/updated`` to each session subscribed to a group whose last seq
    moved (new changes committed, or the log reset by a purge). The store's outbox is the
    only source of truth: a server writing in-process and workers writing through Kafka are
    seen alike."""

    def __init__(self, holder: Holder, interval: float = WATCH_SECONDS) -> None:
        self.holder = holder
        self.interval = interval
        self.subscriptions: dict[tuple[SessionState, str], Subscription] = {}
        self._task: asyncio.Task[None] | None = None

    async def subscribe(
        self, owner: SessionState, session: ServerSession, uri: str, group_id: str
    ) -> None:
        service = await self.holder.get()
        logs = await service.store.outbox.change_logs([group_id])
        if (owner, uri) not in self.subscriptions:
            SERVE_WAITS.labels("subscription").inc()
        seen = logs[0].seq if logs else 0
        self.subscriptions[owner, uri] = Subscription(session, uri, group_id, seen)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tidegraph-change-watch")

    def unsubscribe(self, owner: SessionState, uri: str) -> None:
        if self.subscriptions.pop((owner, uri), None) is not None:
            SERVE_WAITS.labels("subscription").dec()

    def end_session(self, owner: SessionState) -> None:
        for key in [k for k in self.subscriptions if k[0] is owner]:
            self.unsubscribe(*key)

    async def close(self) -> None:
        for owner, uri in list(self.subscriptions):
            self.unsubscribe(owner, uri)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        try:
            while self.subscriptions:
                await asyncio.sleep(self.interval)  # a polling period, not a synchronisation
                await self._round()
        finally:
            self._task = None

    async def _round(self) -> None:
        groups = sorted({s.group_id for s in self.subscriptions.values()})
        if not groups:
            return
        try:
            service = await self.holder.get()
            last = {log.group_id: log.seq for log in await service.store.outbox.change_logs(groups)}
        except Exception:  # the store is down: the next round looks again
            log.warning("reading the change logs of subscribed groups failed", exc_info=True)
            return
        for key, sub in list(self.subscriptions.items()):
            seq = last.get(sub.group_id, 0)
            if seq == sub.seen:
                continue
            sub.seen = seq
            try:
                async with asyncio.timeout(NOTIFY_TIMEOUT_SECONDS):
                    await sub.session.send_resource_updated(AnyUrl(sub.uri))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self.unsubscribe(*key)  # the session is gone
            except TimeoutError:
                log.info("an MCP session took no change notification for %s", sub.uri)


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

    watch = ChangeWatch(holder)

    @asynccontextmanager
    async def lifespan(_: FastMCP) -> AsyncIterator[SessionState]:
        session = SessionState()  # one per session (over HTTP the lifespan runs per session)
        try:
            yield session
        finally:
            watch.end_session(session)
            if stdio:  # over HTTP the app's shutdown closes the memory
                await watch.close()
                await holder.close()

    mcp = FastMCP("tidegraph", instructions=INSTRUCTIONS, lifespan=lifespan, host=host, port=port)
    tools = Tools(mcp, scoping, holder)
    _add_write_tools(tools)
    _add_search_tools(tools)
    _add_read_tools(tools)
    _add_lifecycle_tools(tools)
    _add_change_tools(tools)
    subscriptions(mcp, scoping, holder, watch)
    return mcp


class Tools:
    """How a tool is added: its call scoped to the caller (``Scoping``), over the holder's
    service, a ``ServiceError`` answered as a tool error naming the code, and counted in
    ``tidegraph_mcp_tool_calls_total``."""

    def __init__(self, mcp: FastMCP, scoping: Scoping, holder: Holder) -> None:
        self.mcp = mcp
        self.scoping = scoping
        self.holder = holder

    async def call(
        self, tool: str, ctx: Context[Any, Any, Any], run: Callable[..., Awaitable[Any]]
    ) -> Any:
        try:
            who = self.scoping.principal(ctx)
            result = await run(await self.holder.get(), who)
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

    def add(self, tool: str, model: type[M],
            run: Callable[[MemoryService, Principal, M], Awaitable[R]], returns: Any,
            description: str, defaults: dict[str, Any] | None = None,
            **fixed: Any) -> None:  # fmt: skip
        """A tool whose arguments are ``model``'s fields (those not ``fixed``; ``defaults``
        replace the model's): the request models of the HTTP API, so a tool and its route
        take the same words."""

        async def handler(ctx: Context[Any, Any, Any], **arguments: Any) -> Any:
            async def run_one(svc: MemoryService, who: Principal) -> Any:
                return await run(svc, who, model.model_validate({**arguments, **fixed}))

            return await self.call(tool, ctx, run_one)

        handler.__name__ = tool
        handler.__signature__ = _signature(model, fixed, returns, defaults or {})  # type: ignore[attr-defined]
        handler.__annotations__ = {
            **{p.name: p.annotation for p in handler.__signature__.parameters.values()},  # type: ignore[attr-defined]
            "return": returns,
        }
        self.mcp.tool(name=tool, description=description)(handler)


def _add_write_tools(tools: Tools) -> None:
    """add_memory."""

    async def add_memory(svc: MemoryService, who: Principal, body: AddEpisodeIn) -> dict[str, Any]:
        if body.source == "json" and isinstance(body.content, str):
            try:  # an MCP client may send the object as JSON text
                body = body.model_copy(update={"content": jsontext.loads(body.content)})
            except ValueError as exc:
                raise ToolError(f"content is not JSON (source=json): {exc}") from None
        result, token = await svc.add(who, body)
        return {**result.as_json(), "token": token}

    tools.add(
        "add_memory",
        AddEpisodeIn,
        add_memory,
        dict[str, Any],
        "Remember an episode (a message, a note, or a JSON record with source=json). "
        "reference_time: when it happened (ISO 8601), required. Returns its status and a "
        "token: pass the token as wait_for to read this write.",
    )


def _add_read_tools(tools: Tools) -> None:
    """get_context, facts_as_of, episode_status."""

    async def context(svc: MemoryService, who: Principal, body: ContextIn) -> str:
        return str((await svc.context(who, body))["context"])

    tools.add(
        "get_context",
        ContextIn,
        context,
        str,
        "The memory relevant to the query as text to read: facts with their dates, entities, "
        "communities and episode excerpts, within max_chars.",
    )

    async def facts(svc: MemoryService, who: Principal, body: FactsIn) -> list[dict[str, Any]]:
        return await svc.facts(who, body)

    tools.add(
        "facts_as_of",
        FactsIn,
        facts,
        list[dict[str, Any]],
        "Every fact of the group valid at valid_at as believed at known_at (default now).",
    )

    @tools.mcp.tool()
    async def episode_status(
        episode_id: str, ctx: Context[Any, Any, Any], group_id: str | None = None
    ) -> dict[str, Any]:
        """Where an added episode stands: written, not_extracted, queued, dead_lettered or
        failed (with the reason)."""

        async def run(svc: MemoryService, who: Principal) -> dict[str, Any]:
            return await svc.episode_status(who, group_id, episode_id)

        return await tools.call("episode_status", ctx, run)


def _add_search_tools(tools: Tools) -> None:
    """search_facts, search_entities, search_episodes: one recipe each."""

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
        tools.add(
            tool,
            SearchIn,
            search,
            dict[str, Any],
            f"{what} Answers the hits (results) and the moment searched; note says why facts "
            "may be missing. wait_for: tokens of add_memory to wait for.",
            recipe=recipe,
            centre=None,
        )


def _add_lifecycle_tools(tools: Tools) -> None:
    """forget_memory (a dry run unless asked otherwise), list_episodes, get_episode,
    list_groups."""

    async def forget(svc: MemoryService, who: Principal, body: ForgetIn) -> dict[str, Any]:
        return (await svc.forget(who, body)).as_json()

    tools.add(
        "forget_memory",
        ForgetIn,
        forget,
        dict[str, Any],
        "Erase from memory, for good: episodes by episode_id, every episode that mentions a "
        "subject (a person or thing: its name, key or uuid), or the whole group (group=true). "
        "The graph afterwards is the one the remaining episodes give. A DRY RUN by default: "
        "it answers what would go (episodes, facts and entities removed or changed) and "
        "writes nothing; call again with dry_run=false to erase.",
        defaults={"dry_run": True},
    )

    async def episodes(svc: MemoryService, who: Principal, body: EpisodesIn) -> dict[str, Any]:
        return await svc.episodes(who, body)

    tools.add(
        "list_episodes",
        EpisodesIn,
        episodes,
        dict[str, Any],
        "The group's episodes by event time, a page at a time (pass next_cursor back as "
        "cursor); status: written, not_extracted, forgotten or dead_lettered.",
    )

    async def episode(svc: MemoryService, who: Principal, body: EpisodeIn) -> dict[str, Any]:
        return await svc.episode(who, body.group_id, body.episode_id)

    tools.add(
        "get_episode",
        EpisodeIn,
        episode,
        dict[str, Any],
        "One episode (its episode_id or uuid) with what it produced: the entities it "
        "mentions and the facts it supports.",
    )

    @tools.mcp.tool()
    async def list_groups(ctx: Context[Any, Any, Any]) -> dict[str, Any]:
        """The groups this server lets you read, each with its episodes, entities, facts and
        the change stream's last seq (subscribe to tidegraph://changes/<group_id>)."""

        async def run(svc: MemoryService, who: Principal) -> dict[str, Any]:
            return await svc.readable_groups(who)

        return await tools.call("list_groups", ctx, run)


def _add_change_tools(tools: Tools) -> None:
    """list_changes and the resource ``tidegraph://changes/{group_id}``."""

    async def changes(svc: MemoryService, who: Principal, body: ChangesIn) -> dict[str, Any]:
        return await svc.changes(who, body)

    tools.add(
        "list_changes",
        ChangesIn,
        changes,
        dict[str, Any],
        "The group's committed changes (facts created, invalidated, expired, reopened, "
        "forgotten; entities created, merged, changed, forgotten) after the cursor `after`, "
        "in commit order, with the cursor to pass next time.",
    )

    @tools.mcp.resource(
        CHANGES_URI,
        name="changes",
        mime_type="application/json",
        description="The group's latest committed changes (at most 100) and the cursor "
        "(pass it to list_changes as after). Subscribe to it to be told when new changes "
        "are committed. The group id is percent-encoded.",
    )
    async def changes_resource(group_id: str, ctx: Context) -> str:
        # (a bare Context: the SDK checks a template's arguments with pydantic, which would
        # rebuild a Context[...] from the one it is given, without its request)
        async def run(svc: MemoryService, who: Principal) -> dict[str, Any]:
            return await svc.latest_changes(who, unquote(group_id))

        return orjson.dumps(await tools.call("changes resource", ctx, run)).decode()


def subscriptions(mcp: FastMCP, scoping: Scoping, holder: Holder, watch: ChangeWatch) -> None:
    """``resources/subscribe`` and ``resources/unsubscribe`` of change resources, on the
    SDK's low-level server (FastMCP has no decorator for them in mcp 1.30), and the
    ``subscribe`` capability, which mcp 1.30's ``get_capabilities`` always reports false."""
    server = mcp._mcp_server

    def refused(message: str) -> McpError:
        return McpError(ErrorData(code=INVALID_PARAMS, message=message))

    @server.subscribe_resource()
    async def subscribe(uri: AnyUrl) -> None:
        context = server.request_context
        group = group_of_uri(str(uri))
        if group is None:
            raise refused(f"unknown resource {str(uri)[:200]!r}: subscribe to {CHANGES_URI}")
        try:
            who = scoping.principal_of(context.request)
            (await holder.get()).group(who, group)
        except ServiceError as exc:
            MCP_TOOL_CALLS.labels("subscribe", "error").inc()
            raise refused(f"{exc.code}: {exc.message}") from None
        except ToolError as exc:
            MCP_TOOL_CALLS.labels("subscribe", "error").inc()
            raise refused(str(exc)) from None
        await watch.subscribe(context.lifespan_context, context.session, str(uri), group)
        MCP_TOOL_CALLS.labels("subscribe", "ok").inc()

    @server.unsubscribe_resource()
    async def unsubscribe(uri: AnyUrl) -> None:
        watch.unsubscribe(server.request_context.lifespan_context, str(uri))

    reported = server.get_capabilities

    def capabilities(
        options: NotificationOptions, experimental: dict[str, dict[str, Any]]
    ) -> ServerCapabilities:
        found = reported(options, experimental)
        if found.resources is not None:
            found.resources.subscribe = True
        return found

    server.get_capabilities = capabilities  # type: ignore[method-assign,assignment]


def _signature(
    model: type[BaseModel], fixed: dict[str, Any], returns: Any, defaults: dict[str, Any]
) -> inspect.Signature:
    """``(ctx, *, <model's fields but the fixed ones>)`` with each field's type, default
    (``defaults`` first) and description: what FastMCP reads to describe and check a tool's
    arguments."""
    parameters = [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Context)
    ]
    for name, field in model.model_fields.items():
        if name in fixed:
            continue
        checks: list[Any] = [Field(description=field.description)]
        if (kind := number_kind(field.annotation)) is not None:  # "+5" is no 5 here either
            checks.append(BeforeValidator(partial(_plain_number, kind)))
        annotation = Annotated[(field.annotation, *checks)]  # type: ignore[name-defined]
        default = (
            inspect.Parameter.empty
            if field.is_required()
            else defaults.get(name, field.get_default(call_default_factory=True))
        )
        parameters.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
            )
        )
    return inspect.Signature(parameters, return_annotation=returns)


def _plain_number(kind: type, value: Any) -> Any:
    problem = number_text_problem(kind, value)
    if problem is not None:
        raise ValueError(problem)
    return value


class RequireKey:
    """401 for an HTTP request without a known API key (when keys are configured). A known
    key is the request's user (``scope["user"]``, by the key's SHA-256 digest, never the key):
    the SDK binds a session to the user that opened it, and answers any other key 404
    "Session not found" for it (its notification stream, its DELETE, its POSTs)."""

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
            if key is None or self.keys.principal(key) is None:
                message = "missing or unknown API key"
                await send_error(
                    send, 401, "unauthorized", message, [(b"www-authenticate", b"Bearer")]
                )
                return
            scope["user"] = _session_owner(key)
        await self.app(scope, receive, send)


def _session_owner(key: str) -> AuthenticatedUser:
    """The user an MCP session opened with ``key`` belongs to (named by the key's digest)."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return AuthenticatedUser(AccessToken(token=digest, client_id=digest, scopes=[]))


class ClosesMemory:
    """Closes the holder's memory when the app shuts down (ASGI lifespan); with
    ``settle_gc``, settles the collector once started."""

    def __init__(self, app: ASGIApp, holder: Holder, settle_gc: bool = False) -> None:
        self.app = app
        self.holder = holder
        self.settle_gc = settle_gc  # the process is the server's own: settle_collector

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete" and self.settle_gc:
                settle_collector()
            if message["type"] == "lifespan.shutdown.complete":
                await self.holder.close()
            await send(message)

        await self.app(scope, receive, sending)


def http_app(
    mcp: FastMCP,
    keys: KeyRing,
    holder: Holder,
    settings: ServeSettings | None = None,
    settle_gc: bool = False,
) -> ASGIApp:
    """The streamable HTTP app (path /mcp) behind the API-key check and the body guard
    (``settle_gc``: see ``ClosesMemory``)."""
    settings = settings or ServeSettings()
    app = mcp.streamable_http_app()
    app.router.redirect_slashes = False  # /mcp/ is a 404, never a redirect built from Host
    guarded = BodyGuard(
        app,
        max_bytes=settings.serve_max_body_bytes,
        timeout=settings.serve_body_timeout_seconds,
    )
    return ClosesMemory(RequireKey(guarded, keys), holder, settle_gc)
