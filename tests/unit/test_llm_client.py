"""LLMClient through the real openai client against the scripted server on loopback."""

from __future__ import annotations

import asyncio
import pickle
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Literal

import pytest
from prometheus_client import REGISTRY
from pydantic import BaseModel, Field
from tenacity import AsyncRetrying, RetryCallState

from tests.support.fake_llm import (
    FakeRequest,
    ScriptedLLMServer,
    estimate_tokens,
    strict_schema_problems,
)
from tidegraph.llm import (
    LLMClient,
    LLMError,
    MemoryResponseCache,
    SqliteResponseCache,
    StrictSchemaError,
    cache_key,
    strict_json_schema,
)
from tidegraph.llm.client import _AttemptFailure, _Backoff
from tidegraph.settings import Settings


class Echo(BaseModel):
    text: str
    length: int


class Other(BaseModel):
    value: str


def echo(req: FakeRequest) -> dict[str, Any]:
    return {"text": req.user, "length": len(req.user)}


@pytest.fixture
def server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as srv:
        srv.on("Echo", echo)
        srv.on("Other", lambda req: {"value": "other"})
        yield srv


MakeClient = Callable[..., LLMClient]


@pytest.fixture
async def make_client(server: ScriptedLLMServer) -> AsyncIterator[MakeClient]:
    clients: list[LLMClient] = []

    def make(**overrides: Any) -> LLMClient:
        options: dict[str, Any] = {
            "base_url": server.base_url,
            "api_key": "test-key",
            "model": "fake-model",
            "timeout": 5.0,
            "max_attempts": 3,
            "backoff_base": 0.001,
            "backoff_max": 0.005,
        }
        client = LLMClient(**(options | overrides))
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
def stage() -> str:
    """A stage name of this test's own, so Prometheus counters start from zero."""
    return f"stage-{uuid.uuid4().hex[:8]}"


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# ---- a structured call -----------------------------------------------------------------------
async def test_structured_returns_validated_model(
    server: ScriptedLLMServer, make_client: MakeClient, stage: str
) -> None:
    client = make_client()
    result = await client.structured(stage=stage, system="be brief", user="hello", schema=Echo)

    assert result == Echo(text="hello", length=5)
    [(name, request, status)] = server.requests
    assert (name, status) == ("Echo", 200)
    assert (request.system, request.user) == ("be brief", "hello")
    assert request.body["model"] == "fake-model"
    fmt = request.body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"]["additionalProperties"] is False
    assert metric("tidegraph_llm_calls_total", stage=stage, outcome="ok") == 1


async def test_token_and_call_counters_move(
    server: ScriptedLLMServer, make_client: MakeClient, stage: str
) -> None:
    client = make_client()
    for user in ("one", "two two"):
        await client.structured(stage=stage, system="sys", user=user, schema=Echo)

    prompt = estimate_tokens("sysone") + estimate_tokens("systwo two")
    completion = sum(
        estimate_tokens(f'{{"text":"{u}","length":{len(u)}}}') for u in ("one", "two two")
    )
    assert client.stats.calls[stage] == 2
    assert client.stats.prompt_chars[stage] == len("sysone") + len("systwo two")
    assert (client.stats.prompt_tokens, client.stats.completion_tokens) == (prompt, completion)
    assert metric("tidegraph_llm_tokens_total", stage=stage, kind="prompt") == prompt
    assert metric("tidegraph_llm_tokens_total", stage=stage, kind="completion") == completion
    assert metric("tidegraph_llm_latency_seconds_count", stage=stage) == 2
    assert client.stats.as_dict()["calls"] == {stage: 2}


# ---- retries ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fault", "kind", "answered"),
    [
        ("429", "rate_limited", 2),
        ("500", "server", 2),
        ("503", "server", 2),
        ("timeout", "timeout", 1),
        ("disconnect", "server", 1),
        ("malformed", "invalid_output", 2),
        ("invalid_schema", "invalid_output", 2),
    ],
)
async def test_transient_fault_is_retried_then_succeeds(
    server: ScriptedLLMServer,
    make_client: MakeClient,
    stage: str,
    fault: str,
    kind: str,
    answered: int,
) -> None:
    client = make_client(timeout=1.0)
    server.inject(fault)

    result = await client.structured(stage=stage, system="s", user="retry me", schema=Echo)

    assert result.text == "retry me"
    assert server.count(status=None) == 2
    assert server.count(status=200) == 1 + (fault in ("malformed", "invalid_schema"))
    assert client.stats.calls[stage] == answered  # requests that got any HTTP answer
    assert client.stats.errors == {(stage, kind): 1}
    assert metric("tidegraph_retries_total", stage=stage, reason=kind) == 1
    assert metric("tidegraph_llm_errors_total", stage=stage, kind=kind) == 1
    assert metric("tidegraph_llm_calls_total", stage=stage, outcome="ok") == 1


