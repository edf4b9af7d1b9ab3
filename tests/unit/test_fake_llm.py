"""The scripted OpenAI-compatible server: embeddings, routing, strictness and shutdown."""

from __future__ import annotations

import http.client
import json
import math
import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.fake_llm import (
    EMBEDDINGS,
    TIMEOUT_STATUS,
    ScriptedLLMServer,
    fake_embedding,
)


@pytest.fixture
def server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer(embedding_dim=16) as srv:
        srv.on("Echo", lambda req: {"text": req.user})
        yield srv


def post(
    server: ScriptedLLMServer, path: str, body: dict[str, Any], timeout: float = 10.0
) -> tuple[int, dict[str, Any]]:
    host, port = server.base_url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def chat_body(name: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    schema = schema or {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    return {
        "model": "m",
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": True},
        },
    }


async def test_embeddings_are_deterministic_unit_vectors(server: ScriptedLLMServer) -> None:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    try:
        default = await client.embeddings.create(model="e", input=["alpha", "beta"])  # base64
        floats = await client.embeddings.create(model="e", input="alpha", encoding_format="float")
        sized = await client.embeddings.create(model="e", input="alpha", dimensions=8)
    finally:
        await client.close()

    alpha, beta = (d.embedding for d in default.data)
    assert len(alpha) == 16 and len(sized.data[0].embedding) == 8
    assert math.isclose(sum(v * v for v in alpha), 1.0, rel_tol=1e-5)
    assert alpha != beta
    assert floats.data[0].embedding == pytest.approx(alpha, abs=1e-6)
    assert floats.data[0].embedding == pytest.approx(fake_embedding("alpha", 16))
    assert server.count(EMBEDDINGS) == 3


async def test_embedding_faults_are_matched_only_by_name(server: ScriptedLLMServer) -> None:
    server.inject("500")  # no schema name: chat requests only
    server.inject("503", schema_name=EMBEDDINGS)
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    try:
        with pytest.raises(openai.InternalServerError):
            await client.embeddings.create(model="e", input="x")
        await client.embeddings.create(model="e", input="x")
    finally:
        await client.close()
    assert [status for _, _, status in server.requests] == [503, 200]
    assert post(server, "/v1/chat/completions", chat_body("Echo"))[0] == 500


def test_chat_answer_format_and_recording(server: ScriptedLLMServer) -> None:
    status, body = post(server, "/v1/chat/completions", chat_body("Echo"))

    assert status == 200 and body["object"] == "chat.completion"
    assert json.loads(body["choices"][0]["message"]["content"]) == {"text": "hi"}
    assert body["usage"]["prompt_tokens"] == 2  # "syshi": 5 chars / 4, rounded up
    [(name, request, recorded)] = server.requests
    assert (name, request.system, request.user, recorded) == ("Echo", "sys", "hi", 200)
    assert request.schema["required"] == ["text"]


def test_refusals_are_clear(server: ScriptedLLMServer) -> None:
    status, body = post(server, "/v1/chat/completions", chat_body("Nope"))
    assert status == 400 and "no handler for schema 'Nope'" in body["error"]["message"]

    loose = {"type": "object", "properties": {"text": {"type": "string"}}}
    status, body = post(server, "/v1/chat/completions", chat_body("Echo", loose))
    assert status == 400 and "additionalProperties" in body["error"]["message"]

    assert post(server, "/v1/nowhere", {})[0] == 404
    with pytest.raises(ValueError, match="unknown fault kind"):
        server.inject("slow")


def test_content_faults(server: ScriptedLLMServer) -> None:
    server.inject("malformed").inject("invalid_schema")
    contents = [
        post(server, "/v1/chat/completions", chat_body("Echo"))[1]["choices"][0]["message"][
            "content"
        ]
        for _ in range(3)
    ]
    with pytest.raises(json.JSONDecodeError):
        json.loads(contents[0])
    assert json.loads(contents[1]) == {}
    assert json.loads(contents[2]) == {"text": "hi"}


def test_reset_forgets_requests_and_faults(server: ScriptedLLMServer) -> None:
    server.inject("500", times=5)
    post(server, "/v1/chat/completions", chat_body("Echo"))
    server.reset()
    assert server.requests == []
    assert post(server, "/v1/chat/completions", chat_body("Echo"))[0] == 200
    assert server.count() == 1


def test_close_releases_held_requests_and_idle_connections() -> None:
    server = ScriptedLLMServer(hold_seconds=600)
    server.on("Echo", lambda req: {"text": "x"})
    server.inject("timeout")
    outcome: list[BaseException] = []

    def held_client() -> None:
        try:
            post(server, "/v1/chat/completions", chat_body("Echo"), timeout=600)
        except BaseException as exc:  # the server hangs up on close
            outcome.append(exc)

    idle = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    idle.embeddings.create(model="e", input="keep-alive")  # leaves an idle keep-alive socket
    thread = threading.Thread(target=held_client)
    thread.start()
    assert server.wait_for_requests(2)
    assert server.count("Echo", status=TIMEOUT_STATUS) == 1

    server.close()  # returns only after every handler thread has ended
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert outcome and isinstance(outcome[0], (http.client.HTTPException, OSError))
    idle.close()
