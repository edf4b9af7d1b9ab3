"""The memory's lifecycle over HTTP (issue 34): forgetting, browsing, the groups and the change
stream of ``tidegraph serve``, through a real HTTP client against the real command on both
stores (the embedded default and Neo4j; one server per store for the module), and the per-key
wait bound on a server in a thread (over the in-memory store).

The graph a forget over HTTP leaves is compared with the one ``Memory.forget`` leaves from the
same feed; the long poll and the stream are awaited while an episode is added (no sleeps).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from mcp.types import ResourceUpdatedNotification, ServerNotification
from pydantic import AnyUrl

from tests.integration.graph_compare import comparable
from tests.integration.serve_harness import (
    ProcessServer,
    ThreadServer,
    in_memory_service,
    memory_settings,
    serve_env,
    thread_server,
)
from tests.support import crm_feed as crm
from tidegraph.app.memory import Memory
from tidegraph.app.serving.http_api import create_app
from tidegraph.app.serving.mcp_server import Holder, Scoping, build_mcp, changes_uri, http_app
from tidegraph.app.serving.settings import KeyRing, ServeSettings
from tidegraph.records.forget import ForgetRequest
from tidegraph.settings import Settings

pytestmark = pytest.mark.integration

KEY = "life-key-" + uuid.uuid4().hex
OTHER_KEY = "life-other-" + uuid.uuid4().hex
SECRET_ACCOUNT = "Quillmark Holdings"  # in the other tenant's memory only
AT = [crm.START + timedelta(days=d) for d in range(8)]
RECORDS = [
    crm.plan_record((1, "Acme Corp"), "Basic", AT[0]),
    crm.contact_record("joined", (7, "Dana Reyes"), (1, "Acme Corp"), AT[1]),
    crm.owner_record((1, "Acme Corp"), (3, "Sam Lee"), AT[2]),
    crm.contact_record("joined", (8, "Ravi Shah"), (1, "Acme Corp"), AT[3]),
    crm.plan_record((1, "Acme Corp"), "Pro", AT[4]),
    crm.contact_record("joined", (7, "Dana Reyes"), (1, "Acme Corp"), AT[5]),  # restated
    crm.plan_record((1, "Acme Corp"), "Enterprise", AT[6]),
]
ROLES = ("forget", "leave", "browse", "poll", "stream")


@dataclass
class Served:
    server: ProcessServer
    settings: Settings  # the server's, for reading its store from this process
    groups: dict[str, str]  # KEY's groups by the test that uses them
    other: str  # OTHER_KEY's group


@pytest.fixture(scope="module", params=["embedded", "neo4j"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    run = uuid.uuid4().hex[:8]
    groups = {role: f"life-{role}-{run}" for role in ROLES}
    other = f"life-other-{run}"
    tmp = tmp_path_factory.mktemp(f"life-{request.param}")
    keys = orjson.dumps({KEY: list(groups.values()), OTHER_KEY: [other]}).decode()
    values = {"TIDEGRAPH_API_KEYS": keys}
    settings = Settings(data_dir=tmp / "data", embedder="hashing", mappings=tmp / "mapping.yaml")
    if request.param == "neo4j":
        uri = str(request.getfixturevalue("neo4j_uri"))
        values |= {"TIDEGRAPH_STORE": "neo4j", "TIDEGRAPH_NEO4J_URI": uri}
        settings = settings.model_copy(update={"store": "neo4j", "neo4j_uri": uri})
    server = ProcessServer(serve_env(tmp, **values), tmp / "serve.log").start()
    try:
        yield Served(server, settings, groups, other)
    finally:
        server.stop()
        if request.param == "neo4j":
            _delete_groups(settings.neo4j_uri, [*groups.values(), other])
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log and "status=500" not in log, server.log_tail(80)


def _delete_groups(uri: str, groups: list[str]) -> None:
    from neo4j import GraphDatabase

    with GraphDatabase.driver(uri, auth=None) as driver:
        driver.execute_query("MATCH (n) WHERE n.group_id IN $g DETACH DELETE n", g=groups)


@pytest.fixture
async def reference(served: Served, tmp_path: Path) -> AsyncIterator[Memory]:
    """A memory in this process over a store like the server's (embedded: another folder;
    Neo4j: the same server, another group), to build the expected graph."""
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(crm.CRM_MAPPING)
    settings = served.settings.model_copy(
        update={"data_dir": tmp_path / "reference", "mappings": mapping}
    )
    memory = await Memory.open(settings)
    try:
        yield memory
    finally:
        await memory.close()


@pytest.fixture
async def server_store(served: Served) -> AsyncIterator[Memory]:
    """The server's store, opened read-only from this process."""
    memory = await Memory.open(served.settings, read_only=True)
    try:
        yield memory
    finally:
        await memory.close()