async def test_faults_only_hit_their_schema(
    server: ScriptedLLMServer, make_client: MakeClient, stage: str
) -> None:
    client = make_client()
    server.inject("500", schema_name="Other")

    await client.structured(stage=stage, system="s", user="u", schema=Echo)
    assert server.count(status=None) == 1
    await client.structured(stage=stage, system="s", user="u", schema=Other)
    assert server.count("Other", status=500) == 1
    assert server.count("Other") == 1


async def test_permanently_malformed_answer_raises_invalid_output(
    server: ScriptedLLMServer, make_client: MakeClient, stage: str
) -> None:
    cache = MemoryResponseCache()
    client = make_client(max_attempts=4, cache=cache)
    server.inject("malformed", times=10)

    with pytest.raises(LLMError) as caught:
        await client.structured(stage=stage, system="s", user="u", schema=Echo)

    err = caught.value
    assert (err.stage, err.kind, err.attempts) == (stage, "invalid_output", 4)
    assert "after 4 attempts" in str(err) and "'Echo'" in str(err)
    assert "not valid JSON" in str(err) and "TIDEGRAPH_LLM_MODEL" in str(err)
    assert server.count() == 4
    assert client.stats.errors[(stage, "invalid_output")] == 4
    assert metric("tidegraph_llm_calls_total", stage=stage, outcome="error") == 1
    assert metric("tidegraph_retries_total", stage=stage, reason="invalid_output") == 3
    assert len(cache) == 0  # failures are never cached


async def test_persistent_rate_limiting_gives_up_with_advice(
    server: ScriptedLLMServer, make_client: MakeClient, stage: str
) -> None:
    client = make_client()
    server.inject("429", times=3)

    with pytest.raises(LLMError) as caught:
        await client.structured(stage=stage, system="s", user="u", schema=Echo)

    assert (caught.value.kind, caught.value.attempts) == ("rate_limited", 3)
    assert "TIDEGRAPH_LLM_REQUESTS_PER_MINUTE" in str(caught.value)
    assert server.count(status=429) == 3


async def test_unauthorised_is_not_retried(
    server: ScriptedLLMServer, make_client: MakeClient, stage: str
) -> None:
    server.api_key = "the-right-key"
    client = make_client(api_key="a-wrong-key", max_attempts=5)

    with pytest.raises(LLMError) as caught:
        await client.structured(stage=stage, system="s", user="u", schema=Echo)

    assert (caught.value.kind, caught.value.attempts) == ("other", 1)
    assert "HTTP 401" in str(caught.value) and "TIDEGRAPH_LLM_API_KEY" in str(caught.value)
    assert server.count(status=None) == 1
    assert metric("tidegraph_retries_total", stage=stage, reason="other") == 0


async def test_unknown_schema_fails_at_once_with_the_servers_reason(
    server: ScriptedLLMServer, make_client: MakeClient, stage: str
) -> None:
    class Unregistered(BaseModel):
        x: int

    client = make_client()
    with pytest.raises(LLMError) as caught:
        await client.structured(stage=stage, system="s", user="u", schema=Unregistered)

    assert (caught.value.kind, caught.value.attempts) == ("other", 1)
    assert "HTTP 400" in str(caught.value) and "no handler for schema 'Unregistered'" in str(
        caught.value
    )


async def test_unreachable_endpoint_is_a_server_error(make_client: MakeClient, stage: str) -> None:
    with ScriptedLLMServer() as gone:
        url = gone.base_url
    client = make_client(base_url=url, max_attempts=2)

    with pytest.raises(LLMError) as caught:
        await client.structured(stage=stage, system="s", user="u", schema=Echo)

    assert (caught.value.kind, caught.value.attempts) == ("server", 2)
    assert "could not reach" in str(caught.value) and "TIDEGRAPH_LLM_BASE_URL" in str(caught.value)
    assert client.stats.calls[stage] == 0


def test_retry_after_is_honoured_up_to_backoff_max() -> None:
    def state_after(failure: Exception) -> RetryCallState:
        state = RetryCallState(AsyncRetrying(), fn=None, args=(), kwargs={})
        state.set_exception((type(failure), failure, None))
        return state

    backoff = _Backoff(base=0.001, maximum=5.0)
    assert backoff(state_after(_AttemptFailure("rate_limited", "x", retry_after=2.0))) == 2.0
    assert backoff(state_after(_AttemptFailure("rate_limited", "x", retry_after=60.0))) == 5.0
    assert backoff(state_after(_AttemptFailure("server", "x"))) <= 0.001


