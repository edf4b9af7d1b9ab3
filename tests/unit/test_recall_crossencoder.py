"""The HTTP cross-encoder (tidegraph/recall/crossencoder.py) against a real loopback
``/rerank`` server started by the test (no mock of the client)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tidegraph.recall.crossencoder import (
    HttpCrossEncoder,
    RerankError,
    cross_encoder_from_settings,
    read_scores,
)
from tidegraph.settings import Settings


@dataclass
class FakeReranker:
    """Scores a document by the query words it contains; answers best first, like Cohere."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[str | None] = field(default_factory=list)
    status: int = 200
    reply: Any = None  # a scripted body instead of the ranking

    def answer(self, body: dict[str, Any]) -> Any:
        if self.reply is not None:
            return self.reply
        query = set(body["query"].lower().split())
        scored = [
            {"index": i, "relevance_score": len(query & set(d.lower().split())) / len(query)}
            for i, d in enumerate(body["documents"])
        ]
        scored.sort(key=lambda r: -r["relevance_score"])
        return {"id": "r1", "results": scored[: body.get("top_n", len(scored))]}


@pytest.fixture
def reranker() -> Iterator[tuple[FakeReranker, str]]:
    fake = FakeReranker()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.requests.append(body)
            fake.headers.append(self.headers.get("Authorization"))
            status, payload = (404, {"error": "no route"}) if self.path != "/v1/rerank" else (
                fake.status, fake.answer(body)
            )  # fmt: skip
            raw = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


async def test_scores_come_back_in_document_order(reranker):
    fake, url = reranker
    encoder = HttpCrossEncoder(url + "/", "bge-reranker", "secret")
    try:
        docs = ["Alice works at Acme", "Bob likes tea", "Alice likes Acme tea"]
        scores = await encoder.scores("alice acme", docs)
        assert scores == [1.0, 0.0, 1.0]
        assert await encoder.scores("alice", []) == []
    finally:
        await encoder.close()
    assert fake.requests == [
        {"model": "bge-reranker", "query": "alice acme", "documents": docs, "top_n": 3}
    ]
    assert fake.headers == ["Bearer secret"]


async def test_no_key_sends_no_authorization(reranker):
    fake, url = reranker
    encoder = HttpCrossEncoder(url, "m")
    try:
        await encoder.scores("q", ["d"])
    finally:
        await encoder.close()
    assert fake.headers == [None]


async def test_http_errors_say_what_to_check(reranker):
    fake, url = reranker
    fake.status, fake.reply = 401, {"error": "bad key"}
    encoder = HttpCrossEncoder(url, "m", "wrong")
    try:
        with pytest.raises(RerankError, match=r"HTTP 401.*TIDEGRAPH_RERANK_API_KEY"):
            await encoder.scores("q", ["d"])
        fake.status, fake.reply = 200, {"data": []}
        with pytest.raises(RerankError, match="no 'results' list"):
            await encoder.scores("q", ["d"])
    finally:
        await encoder.close()
    missing = HttpCrossEncoder(url.replace("/v1", "/nothing"), "m")
    try:
        with pytest.raises(RerankError, match="HTTP 404"):
            await missing.scores("q", ["d"])
    finally:
        await missing.close()


async def test_an_unreachable_endpoint_is_explained():
    encoder = HttpCrossEncoder("http://127.0.0.1:9/v1", "m", timeout=2.0)
    try:
        with pytest.raises(RerankError, match="could not be reached.*TIDEGRAPH_RERANK_BASE_URL"):
            await encoder.scores("q", ["d"])
    finally:
        await encoder.close()


def test_read_scores_accepts_tei_lists_and_ranks_left_out_documents_last():
    assert read_scores([{"index": 1, "score": 0.5}, {"index": 0, "score": 0.9}], 2) == [0.9, 0.5]
    assert read_scores({"results": [{"index": 1, "relevance_score": 0.2}]}, 3) == [-0.8, 0.2, -0.8]
    with pytest.raises(RerankError, match="index 5 for 2"):
        read_scores({"results": [{"index": 5, "relevance_score": 1}]}, 2)
    with pytest.raises(RerankError, match="integer 'index'"):
        read_scores({"results": [{"index": "0", "relevance_score": 1}]}, 1)


def test_settings_turn_it_on_only_with_a_base_url():
    assert cross_encoder_from_settings(Settings(_env_file=None)) is None  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="TIDEGRAPH_RERANK_MODEL"):
        cross_encoder_from_settings(Settings(_env_file=None, rerank_base_url="http://x/v1"))  # type: ignore[call-arg]
    encoder = cross_encoder_from_settings(
        Settings(_env_file=None, rerank_base_url="http://x/v1", rerank_model="m")  # type: ignore[call-arg]
    )
    assert encoder is not None and encoder.url == "http://x/v1/rerank"
    with pytest.raises(ValueError, match="http:// or https://"):
        HttpCrossEncoder("x/v1", "m")
