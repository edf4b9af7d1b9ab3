"""Graphiti's side of the benchmark; runs under the Graphiti venv's interpreter.

    .bench-venvs/graphiti/bin/python benchmarks/graphiti_runner.py SPEC.json RESULT.json

SPEC (written by benchmarks/graphiti_compare.py): ``neo4j_uri``, ``base_url`` (the fake LLM
server), ``model``, ``embedding_dim``, ``groups`` (group_id -> episodes in order, each
``{name, content, source_description, reference_time}``), ``build_indices`` and optionally
``profile`` (a path prefix for a pyinstrument profile).

Graphiti is set up as documented for an OpenAI-compatible endpoint: ``OpenAIGenericClient``
(chat completions with a ``json_schema`` response format named after the response model; the
default ``OpenAIClient`` uses the Responses API with ``responses.parse``), an embedder that is
tidegraph's feature-hashing embedder (its module loaded from this repository: the same
algorithm, no network; the dimension is the spec's ``embedding_dim``) and a cross-encoder that
keeps the order it is given (no model, no network; ``add_episode`` does not rerank).
``add_episode`` is awaited episode by episode within a group (as Graphiti requires) while the
groups run concurrently (asyncio.gather). Telemetry is off. This file imports nothing from
tidegraph's environment.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import re
import sys
import time
import traceback
import types
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ["GRAPHITI_TELEMETRY_ENABLED"] = "false"

REPO = Path(__file__).resolve().parents[1]


def load_hashing_embedder(dim: int) -> Any:
    """tidegraph's HashingEmbedder, loaded from its files without importing tidegraph."""
    for package in ("tidegraph", "tidegraph.embed"):
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = []  # a namespace stub: only the two files below are loaded
            sys.modules[package] = module
    for name in ("base", "hashing"):
        spec = importlib.util.spec_from_file_location(
            f"tidegraph.embed.{name}", REPO / "tidegraph" / "embed" / f"{name}.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["tidegraph.embed.hashing"].HashingEmbedder(dim=dim)


def make_clients(spec: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(llm client, embedder, cross-encoder) for Graphiti."""
    from graphiti_core.cross_encoder.client import CrossEncoderClient
    from graphiti_core.embedder.client import EmbedderClient, EmbedderConfig
    from graphiti_core.llm_client.config import LLMConfig
    from graphiti_core.llm_client.openai_generic_client import OpenAIGenericClient

    hashing = load_hashing_embedder(int(spec["embedding_dim"]))

    class HashingEmbedderClient(EmbedderClient):
        def __init__(self) -> None:
            self.config = EmbedderConfig(embedding_dim=hashing.dim)

        async def create(self, input_data: str | list[str] | Iterable[Any]) -> list[float]:
            text = input_data if isinstance(input_data, str) else next(iter(input_data))
            return hashing.embed_sync(str(text))

        async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
            return [hashing.embed_sync(text) for text in input_data_list]

    class KeepOrderCrossEncoder(CrossEncoderClient):
        async def rank(self, query: str, passages: list[str]) -> list[tuple[str, float]]:
            n = max(len(passages), 1)
            return [(p, 1.0 - i / n) for i, p in enumerate(passages)]

    config = LLMConfig(
        api_key="bench",
        model=spec["model"],
        small_model=spec["model"],
        base_url=spec["base_url"],
    )
    llm = OpenAIGenericClient(config=config, structured_output_mode="json_schema")
    return llm, HashingEmbedderClient(), KeepOrderCrossEncoder()


def graphiti_index_names() -> list[str]:
    """Names of the Neo4j indexes ``build_indices_and_constraints`` creates."""
    from graphiti_core.driver.driver import GraphProvider
    from graphiti_core.graph_queries import get_fulltext_indices, get_range_indices

    statements = get_range_indices(GraphProvider.NEO4J) + get_fulltext_indices(GraphProvider.NEO4J)
    names = (re.search(r"INDEX\s+(\w+)\s+IF NOT EXISTS", s) for s in statements)
    return sorted({m.group(1) for m in names if m})


def count_neo4j_queries() -> dict[str, int]:
    """Count every Cypher statement the neo4j driver sends (patches a private method; the
    same neo4j version runs on both sides). The dict's ``queries`` grows as they are sent."""
    from neo4j._async.work.result import AsyncResult

    counter = {"queries": 0}
    original = AsyncResult._run

    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        counter["queries"] += 1
        return await original(self, *args, **kwargs)

    AsyncResult._run = counted  # type: ignore[method-assign]
    return counter


async def run_group(graphiti: Any, group_id: str, episodes: list[dict[str, Any]]) -> list[Any]:
    from graphiti_core.nodes import EpisodeType

    failures = []
    for episode in episodes:
        try:
            await graphiti.add_episode(
                name=episode["name"],
                episode_body=episode["content"],
                source_description=episode["source_description"],
                reference_time=datetime.fromisoformat(episode["reference_time"]),
                source=EpisodeType.message,
                group_id=group_id,
            )
        except Exception as exc:  # recorded; the group goes on as tidegraph's does
            failures.append(
                {
                    "group_id": group_id,
                    "episode": episode["name"],
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=6),
                }
            )
    return failures


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    from graphiti_core import Graphiti
    from graphiti_core.driver.neo4j_driver import Neo4jDriver

    llm, embedder, cross_encoder = make_clients(spec)
    driver = Neo4jDriver(spec["neo4j_uri"], "neo4j", "unused-auth-disabled")
    graphiti = Graphiti(
        graph_driver=driver, llm_client=llm, embedder=embedder, cross_encoder=cross_encoder
    )
    result: dict[str, Any] = {"graphiti_index_names": graphiti_index_names()}
    try:
        if spec.get("build_indices"):
            await graphiti.build_indices_and_constraints()
        groups: dict[str, list[dict[str, Any]]] = spec["groups"]
        queries = count_neo4j_queries()
        started = time.perf_counter()
        cpu_started = time.process_time()
        per_group = await asyncio.gather(
            *(run_group(graphiti, gid, episodes) for gid, episodes in groups.items())
        )
        result["seconds"] = time.perf_counter() - started
        result["cpu_seconds"] = time.process_time() - cpu_started
        result["neo4j_queries"] = queries["queries"]
        result["episodes"] = sum(len(e) for e in groups.values())
        result["failures"] = [f for failures in per_group for f in failures]
    finally:
        await graphiti.close()
    return result


def peak_rss_mb() -> float | None:
    """This process's peak resident memory (VmHWM: counts only since exec, unlike rusage)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def write_profile(profiler: Any, prefix: str) -> None:
    """HTML, a call tree showing this side's own frames, and the top functions by self time."""
    Path(f"{prefix}.html").write_text(profiler.output_html())
    options = {"show_regex": r".*graphiti_core.*"}
    tree = profiler.output_text(processor_options=options)
    flat = profiler.output_text(flat=True, processor_options=options)
    Path(f"{prefix}.txt").write_text(tree + "\n\nTop functions by self time:\n" + flat)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("neo4j.notifications").setLevel(logging.ERROR)  # unknown-property notes
    spec_path, result_path = Path(sys.argv[1]), Path(sys.argv[2])
    spec = json.loads(spec_path.read_text())
    profile = spec.get("profile")
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(async_mode="enabled")
        profiler.start()
        result = asyncio.run(run(spec))
        profiler.stop()
        write_profile(profiler, profile)
    else:
        result = asyncio.run(run(spec))
    result["peak_rss_mb"] = peak_rss_mb()
    result_path.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