def client(served: Served, key: str = KEY) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=served.server.url, headers={"X-API-Key": key}, timeout=60)


async def add(http: httpx.AsyncClient, group: str, n: int) -> None:
    added = await http.post(
        "/v1/episodes",
        json={
            "content": RECORDS[n],
            "source": "json",
            "reference_time": AT[n].isoformat(),
            "group_id": group,
            "episode_id": f"rec-{n}",
        },
    )
    assert added.status_code == 201, added.text


def ok(answer: httpx.Response, status: int = 200) -> Any:
    assert answer.status_code == status, answer.text
    return answer.json()


def error(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["error"] == code and isinstance(body["message"], str), body
    return dict(body)


# ----------------------------------------------------------------------------- forgetting
async def test_forget_over_http_leaves_the_graph_memory_forget_leaves(
    served: Served, reference: Memory, server_store: Memory
):
    group = served.groups["forget"]
    mirror = f"{group}-reference"
    async with client(served) as http:
        for n in (0, 1, 2, 5):  # Dana joins, Sam Lee owns, Dana restated
            await add(http, group, n)
            added = await reference.add_episode(
                group_id=mirror, content=RECORDS[n], reference_time=AT[n], episode_id=f"rec-{n}"
            )
            assert added.status == "written"
        try:
            # a dry run says what would go, as the Python API's does, and writes nothing
            asked = {"group_id": group, "dry_run": "true"}
            dry = ok(await http.delete("/v1/episodes/rec-1", params=asked))
            expected = await reference.forget(
                ForgetRequest(group_id=mirror, episode_ids=("rec-1",)), dry_run=True
            )
            assert dry == {**expected.as_json(), "group_id": group}
            assert dry["status"] == "dry_run" and dry["episodes"] == ["rec-1"]
            shown = ok(await http.get("/v1/episodes/rec-1", params={"group_id": group}))
            assert shown["status"] == "written" and shown["facts"]

            done = ok(await http.delete("/v1/episodes/rec-1", params={"group_id": group}))
            assert done["status"] == "forgotten" and done["forgotten"] == 1
            await reference.forget(ForgetRequest(group_id=mirror, episode_ids=("rec-1",)))
            again = error(
                await http.delete("/v1/episodes/rec-1", params={"group_id": group}),
                404,
                "not_found",
            )
            assert "forgotten at" in again["message"]
            tombstone = ok(await http.get("/v1/episodes/rec-1", params={"group_id": group}))
            assert tombstone["status"] == "forgotten" and tombstone["entities"] == []
            assert "content" not in tombstone and "episode_id" not in tombstone

            # a person asking to be erased, named as a person would name them
            by_name = {"group_id": group, "subject": "sam lee"}
            dry = ok(await http.post("/v1/forget", json={**by_name, "dry_run": True}))
            assert dry["status"] == "dry_run" and dry["episodes"] == ["rec-2"]
            done = ok(await http.post("/v1/forget", json=by_name))
            assert done["status"] == "forgotten" and done["episodes"] == ["rec-2"]
            await reference.forget(ForgetRequest(group_id=mirror, subject="Sam Lee"))
            refused = error(await http.post("/v1/forget", json=by_name), 409, "forget_refused")
            assert "no entity" in refused["message"]

            assert await comparable(server_store.store, group) == await comparable(
                reference.store, mirror
            )
            entities = ok(await http.get("/v1/entities", params={"group_id": group}))
            names = {e["name"] for e in entities["entities"]}
            assert "Sam Lee" not in names and "Dana Reyes" in names  # rec-5 still names Dana
        finally:
            await reference.store.forget.delete_group(mirror)


async def test_a_tenant_leaving_forgets_its_whole_group_and_no_other(served: Served):
    group, kept = served.groups["leave"], served.groups["browse"]
    async with client(served) as http:
        for n in (0, 1):
            await add(http, group, n)
        before = {g["group_id"]: g for g in ok(await http.get("/v1/groups"))["groups"]}
        assert before[group]["episodes"] == 2 and before[group]["facts"]
        leave = {"group_id": group, "group": True}
        dry = ok(await http.post("/v1/forget", json={**leave, "dry_run": True}))
        assert dry["status"] == "dry_run" and sorted(dry["episodes"]) == ["rec-0", "rec-1"]
        assert ok(await http.get("/v1/groups"))["groups"] == list(before.values())
        done = ok(await http.post("/v1/forget", json=leave))
        assert done["status"] == "forgotten" and done["forgotten"] == 2
        after = {g["group_id"]: g for g in ok(await http.get("/v1/groups"))["groups"]}
        assert (after[group]["episodes"], after[group]["entities"], after[group]["facts"]) == (
            0, 0, 0
        )  # fmt: skip
        assert ok(await http.get("/v1/episodes", params={"group_id": group}))["episodes"] == []
        assert after[kept] == before[kept]  # another group of the same key: untouched


async def test_a_forget_that_names_not_one_target_is_a_422_naming_the_rule(served: Served):
    group = served.groups["forget"]
    async with client(served) as http:
        for body in (
            {"group_id": group},
            {"group_id": group, "episode_ids": ["x"], "group": True},
            {"group_id": group, "subject": "x", "purge": True},
        ):
            answer = error(await http.post("/v1/forget", json=body), 422, "invalid")
            assert answer["problems"] and ("exactly one" in answer["message"]
                                           or "purge" in answer["message"]), answer  # fmt: skip
        answer = error(
            await http.post("/v1/forget", json={"group_id": group, "episode_id": ["x"]}),
            422,
            "invalid",
        )
        assert "did you mean 'episode_ids'" in answer["message"]


# ----------------------------------------------------------------------------- tenants
async def test_every_lifecycle_route_refuses_another_tenants_group_and_shows_none_of_it(
    served: Served,
):
    group, other = served.groups["browse"], served.other
    async with client(served) as mine, client(served, OTHER_KEY) as theirs:
        for n in range(4):
            await add(mine, group, n)
        secret = crm.plan_record((2, SECRET_ACCOUNT), "Pro", AT[0])
        ok(await theirs.post("/v1/episodes", json={"content": secret,
                                                   "reference_time": AT[0].isoformat(),
                                                   "episode_id": "theirs-1"}), 201)  # fmt: skip
        before = ok(await mine.get("/v1/groups"))
        page = ok(await mine.get("/v1/episodes", params={"group_id": group, "limit": 2}))
        assert [e["episode_id"] for e in page["episodes"]] == ["rec-0", "rec-1"]
        my_cursor = page["next_cursor"]
        my_seq = ok(await mine.get("/v1/changes", params={"group_id": group}))["cursor"]
        their_seq = ok(await theirs.get("/v1/changes"))["cursor"]
        assert my_seq > their_seq > 0

        stream = {"Accept": "text/event-stream"}
        attempts: list[tuple[str, str, dict[str, Any] | None, Any, dict[str, str]]] = [
            ("DELETE", "/v1/episodes/rec-1", {"group_id": group}, None, {}),
            ("DELETE", "/v1/episodes/rec-1", {"group_id": group, "dry_run": "true"}, None, {}),
            ("POST", "/v1/forget", None, {"group_id": group, "episode_ids": ["rec-1"]}, {}),
            ("POST", "/v1/forget", None, {"group_id": group, "subject": "Dana Reyes",
                                          "dry_run": True}, {}),
            ("POST", "/v1/forget", None, {"group_id": group, "group": True, "purge": True}, {}),
            ("GET", "/v1/episodes", {"group_id": group}, None, {}),
            ("GET", "/v1/episodes", {"group_id": group, "cursor": my_cursor}, None, {}),
            ("GET", "/v1/episodes", {"group_id": group, "status": "dead_lettered"}, None, {}),
            ("GET", "/v1/episodes/rec-1", {"group_id": group}, None, {}),
            ("GET", "/v1/changes", {"group_id": group}, None, {}),
            ("GET", "/v1/changes", {"group_id": group, "wait_seconds": 30}, None, {}),
            ("GET", "/v1/changes", {"group_id": group}, None, stream),
            ("GET", "/v1/changes", {"group_id": group}, None, {**stream, "Last-Event-ID": "1"}),
        ]  # fmt: skip
        for method, path, params, body, headers in attempts:
            answer = await theirs.request(method, path, params=params, json=body, headers=headers)
            refused = error(answer, 403, "forbidden")
            assert refused["group_id"] == group and OTHER_KEY not in answer.text, (path, params)
            assert "Acme" not in answer.text and "Dana" not in answer.text, answer.text

        # this tenant's own group, read with the other's cursors: refused, never a page
        forged = error(await theirs.get("/v1/episodes", params={"cursor": my_cursor}), 400,
                       "bad_request")  # fmt: skip
        assert forged["field"] == "cursor" and "another group" in forged["message"]
        forged_cursors: list[tuple[dict[str, str], dict[str, Any]]] = [
            ({}, {"after": my_seq}),
            ({}, {"after": my_seq, "wait_seconds": 30}),
            (stream, {"after": my_seq}),
            ({**stream, "Last-Event-ID": str(my_seq)}, {}),
        ]
        for headers, params in forged_cursors:
            past = error(await theirs.get("/v1/changes", params=params, headers=headers), 400,
                         "bad_request")  # fmt: skip
            assert "past the last change" in past["message"], past
        # what the other tenant reads by default is its own memory only
        listed = ok(await theirs.get("/v1/episodes"))
        assert [e["episode_id"] for e in listed["episodes"]] == ["theirs-1"]
        changes = ok(await theirs.get("/v1/changes", params={"after": 0}))["changes"]
        assert changes and {c["group_id"] for c in changes} == {other}
        assert ok(await theirs.get("/v1/groups"))["groups"] == [
            # the account and its plan, and the fact between them
            {"group_id": other, "episodes": 1, "entities": 2, "facts": 1, "changes": their_seq}
        ]
        # and this tenant's memory is as it was
        after = ok(await mine.get("/v1/groups"))
        assert after == before
        mine_listed = {g["group_id"] for g in after["groups"]}
        assert mine_listed == set(served.groups.values()) and other not in mine_listed
        assert (
            ok(await mine.get("/v1/episodes/rec-1", params={"group_id": group}))["status"]
            == "written"
        )


# ----------------------------------------------------------------------------- changes
async def test_a_long_poll_answers_as_soon_as_a_change_is_committed(served: Served):
    group = served.groups["poll"]
    async with client(served) as http:
        await add(http, group, 0)
        cursor = ok(await http.get("/v1/changes", params={"group_id": group}))["cursor"]
        caught_up = ok(await http.get("/v1/changes", params={"group_id": group, "after": cursor}))
        assert caught_up == {"group_id": group, "changes": [], "cursor": cursor}

        started = time.monotonic()
        poll = asyncio.create_task(
            http.get("/v1/changes", params={"group_id": group, "after": cursor,
                                            "wait_seconds": 60})
        )  # fmt: skip
        await add(http, group, 4)  # Basic -> Pro: the Basic plan's fact is closed
        page = ok(await asyncio.wait_for(poll, 60))
        assert time.monotonic() - started < 60  # answered by the change, not the deadline
        seqs = [c["seq"] for c in page["changes"]]
        assert seqs and seqs[0] == cursor + 1 and page["cursor"] == seqs[-1]
        assert {c["episode_id"] for c in page["changes"]} == {"rec-4"}
        assert "fact.invalidated" in {c["kind"] for c in page["changes"]}


class Events:
    """The server-sent events of one streamed response, read as they come (id, event and
    data); one reader per response, so that a test can read some, act, and read on."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.aiter_lines()

    async def next(self, count: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        event: dict[str, Any] = {}
        async for line in self.lines:
            if line.startswith(":"):  # a ping
                continue
            if not line:
                if event:
                    found.append(event)
                    event = {}
                    if len(found) == count:
                        return found
                continue
            name, _, value = line.partition(": ")
            event[name] = orjson.loads(value) if name == "data" else value
        raise AssertionError(f"the stream ended after {found}")


async def test_server_sent_events_stream_changes_and_resume_from_last_event_id(served: Served):
    group = served.groups["stream"]
    params = {"group_id": group}
    stream = {"Accept": "text/event-stream"}
    async with client(served) as http:
        for n in (0, 1):
            await add(http, group, n)
        everything = ok(await http.get("/v1/changes", params=params))["changes"]
        assert len(everything) >= 4
        async with http.stream("GET", "/v1/changes", params=params, headers=stream) as first:
            assert first.status_code == 200
            assert first.headers["content-type"].startswith("text/event-stream")
            three = await Events(first).next(3)
        assert [e["event"] for e in three] == ["change"] * 3
        assert [int(e["id"]) for e in three] == [c["seq"] for c in everything[:3]]
        assert [e["data"] for e in three] == everything[:3]

        # a reconnect names the last event it saw: the stream goes on after it
        resume = {**stream, "Last-Event-ID": three[1]["id"]}
        async with http.stream("GET", "/v1/changes", params=params, headers=resume) as again:
            reader = Events(again)
            rest = await reader.next(len(everything) - 2)
            assert [e["data"] for e in rest] == everything[2:]
            # and it stays open: a change committed now is the next event
            waiting = asyncio.create_task(reader.next(1))
            await add(http, group, 4)
            [live] = await asyncio.wait_for(waiting, 60)
        assert live["data"]["episode_id"] == "rec-4"
        assert int(live["id"]) == live["data"]["seq"] > everything[-1]["seq"]


# ----------------------------------------------------------------------------- wait bound
@pytest.fixture
def bounded(tmp_path: Path) -> Iterator[tuple[ThreadServer, str]]:
    group = f"bounded-{uuid.uuid4().hex[:8]}"
    serve = ServeSettings(serve_max_body_bytes=64 * 1024, serve_waits_per_key=2)
    srv = thread_server(tmp_path, {KEY: [group], OTHER_KEY: [f"{group}-other"]}, serve)
    yield srv, group
    srv.stop()


async def test_polls_and_streams_of_changes_count_against_the_keys_wait_limit(
    bounded: tuple[ThreadServer, str],
):
    server, _ = bounded
    wait = {"wait_seconds": 60}
    stream = {"Accept": "text/event-stream"}
    async with (
        httpx.AsyncClient(base_url=server.url, headers={"X-API-Key": KEY}, timeout=90) as http,
        httpx.AsyncClient(base_url=server.url, headers={"X-API-Key": OTHER_KEY}) as other,
    ):
        polls = [asyncio.create_task(http.get("/v1/changes", params=wait)) for _ in range(3)]
        # two may wait at once (serve_waits_per_key=2): the third is refused at once
        done, waiting = await asyncio.wait(polls, return_when=asyncio.FIRST_COMPLETED)
        assert [error(t.result(), 429, "too_many_waits")["message"] for t in done]
        assert len(waiting) == 2
        error(await http.get("/v1/changes", headers=stream), 429, "too_many_waits")
        assert ok(await other.get("/v1/changes", params={"wait_seconds": 0}))["changes"] == []

        body = {"content": crm.plan_record((1, "Acme Corp"), "Pro", AT[0]), "source": "json",
                "reference_time": AT[0].isoformat(), "episode_id": "b-1"}  # fmt: skip
        ok(await http.post("/v1/episodes", json=body), 201)
        answered = [ok(await t) for t in waiting]  # the change answers both
        assert all(a["changes"] and a["changes"][0]["seq"] == 1 for a in answered)
        cursor = answered[0]["cursor"]

        # an open stream holds a slot from its first answer for as long as it is read
        opened: dict[str, Any] = {"params": {"after": cursor}, "headers": stream}
        async with (
            http.stream("GET", "/v1/changes", **opened) as first,
            http.stream("GET", "/v1/changes", **opened) as second,
        ):
            assert first.status_code == second.status_code == 200
            refused = await http.get("/v1/changes", params={"after": cursor, **wait})
            error(refused, 429, "too_many_waits")
        # closed by the client: the server frees both slots once it sees them gone
        deadline = time.monotonic() + 30
        while not await slots_free(http, opened, 2):
            assert time.monotonic() < deadline, "the closed streams still hold their slots"
            await asyncio.sleep(0.05)  # a poll of a condition with a deadline


async def slots_free(http: httpx.AsyncClient, opened: dict[str, Any], count: int) -> bool:
    """Whether ``count`` change streams can be open at once now."""
    async with AsyncExitStack() as streams:
        for _ in range(count):
            answer = await streams.enter_async_context(http.stream("GET", "/v1/changes", **opened))
            if answer.status_code == 429:
                return False
            assert answer.status_code == 200
    return True


# ----------------------------------------------------------------------------- retention
async def test_serve_prunes_the_change_outbox_as_it_starts_and_keeps_a_timer(tmp_path: Path):
    """docs/streaming.md "Change stream": in-process, ``tidegraph serve`` keeps the outbox to
    TIDEGRAPH_CHANGES_RETENTION_HOURS, once at startup (before the first request) and then
    every PRUNE_EVERY_SECONDS."""
    group = f"prune-{uuid.uuid4().hex[:8]}"
    settings = memory_settings(tmp_path, changes_retention_hours=1e-9)  # 3.6 us: all of it
    service = await in_memory_service(settings)()
    added = await service.memory.add_episode(
        group_id=group, content=RECORDS[0], reference_time=AT[0], episode_id="rec-0"
    )
    assert added.status == "written"
    committed = await service.store.outbox.changes(group, 0, 100)
    assert committed  # the outbox holds the episode's changes

    async def opened() -> Any:
        return service

    app = create_app(opened, KeyRing({}))
    async with app.router.lifespan_context(app):
        assert await service.store.outbox.changes(group, 0, 100) == []  # pruned at startup
        [log] = await service.store.outbox.change_logs([group])
        assert log.seq == committed[-1].seq  # the cursor's numbering goes on
        timer = service._upkeep
        assert timer is not None and not timer.done()  # the next rounds are on a timer
    assert timer.cancelled()  # and stop with the server


# ----------------------------------------------------------------------------- MCP
@dataclass
class McpServed:
    server: ThreadServer
    mine: str  # KEY's group
    theirs: str  # OTHER_KEY's group


@pytest.fixture
def mcp_served(tmp_path: Path) -> Iterator[McpServed]:
    """``tidegraph mcp --transport http`` in a thread over the in-memory store, two keys."""
    run = uuid.uuid4().hex[:8]
    mine, theirs = f"mcp-life-{run}", f"mcp-life-other-{run}"
    keys = KeyRing({KEY: [mine], OTHER_KEY: [theirs]})
    holder = Holder(in_memory_service(memory_settings(tmp_path)))
    server = ThreadServer(http_app(build_mcp(holder, Scoping(keys, None), stdio=False), keys,
                                   holder)).start()  # fmt: skip
    yield McpServed(server, mine, theirs)
    server.stop()


@asynccontextmanager
async def mcp_session(
    url: str, key: str, notes: asyncio.Queue[str] | None = None
) -> AsyncIterator[ClientSession]:
    """An MCP session over streamable HTTP; ``notes`` receives the uri of each
    resources/updated notification."""

    async def handle(message: Any) -> None:
        if notes is not None and isinstance(message, ServerNotification):
            if isinstance(message.root, ResourceUpdatedNotification):
                notes.put_nowait(str(message.root.params.uri))

    async with (
        httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, _),
        ClientSession(read, write, message_handler=handle) as session,
    ):
        await session.initialize()
        yield session


def tool_answer(result: Any) -> Any:
    assert not result.isError, result.content[0].text
    return orjson.loads(result.content[0].text)


def tool_error(result: Any) -> str:
    assert result.isError, result.content[0].text
    return str(result.content[0].text)


def plan_args(n: int) -> dict[str, Any]:
    return {"content": orjson.dumps(RECORDS[n]).decode(), "source": "json",
            "reference_time": AT[n].isoformat(), "episode_id": f"rec-{n}"}  # fmt: skip


async def test_mcp_lifecycle_tools_and_a_subscribed_change_resource(mcp_served: McpServed):
    group = mcp_served.mine
    uri = AnyUrl(changes_uri(group))
    notes: asyncio.Queue[str] = asyncio.Queue()
    async with mcp_session(mcp_served.server.url, KEY, notes) as session:
        for n in (0, 1):
            assert tool_answer(await session.call_tool("add_memory", plan_args(n)))["status"] == (
                "written"
            )
        [listed] = tool_answer(await session.call_tool("list_groups", {}))["groups"]
        assert listed["group_id"] == group and listed["episodes"] == 2
        page = tool_answer(await session.call_tool("list_episodes", {"limit": 1}))
        assert [e["episode_id"] for e in page["episodes"]] == ["rec-0"] and page["next_cursor"]
        rest = tool_answer(
            await session.call_tool("list_episodes", {"cursor": page["next_cursor"]})
        )
        assert [e["episode_id"] for e in rest["episodes"]] == ["rec-1"]
        assert rest["next_cursor"] is None
        shown = tool_answer(await session.call_tool("get_episode", {"episode_id": "rec-1"}))
        assert shown["status"] == "written" and shown["entities"]

        changes = tool_answer(await session.call_tool("list_changes", {"after": 0}))
        assert changes["changes"] and changes["cursor"] == changes["changes"][-1]["seq"]
        read = await session.read_resource(uri)
        resource = orjson.loads(read.contents[0].text)  # type: ignore[union-attr]
        assert resource == changes  # the latest changes (at most 100) and the same cursor

        # a subscribed session is told when a change is committed, by whoever commits it
        await session.subscribe_resource(uri)
        await session.call_tool("add_memory", plan_args(4))
        assert await asyncio.wait_for(notes.get(), 60) == str(uri)
        later = tool_answer(await session.call_tool("list_changes", {"after": changes["cursor"]}))
        assert {c["episode_id"] for c in later["changes"]} == {"rec-4"}

        # forget_memory is a dry run unless told otherwise
        dry = tool_answer(await session.call_tool("forget_memory", {"episode_ids": ["rec-0"]}))
        assert dry["status"] == "dry_run" and dry["episodes"] == ["rec-0"]
        again = tool_answer(await session.call_tool("get_episode", {"episode_id": "rec-0"}))
        assert again["status"] == "written"
        done = tool_answer(
            await session.call_tool("forget_memory", {"episode_ids": ["rec-0"], "dry_run": False})
        )
        assert done["status"] == "forgotten" and done["forgotten"] == 1
        gone = tool_answer(await session.call_tool("get_episode", {"episode_id": "rec-0"}))
        assert gone["status"] == "forgotten" and "content" not in gone
        assert await asyncio.wait_for(notes.get(), 60) == str(uri)  # the forget's changes
        refused = tool_error(await session.call_tool("forget_memory", {}))
        assert "invalid: " in refused and "exactly one" in refused


async def test_mcp_lifecycle_tools_refuse_another_tenants_group(mcp_served: McpServed):
    group, other = mcp_served.mine, mcp_served.theirs
    async with mcp_session(mcp_served.server.url, KEY) as mine:
        for n in (0, 1):
            tool_answer(await mine.call_tool("add_memory", plan_args(n)))
        before = tool_answer(await mine.call_tool("list_groups", {}))
        cursor = tool_answer(await mine.call_tool("list_episodes", {"limit": 1}))["next_cursor"]
        seq = tool_answer(await mine.call_tool("list_changes", {}))["cursor"]
    async with mcp_session(mcp_served.server.url, OTHER_KEY) as theirs:
        for tool, args in (
            ("forget_memory", {"group_id": group, "episode_ids": ["rec-0"], "dry_run": False}),
            ("forget_memory", {"group_id": group, "subject": "Acme Corp"}),
            ("forget_memory", {"group_id": group, "group": True, "dry_run": False}),
            ("list_episodes", {"group_id": group}),
            ("list_episodes", {"group_id": group, "cursor": cursor}),
            ("get_episode", {"group_id": group, "episode_id": "rec-0"}),
            ("list_changes", {"group_id": group}),
            ("list_changes", {"group_id": group, "after": 1, "wait_seconds": 30}),
        ):
            text = tool_error(await theirs.call_tool(tool, args))
            assert "forbidden: " in text and group in text, (tool, text)
            assert KEY not in text and "Acme" not in text, (tool, text)
        # its own group with the other's cursors: refused, never a page
        forged = tool_error(await theirs.call_tool("list_episodes", {"cursor": cursor}))
        assert "another group" in forged
        past = tool_error(await theirs.call_tool("list_changes", {"after": seq}))
        assert "past the last change" in past
        for refused in (theirs.read_resource, theirs.subscribe_resource):
            with pytest.raises(McpError) as caught:
                await refused(AnyUrl(changes_uri(group)))
            assert "forbidden" in str(caught.value) and "Acme" not in str(caught.value)
        assert tool_answer(await theirs.call_tool("list_groups", {}))["groups"] == [
            {"group_id": other, "episodes": 0, "entities": 0, "facts": 0, "changes": 0}
        ]
        assert tool_answer(await theirs.call_tool("list_episodes", {}))["episodes"] == []
    async with mcp_session(mcp_served.server.url, KEY) as mine:
        assert tool_answer(await mine.call_tool("list_groups", {})) == before  # untouched
