"""Run ``tidegraph serve`` for a test: in a thread over an injected store (a real uvicorn server
on a free loopback port), or as a subprocess over the real stores; plus an in-memory store with
exact search methods, for the searches the real stores cannot answer yet.

Waiting for a server to come up polls ``/healthz`` until a deadline (a condition, not a sleep).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from tests.support.crm_feed import CRM_MAPPING
from tests.support.metrics import free_port
from tests.support.processes import terminate_with_parent
from tests.unit.recall_fixtures import RecallGraph
from tidegraph.app.memory import Memory
from tidegraph.app.serving.http_api import create_app
from tidegraph.app.serving.server import uvicorn_config
from tidegraph.app.serving.service import MemoryService
from tidegraph.app.serving.settings import KeyRing, ServeSettings
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.runtime import open_runtime
from tidegraph.records.graph import CommunityRecord
from tidegraph.records.search import Hit, Kind, SearchScope
from tidegraph.settings import Settings
from tidegraph.stores.memory.store import MemoryStore
from tidegraph.stores.roles import Search

REPO = Path(__file__).resolve().parents[2]
TIDEGRAPH = str(Path(sys.executable).with_name("tidegraph"))
START_TIMEOUT = 60.0


class SearchableMemoryStore(MemoryStore):
    """The in-memory store with its search (tidegraph/recall/source.py) exact and brute force
    over a snapshot of its records (tests/unit/recall_fixtures.RecallGraph)."""

    def __init__(self) -> None:
        super().__init__()
        self.search = _SnapshotSearch(self)


class _SnapshotSearch(Search):
    """The five searches over a ``RecallGraph`` of the store's records as they are at each
    call."""

    def __init__(self, store: SearchableMemoryStore) -> None:
        self._store = store

    def _graph(self) -> RecallGraph:
        store = self._store
        graph = RecallGraph()
        graph.entities = dict(store._entities)
        graph.facts = dict(store._facts)
        graph.episodes = dict(store._episodes)
        graph.mentions = sorted(store._mentions)
        for uuid, c in store._communities.items():
            members = sorted(e for cu, e in store._members if cu == uuid)
            record = CommunityRecord(
                uuid=uuid,
                name=c.name,
                summary=c.summary,
                members=members,
                name_embedding=c.name_embedding,
            )
            graph.communities[uuid] = (c.group_id, record)
        return graph

    async def fulltext_search(
        self, scope: SearchScope, kind: Kind, text: str, limit: int
    ) -> list[Hit]:
        return await self._graph().fulltext_search(scope, kind, text, limit)

    async def vector_search(
        self, scope: SearchScope, kind: Kind, embedding: list[float], limit: int
    ) -> list[Hit]:
        return await self._graph().vector_search(scope, kind, embedding, limit)

    async def expand_facts(
        self, scope: SearchScope, seeds: list[str], hops: int, limit: int
    ) -> list[Hit]:
        return await self._graph().expand_facts(scope, seeds, hops, limit)

    async def recent_episode_entities(self, scope: SearchScope, episodes: int) -> list[str]:
        return await self._graph().recent_episode_entities(scope, episodes)

    async def entity_distances(
        self, scope: SearchScope, centre: str, uuids: list[str], max_hops: int
    ) -> dict[str, int]:
        return await self._graph().entity_distances(scope, centre, uuids, max_hops)


def memory_settings(tmp: Path, **overrides: Any) -> Settings:
    mapping = tmp / "mapping.yaml"
    mapping.write_text(CRM_MAPPING)
    values: dict[str, Any] = {"embedder": "hashing", "data_dir": tmp / "data", "mappings": mapping}
    return Settings(**{**values, **overrides})


def in_memory_service(
    settings: Settings, serve: ServeSettings | None = None
) -> Callable[[], Awaitable[MemoryService]]:
    """Opens a Memory over a fresh SearchableMemoryStore (in the server's event loop)."""
    serve = serve or ServeSettings()

    async def opened() -> MemoryService:
        runtime = await open_runtime(
            settings,
            mapping_path=settings.mappings,
            store=SearchableMemoryStore(),
            embedder=HashingEmbedder(dim=64),
            use_llm=False,
        )
        return MemoryService(
            Memory(runtime), wait_seconds=5.0, waits_per_key=serve.serve_waits_per_key
        )

    return opened


@dataclass
class ThreadServer:
    """A real uvicorn server in a thread of this process, on a free loopback port, configured
    as ``tidegraph serve`` configures it (``uvicorn_config``: the header deadline)."""

    app: Any
    port: int = field(default_factory=free_port)
    settings: ServeSettings = field(default_factory=ServeSettings)

    def __post_init__(self) -> None:
        config = uvicorn_config(
            self.app, "127.0.0.1", self.port, self.settings, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise AssertionError("tidegraph serve (thread) did not start")
            time.sleep(0.02)  # polling a condition with a deadline
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def thread_server(
    tmp: Path,
    keys: dict[str, list[str]],
    serve: ServeSettings | None = None,
    **settings: Any,
) -> ThreadServer:
    serve = serve or ServeSettings(serve_max_body_bytes=64 * 1024)
    app = create_app(
        in_memory_service(memory_settings(tmp, **settings), serve),
        KeyRing(keys),
        max_body_bytes=serve.serve_max_body_bytes,
        body_timeout_seconds=serve.serve_body_timeout_seconds,
    )
    return ThreadServer(app, settings=serve).start()


@dataclass
class ProcessServer:
    """``tidegraph serve`` as a subprocess (the real command, the real stores)."""

    env: dict[str, str]
    log: Path
    args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    command: str = "serve"
    ready_path: str = "/readyz"  # up once this answers ready_status
    ready_status: int = 200

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ProcessServer:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [TIDEGRAPH, self.command, "--port", str(self.port), *self.args],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=terminate_with_parent,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"tidegraph {self.command} exited:\n{self.log_tail()}")
            try:
                answer = httpx.get(f"{self.url}{self.ready_path}", timeout=2)
                if answer.status_code == self.ready_status:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"tidegraph {self.command} not ready:\n{self.log_tail()}")
            time.sleep(0.1)  # polling a condition with a deadline

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def serve_env(tmp: Path, **values: str) -> dict[str, str]:
    """The environment of a server subprocess: this one's, without TIDEGRAPH_ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGRAPH_")}
    mapping = tmp / "mapping.yaml"
    mapping.write_text(CRM_MAPPING)
    env.update(
        TIDEGRAPH_EMBEDDER="hashing",
        TIDEGRAPH_DATA_DIR=str(tmp / "data"),
        TIDEGRAPH_MAPPINGS=str(mapping),
        TIDEGRAPH_LOG_LEVEL="INFO",
    )
    env.update(values)
    return env


async def poll(probe: Callable[[], Awaitable[Any]], done: Callable[[Any], bool], what: str,
               timeout: float = 60.0) -> Any:  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if done(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {result!r}")
        await asyncio.sleep(0.1)
