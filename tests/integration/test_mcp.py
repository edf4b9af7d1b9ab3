"""``tidegraph mcp`` through the official MCP SDK's own clients: stdio (the SDK spawns the
command) and streamable HTTP (a real uvicorn server on loopback, with API keys).
The search tools run on the embedded store and on the in-memory store with exact search.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from pydantic import AnyUrl

from tests.integration.serve_harness import (
    TIDEGRAPH,
    ProcessServer,
    ThreadServer,
    in_memory_service,
    memory_settings,
    serve_env,
)
from tests.support.crm_feed import plan_record
from tidegraph.app.serving.mcp_server import Holder, Scoping, build_mcp, changes_uri, http_app
from tidegraph.app.serving.settings import KeyRing

TOOLS = {"add_memory", "search_facts", "search_entities", "search_episodes", "get_context",
         "facts_as_of", "episode_status", "forget_memory", "list_episodes", "get_episode",
         "list_groups", "list_changes"}  # fmt: skip
KEY_A = "mcp-a-" + uuid.uuid4().hex
KEY_B = "mcp-b-" + uuid.uuid4().hex


def payload(result: Any) -> Any:
    """A tool's answer: its structured content (lists come wrapped as {"result": ...})."""
    assert not result.isError, result.content[0].text
    data = result.structuredContent
    if data is None:
        return json.loads(result.content[0].text)
    return data["result"] if set(data) == {"result"} else data


def hits(result: Any) -> list[dict[str, Any]]:
    """The hits a search tool found."""
    return list(payload(result)["results"])


def error_text(result: Any) -> str:
    assert result.isError, result
    return str(result.content[0].text)


def plan_args(plan: str, at: str, **extra: Any) -> dict[str, Any]:
    record = plan_record((1, "Acme Corp"), plan, datetime.fromisoformat(at).replace(tzinfo=UTC))
    return {"content": orjson.dumps(record).decode(), "source": "json", "reference_time": at,
            **extra}  # fmt: skip


