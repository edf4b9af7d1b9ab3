"""Embedders: hashing, offline MiniLM (really run, also with the network off) and the
OpenAI-compatible client against a scripted HTTP server on loopback."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import openai
import pytest

from tidegraph.embed import (
    EmbedderConfigError,
    HashingEmbedder,
    MiniLMEmbedder,
    OpenAIEmbedder,
    cosine,
    make_embedder,
)
from tidegraph.embed.openai_embedder import EmbeddingResponseError
from tidegraph.settings import Settings

REPO = Path(__file__).resolve().parents[2]

NAMES = ["Acme Corp", "ACME Corporation", "printer", "Bob Smith", "", "the Eiffel Tower in Paris"]
SAME_PAIRS = [
    ("Acme Corp", "ACME Corporation"),
    ("Bob Smith", "Robert Smith"),
    ("Maria is the manager of the sales team.", "Maria manages the sales team."),
]
UNRELATED_PAIRS = [
    ("Acme Corp", "coffee machine"),
    ("Bob Smith", "Kubernetes cluster"),
    ("Maria is the manager of the sales team.", "The Kubernetes cluster ran out of memory."),
]


def assert_unit(vectors: list[list[float]], dim: int) -> None:
    for vector in vectors:
        assert len(vector) == dim
        assert all(isinstance(x, float) for x in vector)
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, abs_tol=1e-6)


# --- hashing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [8, 64, 384])
async def test_hashing_shape_normalised_order(dim: int) -> None:
    embedder = HashingEmbedder(dim=dim)
    vectors = await embedder.embed(NAMES)
    assert len(vectors) == len(NAMES)
    assert_unit(vectors, dim)
    singles = [(await embedder.embed([name]))[0] for name in NAMES]
    assert vectors == singles  # order kept, no dependence on the batch
    assert await embedder.embed([]) == []
    assert embedder.dim == dim and embedder.model_name == f"hashing-{dim}"


def test_hashing_is_stable_across_processes() -> None:
    """No Python hash(): another process (another hash seed) computes the same vector."""
    script = (
        "import json; from tidegraph.embed.hashing import HashingEmbedder; "
        "print(json.dumps(HashingEmbedder(64).embed_sync('Acme Corp, Berlin')))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == HashingEmbedder(64).embed_sync("Acme Corp, Berlin")


async def test_hashing_similarity_follows_spelling() -> None:
    embedder = HashingEmbedder()
    t = embedder.thresholds

    async def cos(a: str, b: str) -> float:
        va, vb = await embedder.embed([a, b])
        return cosine(va, vb)

    assert await cos("Acme Corp", "ACME Corporation") >= t.entity_same
    assert await cos("IBM", "International Business Machines") >= t.entity_candidate
    assert await cos("Acme Corp", "Acme Corp.") == pytest.approx(1.0)
    for a, b in UNRELATED_PAIRS:
        assert await cos(a, b) < t.entity_candidate
    for (same_a, same_b), (other_a, other_b) in zip(SAME_PAIRS, UNRELATED_PAIRS, strict=True):
        assert await cos(same_a, same_b) > await cos(other_a, other_b)


# --- MiniLM -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    embedder = MiniLMEmbedder(batch_size=3)  # small batches: several per call in these tests
    embedder.load()
    return embedder


async def test_minilm_shape_normalised_deterministic(minilm: MiniLMEmbedder) -> None:
    first = await minilm.embed(NAMES)
    second = await minilm.embed(NAMES)
    assert len(first) == len(NAMES)
    assert_unit(first, 384)
    assert first == second
    assert await minilm.embed([]) == []
    assert (minilm.model_name, minilm.dim) == ("all-MiniLM-L6-v2-int8", 384)


async def test_minilm_batch_equals_one_by_one_in_order(minilm: MiniLMEmbedder) -> None:
    texts = NAMES + [a for a, _ in SAME_PAIRS] + [b for _, b in UNRELATED_PAIRS]
    batched = await minilm.embed(texts)
    for text, vector in zip(texts, batched, strict=True):
        (alone,) = await minilm.embed([text])
        assert max(abs(x - y) for x, y in zip(vector, alone, strict=True)) < 1e-5, text


async def test_minilm_paraphrases_score_above_unrelated(minilm: MiniLMEmbedder) -> None:
    async def cos(a: str, b: str) -> float:
        va, vb = await minilm.embed([a, b])
        return cosine(va, vb)

    same = [await cos(a, b) for a, b in SAME_PAIRS]
    unrelated = [await cos(a, b) for a, b in UNRELATED_PAIRS]
    assert min(same) > max(unrelated) + 0.3, (same, unrelated)
    t = minilm.thresholds
    assert await cos("Acme Corp", "ACME Corporation") >= t.entity_same
    assert await cos("IBM", "International Business Machines") >= t.entity_candidate
    assert max(unrelated) < t.entity_candidate


async def test_minilm_does_not_block_the_event_loop(minilm: MiniLMEmbedder) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.002)
            ticks += 1

    task = asyncio.create_task(ticker())
    started = time.perf_counter()
    await minilm.embed([f"fact number {i} about the Acme Corp shipment" for i in range(150)])
    elapsed = time.perf_counter() - started
    task.cancel()
    assert ticks >= min(5, int(elapsed / 0.01)), (ticks, elapsed)


def test_minilm_model_loaded_once_per_process(minilm: MiniLMEmbedder) -> None:
    other = MiniLMEmbedder(batch_size=7)
    assert other._model() is minilm._model()


OFFLINE_SCRIPT = textwrap.dedent(
    """
    import socket, sys
    events = []
    sys.addaudithook(
        lambda ev, args: events.append(ev) if ev.startswith("socket.") else None
    )
    try:
        socket.create_connection(("1.1.1.1", 443), timeout=2)
        sys.exit("the network is reachable: not an offline run")
    except OSError:
        pass
    events.clear()
    from tidegraph.embed import MiniLMEmbedder, cosine
    a, b, c = MiniLMEmbedder().embed_sync(["Acme Corp", "ACME Corporation", "printer"])
    assert not events, f"socket use while loading/embedding: {events}"
    print(f"offline ok {cosine(a, b):.3f} {cosine(a, c):.3f}")
    """
)


def test_minilm_runs_with_the_network_off() -> None:
    """Loads and embeds inside a network namespace without interfaces (unshare -n)."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.fail(
            "cannot prove MiniLM works offline: this test needs `unshare` (util-linux) and root "
            f"(unshare found: {unshare is not None}, euid: {os.geteuid()})",
            pytrace=False,
        )
    result = subprocess.run(
        [unshare, "-n", sys.executable, "-c", OFFLINE_SCRIPT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    _, _, same, unrelated = result.stdout.split()
    assert float(same) > 0.8 > float(unrelated)


# --- OpenAI-compatible endpoint ------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    dim: int | None = None  # vectors of another size than asked


@dataclass
class FakeEmbeddingsServer:
    """Answers POST /v1/embeddings: scripted replies first, then successes.

    Vectors are HashingEmbedder vectors scaled by 3 (the client must normalise them), listed in
    reverse order (the client must sort them by ``index``)."""

    dim: int
    script: list[Reply] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_reply(self, body: dict) -> Reply:
        with self.lock:
            self.requests.append(body)
            return self.script.pop(0) if self.script else Reply()

    def vectors(self, texts: list[str], dim: int) -> list[dict]:
        hashing = HashingEmbedder(dim=dim)
        data = [
            {"object": "embedding", "index": i, "embedding": [3 * x for x in hashing.embed_sync(t)]}
            for i, t in enumerate(texts)
        ]
        return data[::-1]


def _handler(fake: FakeEmbeddingsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/embeddings":
                self._send(404, {"error": {"message": "not found"}}, {})
                return
            reply = fake.next_reply(body)
            time.sleep(reply.delay)
            if reply.status != 200:
                error = {"error": {"message": f"scripted {reply.status}", "type": "scripted"}}
                self._send(reply.status, error, reply.headers)
                return
            data = fake.vectors(body["input"], reply.dim or fake.dim)
            usage = {"prompt_tokens": 1, "total_tokens": 1}
            answer = {"object": "list", "data": data, "model": body["model"], "usage": usage}
            self._send(200, answer, {})

        def _send(self, status: int, payload: dict, headers: dict[str, str]) -> None:
            raw = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(raw)

    return Handler


@pytest.fixture
def fake_server() -> Iterator[tuple[FakeEmbeddingsServer, str]]:
    fake = FakeEmbeddingsServer(dim=16)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    server.block_on_close = False
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def _client(base_url: str, **kwargs: object) -> OpenAIEmbedder:
    options: dict = {"batch_size": 2, "backoff_initial": 0.01, "backoff_max": 0.05}
    options.update(kwargs)
    return OpenAIEmbedder(base_url, "test-key", "text-embedding-3-small", 16, **options)


async def test_openai_batches_retries_429_and_keeps_order(fake_server) -> None:
    fake, base_url = fake_server
    fake.script = [Reply(429, {"retry-after": "0"})]
    embedder = _client(base_url, max_concurrency=1)
    texts = ["Acme Corp", "ACME Corporation", "printer", "Bob Smith", "Berlin"]
    try:
        vectors = await embedder.embed(texts)
        assert await embedder.embed([]) == []
    finally:
        await embedder.close()
    expected = [HashingEmbedder(16).embed_sync(t) for t in texts]
    assert len(vectors) == len(texts)
    for got, want in zip(vectors, expected, strict=True):
        assert got == pytest.approx(want, abs=1e-9)
    assert_unit(vectors, 16)
    # one 429, then three batches of at most 2 (the first batch sent twice)
    assert [r["input"] for r in fake.requests] == [
        texts[0:2],
        texts[0:2],
        texts[2:4],
        texts[4:5],
    ]
    assert all(r["model"] == "text-embedding-3-small" for r in fake.requests)
    assert all("dimensions" not in r for r in fake.requests)


async def test_openai_sends_dimensions_only_when_asked(fake_server) -> None:
    fake, base_url = fake_server
    embedder = _client(base_url, send_dimensions=True)
    try:
        await embedder.embed(["one", "two", "three"])
    finally:
        await embedder.close()
    assert [r.get("dimensions") for r in fake.requests] == [16, 16]


async def test_openai_retries_5xx_and_timeouts_then_succeeds(fake_server) -> None:
    fake, base_url = fake_server
    fake.script = [Reply(503), Reply(delay=1.0), Reply(500)]
    embedder = _client(base_url, timeout=0.3)
    try:
        vectors = await embedder.embed(["Acme Corp"])
    finally:
        await embedder.close()
    assert len(fake.requests) == 4
    assert vectors[0] == pytest.approx(HashingEmbedder(16).embed_sync("Acme Corp"), abs=1e-9)


async def test_openai_gives_up_after_max_attempts(fake_server) -> None:
    fake, base_url = fake_server
    fake.script = [Reply(500)] * 10
    embedder = _client(base_url, max_attempts=3)
    try:
        with pytest.raises(openai.InternalServerError):
            await embedder.embed(["Acme Corp"])
    finally:
        await embedder.close()
    assert len(fake.requests) == 3


async def test_openai_does_not_retry_client_errors(fake_server) -> None:
    fake, base_url = fake_server
    fake.script = [Reply(400), Reply(400)]
    embedder = _client(base_url)
    try:
        with pytest.raises(openai.BadRequestError):
            await embedder.embed(["Acme Corp"])
    finally:
        await embedder.close()
    assert len(fake.requests) == 1


async def test_openai_rejects_vectors_of_another_dimension(fake_server) -> None:
    fake, base_url = fake_server
    fake.script = [Reply(dim=32)]
    embedder = _client(base_url)
    try:
        with pytest.raises(EmbeddingResponseError, match="TIDEGRAPH_EMBEDDING_DIM"):
            await embedder.embed(["Acme Corp"])
    finally:
        await embedder.close()


# --- make_embedder -----------------------------------------------------------------------------


def _settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


async def test_make_embedder_choices() -> None:
    assert isinstance(make_embedder(_settings(embedder="minilm")), MiniLMEmbedder)
    hashing = make_embedder(_settings(embedder="hashing", embedding_dim=128))
    assert isinstance(hashing, HashingEmbedder) and hashing.dim == 128
    with pytest.raises(EmbedderConfigError, match="TIDEGRAPH_LLM_BASE_URL"):
        make_embedder(_settings(embedder="openai", llm_base_url=None))
    remote = make_embedder(
        _settings(embedder="openai", llm_base_url="http://127.0.0.1:9/v1", embedding_dim=256)
    )
    try:
        assert isinstance(remote, OpenAIEmbedder)
        assert (remote.model_name, remote.dim, remote.send_dimensions) == (
            "text-embedding-3-small",
            256,
            True,
        )
    finally:
        await remote.close()