# ---- cache -----------------------------------------------------------------------------------
async def test_cache_hit_makes_no_request_and_survives_a_new_client(
    server: ScriptedLLMServer, make_client: MakeClient, stage: str, tmp_path: Any
) -> None:
    path = tmp_path / "cache.sqlite3"
    first_cache = SqliteResponseCache(path)
    first = make_client(cache=first_cache)
    answer = await first.structured(stage=stage, system="s", user="cache me", schema=Echo)
    again = await first.structured(stage=stage, system="s", user="cache me", schema=Echo)

    assert again == answer
    assert server.count() == 1
    assert (first.stats.calls[stage], first.stats.cached[stage]) == (1, 1)
    assert metric("tidegraph_llm_calls_total", stage=stage, outcome="cached") == 1
    first_cache.close()

    second_cache = SqliteResponseCache(path)
    second = make_client(cache=second_cache)
    assert await second.structured(stage=stage, system="s", user="cache me", schema=Echo) == answer
    assert server.count() == 1
    assert second.stats.cached[stage] == 1 and second.stats.calls[stage] == 0

    await second.structured(stage=stage, system="s", user="something else", schema=Echo)
    assert server.count() == 2
    assert len(second_cache) == 2
    second_cache.close()


async def test_failed_answers_are_not_cached(
    server: ScriptedLLMServer, make_client: MakeClient, stage: str
) -> None:
    cache = MemoryResponseCache()
    client = make_client(cache=cache, max_attempts=1)
    server.inject("invalid_schema")

    with pytest.raises(LLMError):
        await client.structured(stage=stage, system="s", user="u", schema=Echo)
    assert len(cache) == 0
    assert (await client.structured(stage=stage, system="s", user="u", schema=Echo)).text == "u"
    assert server.count() == 2 and len(cache) == 1


def test_cache_key_covers_model_schema_and_prompt() -> None:
    base = cache_key("m", Echo, "sys", "user")
    assert base == cache_key("m", Echo, "sys", "user")
    variants = {
        cache_key("m2", Echo, "sys", "user"),
        cache_key("m", Other, "sys", "user"),
        cache_key("m", Echo, "sys2", "user"),
        cache_key("m", Echo, "sys", "user2"),
        cache_key("m", Echo, "sysu", "ser"),
    }
    assert base not in variants and len(variants) == 5


# ---- rate limiting (virtual clock: no wall-clock thresholds) ---------------------------------
class _VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock the test moves forward; due timers then fire at once."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped = 0.0

    def time(self) -> float:
        return super().time() + self.skipped

    def advance(self, seconds: float) -> None:
        self.skipped += seconds


def run_on_virtual_clock(
    scenario: Callable[[_VirtualClockLoop], Coroutine[Any, Any, None]],
) -> None:
    with asyncio.Runner(loop_factory=_VirtualClockLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, _VirtualClockLoop)
        runner.run(scenario(loop))


def _client(server: ScriptedLLMServer, **overrides: Any) -> LLMClient:
    options: dict[str, Any] = {"base_url": server.base_url, "api_key": "k", "model": "m"}
    return LLMClient(**(options | overrides))


def test_requests_per_minute_limit_is_shared_by_concurrent_calls(
    server: ScriptedLLMServer,
) -> None:
    async def scenario(clock: _VirtualClockLoop) -> None:
        client = _client(server, requests_per_minute=3)
        tasks = [
            asyncio.create_task(
                client.structured(stage=f"stage-{i % 2}", system="s", user=f"u{i}", schema=Echo)
            )
            for i in range(5)
        ]
        finished = asyncio.as_completed(tasks)
        for _ in range(3):  # a bucket of 3 requests a minute lets three through at once
            await next(finished)
        assert server.count() == 3
        assert sum(t.done() for t in tasks) == 3
        assert not client.limiter.requests.has_capacity()

        for expected in (4, 5):  # then one more every 60 / 3 = 20 seconds
            clock.advance(20.0)
            await next(finished)
            assert server.count() == expected
            assert sum(t.done() for t in tasks) == expected
        assert client.stats.calls == {"stage-0": 3, "stage-1": 2}
        await client.close()

    run_on_virtual_clock(scenario)


def test_tokens_per_minute_limit_holds_back_large_prompts(server: ScriptedLLMServer) -> None:
    async def scenario(clock: _VirtualClockLoop) -> None:
        client = _client(server, tokens_per_minute=1000)
        big = "x" * 2400  # about 600 tokens: two do not fit in one minute's 1000
        first = asyncio.create_task(client.structured(stage="t", system="", user=big, schema=Echo))
        second = asyncio.create_task(
            client.structured(stage="t", system="", user=big + "y", schema=Echo)
        )
        await first
        assert server.count() == 1 and not second.done()
        assert not client.limiter.tokens.has_capacity(600)

        clock.advance(60.0)
        await second
        assert server.count() == 2
        await client.close()

    run_on_virtual_clock(scenario)