@asynccontextmanager
async def stdio_session(tmp: Path, *groups: str) -> AsyncIterator[ClientSession]:
    args = ["mcp", *[a for g in groups for a in ("--group", g)]]
    params = StdioServerParameters(command=TIDEGRAPH, args=args, env=serve_env(tmp))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def http_session(url: str, key: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


# ----------------------------------------------------------------------------- stdio
async def test_stdio_tools_on_the_embedded_default_are_scoped_to_the_groups(tmp_path: Path):
    mine, other = f"mcp-{uuid.uuid4().hex[:8]}", f"mcp-other-{uuid.uuid4().hex[:8]}"
    async with stdio_session(tmp_path, mine) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed == TOOLS

        added = payload(
            await session.call_tool("add_memory", plan_args("Pro", "2025-01-10T00:00:00+00:00",
                                                            episode_id="m1"))
        )  # fmt: skip
        assert added["status"] == "written" and added["group_id"] == mine
        assert added["token"].startswith("rw1.")

        facts = payload(await session.call_tool("facts_as_of", {}))
        assert [f["fact"] for f in facts if f["relation"] == "HAS_PLAN"] == [
            "Acme Corp is on the Pro plan"
        ]
        status = payload(await session.call_tool("episode_status", {"episode_id": "m1"}))
        assert status["status"] == "written"

        missing_time = await session.call_tool("add_memory", {"content": "Dana called"})
        assert "reference_time" in error_text(missing_time)
        bad_time = await session.call_tool(
            "add_memory", {"content": "Dana called", "reference_time": "the other day-ish"}
        )
        assert "reference_time" in error_text(bad_time)

        for tool, args in (
            ("facts_as_of", {"group_id": other}),
            ("add_memory", {"content": "x", "reference_time": "2025-01-01", "group_id": other}),
            ("episode_status", {"episode_id": "m1", "group_id": other}),
            ("get_context", {"query": "Acme", "group_ids": [other]}),
            ("search_facts", {"query": "Acme", "group_ids": [mine, other]}),
            ("search_episodes", {"query": "Acme", "group_ids": [other]}),
        ):
            text = error_text(await session.call_tool(tool, args))
            assert "forbidden" in text and other in text, (tool, text)
            # there is no key over stdio: the refusal names the server's own scope
            assert "API key" not in text and f"scoped to '{mine}'" in text, (tool, text)


async def test_stdio_search_without_an_llm_says_why_no_facts_come(tmp_path: Path):
    group = f"mcp-{uuid.uuid4().hex[:8]}"
    async with stdio_session(tmp_path, group) as session:
        added = payload(
            await session.call_tool(
                "add_memory",
                {"content": "Dana: Acme wants SSO", "reference_time": "2025-02-01T00:00:00Z"},
            )
        )
        assert added["status"] == "written" and added["not_extracted"] == "no_llm"
        found = payload(
            await session.call_tool(
                "search_facts", {"query": "Acme SSO", "wait_for": [added["token"]]}
            )
        )
        assert found["results"] == [] and "no LLM is configured" in found["note"]
        context = payload(await session.call_tool("get_context", {"query": "Acme SSO"}))
        assert "no LLM is configured" in context


async def test_stdio_needs_groups(tmp_path: Path):
    params = StdioServerParameters(command=TIDEGRAPH, args=["mcp"], env=serve_env(tmp_path))
    with pytest.raises(Exception):  # noqa: B017  (the process exits before the handshake)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()


async def test_stdio_search_tools_on_the_embedded_default(tmp_path: Path):
    group = f"mcp-{uuid.uuid4().hex[:8]}"
    async with stdio_session(tmp_path, group) as session:
        added = payload(
            await session.call_tool("add_memory", plan_args("Pro", "2025-01-10T00:00:00+00:00"))
        )
        found = hits(
            await session.call_tool(
                "search_facts", {"query": "Acme Corp plan", "wait_for": [added["token"]]}
            )
        )
        assert found[0]["text"] == "Acme Corp is on the Pro plan"
        context = payload(await session.call_tool("get_context", {"query": "Acme plan"}))
        assert "Acme Corp is on the Pro plan" in context


# ----------------------------------------------------------------------------- HTTP
@pytest.fixture
def groups() -> tuple[str, str]:
    run = uuid.uuid4().hex[:8]
    return f"mcp-a-{run}", f"mcp-b-{run}"


@pytest.fixture
def mcp_http(tmp_path: Path, groups: tuple[str, str]) -> Iterator[ThreadServer]:
    """``tidegraph mcp --transport http`` in a thread over the in-memory store with search."""
    a, b = groups
    keys = KeyRing({KEY_A: [a], KEY_B: [b]})
    holder = Holder(in_memory_service(memory_settings(tmp_path)))
    server = build_mcp(holder, Scoping(keys, None), stdio=False)
    srv = ThreadServer(http_app(server, keys, holder)).start()
    yield srv
    srv.stop()


async def test_http_tools_answer_each_key_from_its_own_groups(mcp_http: ThreadServer, groups):
    a, b = groups
    async with http_session(mcp_http.url, KEY_A) as session:
        assert {t.name for t in (await session.list_tools()).tools} == TOOLS
        first = payload(await session.call_tool("add_memory", plan_args("Pro", "2025-01-10")))
        assert first["group_id"] == a
        added = payload(
            await session.call_tool(
                "add_memory",
                {"content": "Dana says Acme Corp wants SSO before renewal",
                 "reference_time": "2025-02-01T09:00:00Z", "episode_id": "chat-9"},
            )
        )  # fmt: skip
        facts = hits(
            await session.call_tool(
                "search_facts", {"query": "Acme Corp plan", "wait_for": [first["token"]]}
            )
        )
        assert facts[0]["text"] == "Acme Corp is on the Pro plan" and facts[0]["kind"] == "fact"
        entities = hits(await session.call_tool("search_entities", {"query": "Acme Corp"}))
        assert "Acme Corp" in [e["name"] for e in entities]
        episodes = hits(
            await session.call_tool(
                "search_episodes", {"query": "SSO renewal", "wait_for": [added["token"]]}
            )
        )
        assert episodes[0]["episode_id"] == "chat-9"
        context = payload(await session.call_tool("get_context", {"query": "Acme Corp plan"}))
        assert "Acme Corp is on the Pro plan" in context
        as_of = payload(await session.call_tool("facts_as_of", {"valid_at": "2025-01-01"}))
        assert [f for f in as_of if f["relation"] == "HAS_PLAN"] == []  # not yet then
    async with http_session(mcp_http.url, KEY_B) as session:
        for tool, args in (
            ("facts_as_of", {"group_id": a}),
            ("search_facts", {"query": "Acme", "group_ids": [a]}),
            ("search_facts", {"query": "Acme", "wait_for": [first["token"]]}),
            ("episode_status", {"episode_id": "chat-9", "group_id": a}),
            ("add_memory", {"content": "x", "reference_time": "2025-01-01", "group_id": a}),
        ):
            text = error_text(await session.call_tool(tool, args))
            assert "forbidden" in text and a in text and KEY_A not in text, (tool, text)
        assert hits(await session.call_tool("search_facts", {"query": "Acme Corp"})) == []
        assert payload(await session.call_tool("facts_as_of", {})) == []
    async with httpx.AsyncClient(base_url=mcp_http.url) as http:
        for headers in (
            {},
            {"Authorization": "Bearer nope-nope-nope"},
            {"X-API-Key": b"\xff\xfe\xfd-not-utf-8"},  # bytes that are no text: still a 401
            {"Authorization": b"Bearer \xc3\x28\xa0"},
            {"X-Anything": b"\x80\x81", "X-API-Key": b"\xe9t\xe9-key"},
        ):
            refused = await http.post("/mcp", headers=headers, json={})
            assert refused.status_code == 401, refused.text
            assert refused.json()["error"] == "unauthorized"


async def test_http_tools_answer_hostile_arguments_with_errors_not_crashes(
    mcp_http: ThreadServer, groups, caplog: pytest.LogCaptureFixture
):
    a, _ = groups
    caplog.set_level(logging.WARNING)
    forged = (
        "rw1." + __import__("base64").urlsafe_b64encode(b'{"g": "x", "u": "y", "t": [1]}').decode()
    )
    async with http_session(mcp_http.url, KEY_A) as session:
        for tool, args in (
            ("search_facts", {"query": "Acme\x00Corp 'OR 1=1 --"}),
            ("search_episodes", {"query": "*:* NEAR( \"", "limit": 10**30}),
            ("search_facts", {"query": "Acme", "wait_for": [forged]}),
            ("search_facts", {"query": "Acme", "group_ids": [""]}),
            ("search_facts", {"query": "Acme", "group_ids": [f" {a}"]}),
            ("get_context", {"query": "x" * 3000}),
            ("facts_as_of", {"valid_at": "x" * 500}),
            ("add_memory", {"content": "{not json", "source": "json", "reference_time": "2025"}),
            ("add_memory", {"content": {"n": 10**30}, "source": "json",
                            "reference_time": "2025-01-01"}),
            ("add_memory", {"content": "x", "reference_time": "2025-01-01", "group_id": " x"}),
            ("episode_status", {"episode_id": "e" * 5000}),
        ):  # fmt: skip
            result = await session.call_tool(tool, args)
            text = result.content[0].text if result.content else ""
            assert "Traceback" not in text and "Internal" not in text, (tool, text)
        # times out of range, a forged cursor of the group's own among them (issue 48: "date
        # value out of range"): an error naming the field
        for at in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
            forged_cursor = "ep1." + __import__("base64").urlsafe_b64encode(
                orjson.dumps([a, at, "x"])
            ).decode().rstrip("=")
            for tool, args, field in (
                ("list_episodes", {"cursor": forged_cursor}, "cursor"),
                ("list_episodes", {"since": at}, "since"),
                ("facts_as_of", {"known_at": at}, "known_at"),
            ):
                result = await session.call_tool(tool, args)
                text = result.content[0].text if result.content else ""
                assert result.isError and f"bad_request: {field}:" in text, text
        for tool, args in (("list_changes", {"after": "+5"}), ("list_episodes", {"limit": " 5"})):
            result = await session.call_tool(tool, args)
            text = result.content[0].text if result.content else ""
            assert result.isError and "written in digits" in text, (tool, text)
        # the server still answers, and logged no traceback
        assert isinstance(hits(await session.call_tool("search_facts", {"query": "Acme"})), list)
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert tracebacks == []


async def test_http_command_with_api_keys(tmp_path: Path, groups):
    """The real ``tidegraph mcp --transport http`` process on the embedded default."""
    a, b = groups
    env = serve_env(tmp_path, TIDEGRAPH_API_KEYS=orjson.dumps({KEY_A: [a], KEY_B: [b]}).decode())
    server = ProcessServer(
        env,
        tmp_path / "mcp.log",
        ("--transport", "http", "--host", "127.0.0.1"),
        command="mcp",
        ready_path="/mcp",
        ready_status=401,  # up, and refusing a request without a key
    )
    try:
        server.start()
        async with http_session(server.url, KEY_A) as session:
            added = payload(await session.call_tool("add_memory", plan_args("Pro", "2025-01-10")))
            assert added["status"] == "written" and added["group_id"] == a
            facts = payload(await session.call_tool("facts_as_of", {}))
            assert [f["fact"] for f in facts if f["relation"] == "HAS_PLAN"] == [
                "Acme Corp is on the Pro plan"
            ]
        async with http_session(server.url, KEY_B) as session:
            text = error_text(await session.call_tool("facts_as_of", {"group_id": a}))
            assert "forbidden" in text and a in text
        assert KEY_A not in server.log.read_text()
        assert "Traceback" not in server.log.read_text(), server.log_tail()
    finally:
        server.stop()


async def test_http_command_binds_a_session_to_the_key_that_opened_it(tmp_path: Path, groups):
    """Another key gets 404 for a session (issue 48): its notification stream, its POSTs and
    its DELETE; the owner's session goes on. No redirect from a Host header either."""
    a, b = groups
    env = serve_env(tmp_path, TIDEGRAPH_API_KEYS=orjson.dumps({KEY_A: [a], KEY_B: [b]}).decode())
    server = ProcessServer(
        env,
        tmp_path / "mcp.log",
        ("--transport", "http", "--host", "127.0.0.1"),
        command="mcp",
        ready_path="/mcp",
        ready_status=401,
    )
    mcp_headers = {"Accept": "application/json, text/event-stream"}
    listing = {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}
    try:
        server.start()
        headers = {"Authorization": f"Bearer {KEY_A}"}
        async with (
            httpx.AsyncClient(headers=headers, timeout=60) as owner,
            streamable_http_client(f"{server.url}/mcp", http_client=owner) as (read, write, sid),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await session.subscribe_resource(AnyUrl(changes_uri(a)))
            session_id = sid()
            assert session_id
            theirs = {"X-API-Key": KEY_B, "mcp-session-id": session_id, **mcp_headers}
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as other:
                stream = await other.get("/mcp", headers=theirs)
                posted = await other.post("/mcp", headers=theirs, json=listing)
                deleted = await other.delete("/mcp", headers=theirs)
                for answer in (stream, posted, deleted):
                    assert answer.status_code == 404, answer.text
                    assert "Session not found" in answer.text
                slash = await other.post(
                    "/mcp/", headers={**theirs, "host": "evil.example"}, json=listing
                )
                assert slash.status_code != 307 and "location" not in slash.headers
            # the owner's session is untouched
            assert {t.name for t in (await session.list_tools()).tools} == TOOLS
        assert "Traceback" not in server.log.read_text(), server.log_tail()
    finally:
        server.stop()