async def test_prompt_larger_than_the_token_budget_still_goes_out(
    server: ScriptedLLMServer, make_client: MakeClient, stage: str
) -> None:
    client = make_client(tokens_per_minute=10)
    result = await client.structured(stage=stage, system="s", user="y" * 400, schema=Echo)
    assert result.length == 400


# ---- strict schema ---------------------------------------------------------------------------
class Place(BaseModel):
    name: str


class Node(BaseModel):
    label: str
    children: list[Node] = []
    parent: Node | None = None


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=0, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Rich(BaseModel):
    title: str = Field(min_length=1, max_length=80, description="a title")
    home: Place = Field(description="where it lives")
    visited: list[Place] = []
    nickname: str | None = None
    score: float = 0.5
    pet: Cat | Dog = Field(discriminator="kind")
    tree: Node | None = None


def test_strict_schema_requires_every_field_and_closes_objects() -> None:
    schema = strict_json_schema(Rich)

    assert strict_schema_problems(schema) == []
    assert schema["required"] == list(Rich.model_fields)
    props = schema["properties"]
    assert props["nickname"]["anyOf"] == [{"type": "string"}, {"type": "null"}]
    assert "default" not in props["score"]
    assert props["title"] == {"type": "string", "title": "Title", "description": "a title"}
    # a described nested model is inlined (OpenAI refuses $ref with siblings)
    assert props["home"]["description"] == "where it lives"
    assert props["home"]["additionalProperties"] is False
    assert "$ref" not in props["home"]
    assert props["pet"]["anyOf"] and "oneOf" not in props["pet"]
    assert schema["$defs"]["Cat"]["properties"]["kind"]["enum"] == ["cat"]
    assert "const" not in schema["$defs"]["Cat"]["properties"]["kind"]
    assert schema["$defs"]["Cat"]["properties"]["lives"]["maximum"] == 9
    node = schema["$defs"]["Node"]
    assert node["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert node["required"] == ["label", "children", "parent"]


@pytest.mark.parametrize(
    ("annotation", "problem"),
    [
        (dict[str, int], "open objects"),
        (dict, "open objects"),
        (Any, "without a type"),
        (tuple[int, str], "tuples"),
    ],
)
def test_strict_schema_refuses_what_strict_mode_cannot_express(
    annotation: Any, problem: str
) -> None:
    model = type("Bad", (BaseModel,), {"__annotations__": {"field": annotation}})
    with pytest.raises(StrictSchemaError, match=problem) as caught:
        strict_json_schema(model)
    assert "Bad.field" in str(caught.value)


async def test_an_unsupported_schema_fails_before_any_request(
    server: ScriptedLLMServer, make_client: MakeClient, stage: str
) -> None:
    class Loose(BaseModel):
        attributes: dict[str, str]

    with pytest.raises(StrictSchemaError, match="Loose.attributes"):
        await make_client().structured(stage=stage, system="s", user="u", schema=Loose)
    assert server.count(status=None) == 0


async def test_rich_schema_round_trip(server: ScriptedLLMServer, make_client: MakeClient) -> None:
    server.on(
        "Rich",
        lambda req: {
            "title": "t", "home": {"name": "h"}, "visited": [], "nickname": None, "score": 1,
            "pet": {"kind": "dog", "good": True},
            "tree": {"label": "root", "children": [{"label": "a", "children": [], "parent": None}],
                     "parent": None},
        },
    )  # fmt: skip
    result = await make_client().structured(stage="rich", system="s", user="u", schema=Rich)
    assert isinstance(result.pet, Dog) and result.tree and result.tree.children[0].label == "a"


# ---- construction ----------------------------------------------------------------------------
async def test_from_settings(server: ScriptedLLMServer, tmp_path: Any, stage: str) -> None:
    assert LLMClient.from_settings(Settings(_env_file=None, llm_base_url=None)) is None

    settings = Settings(
        _env_file=None,
        llm_base_url=server.base_url,
        llm_api_key="secret",
        llm_model="fake-model",
        llm_max_attempts=2,
        data_dir=tmp_path / "data",
    )
    client = LLMClient.from_settings(settings)
    assert client is not None
    assert (client.model, client.max_attempts) == ("fake-model", 2)
    assert isinstance(client.cache, SqliteResponseCache)
    assert client.cache.path == tmp_path / "data" / "llm_cache.sqlite3"
    await client.structured(stage=stage, system="s", user="u", schema=Echo)
    await client.close()
    assert len(SqliteResponseCache(tmp_path / "data" / "llm_cache.sqlite3")) == 1


def test_llm_error_survives_pickling() -> None:
    err = LLMError("boom", stage="extract", kind="timeout", attempts=3)
    copy = pickle.loads(pickle.dumps(err))
    assert (str(copy), copy.stage, copy.kind, copy.attempts) == ("boom", "extract", "timeout", 3)
