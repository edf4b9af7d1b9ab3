"""tidegraph's side of the Graphiti comparison, in a process of its own.

    python -m benchmarks.graphiti_tidegraph_runner SPEC.json RESULT.json

SPEC is the one benchmarks/graphiti_compare.py writes for both sides (``neo4j_uri``, ``base_url``,
``model``, ``embedding_dim``, ``groups``: group_id -> episode envelopes in order; optionally
``profile``; ``trace``: where each group's wall time goes, benchmarks/chain_trace.py). The
episodes go through the in-process pipeline (``tidegraph.pipelines.ingest.ingest``: extraction
-> resolution -> temporal -> invalidation + write, each group in order, every group at once)
into the Neo4j store, with the hashing embedder and
the real ``openai`` client (``LLMClient``) against the fake server. The client has no response cache
and a rate limit far above what the fake server can answer, so every LLM request goes over HTTP and
none waits for the limiter. A process of its own keeps the fake server's threads (in the comparing
process) off this interpreter's GIL, as for Graphiti.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.chain_trace import ChainTrace
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.llm import LLMClient
from tidegraph.pipelines.ingest import ingest
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.records.episode import Episode
from tidegraph.stores.neo4j.store import Neo4jStore


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


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = spec["groups"]
    episodes = [Episode.model_validate(e) for items in groups.values() for e in items]
    store = Neo4jStore(spec["neo4j_uri"])
    llm = LLMClient(
        base_url=spec["base_url"],
        api_key="bench",
        model=spec["model"],
        requests_per_minute=10_000_000,
        tokens_per_minute=10_000_000_000,
        cache=None,
        max_attempts=3,
    )
    try:
        await store.setup(int(spec["embedding_dim"]))
        pipeline = GroupRunner.of(
            store=store,
            embedder=HashingEmbedder(dim=int(spec["embedding_dim"])),
            llm=llm,
            mappings=None,
        )
        trace = ChainTrace() if spec.get("trace") else None
        if trace is not None:
            trace.install()
        queries = count_neo4j_queries()
        started = time.perf_counter()
        cpu_started = time.process_time()
        report = await ingest(pipeline, episodes, concurrency=max(len(groups), 1))
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_started
        neo4j_queries = queries["queries"]
    finally:
        await llm.close()
        await store.close()
    return {
        **({"chain": trace.summary()} if trace is not None else {}),
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "neo4j_queries": neo4j_queries,
        "episodes": report.episodes + len(report.failures),
        "report": {
            "entities_new": report.entities_new,
            "facts_new": report.facts_new,
            "facts_merged": report.facts_merged,
            "facts_closed": report.facts_closed,
            "facts_born_closed": report.facts_born_closed,
        },
        "client_stats": llm.stats.as_dict(),
        "failures": [
            {"group_id": f.group_id, "episode": f.episode_id, "error": f.failure.line()}
            for f in report.failures
        ],
    }


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
    options = {"show_regex": r".*(processors|tidegraph)/.*"}
    tree = profiler.output_text(processor_options=options)
    flat = profiler.output_text(flat=True, processor_options=options)
    Path(f"{prefix}.txt").write_text(tree + "\n\nTop functions by self time:\n" + flat)


def main() -> None:
    spec_path, result_path = Path(sys.argv[1]), Path(sys.argv[2])
    spec = orjson.loads(spec_path.read_bytes())
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
    result_path.write_bytes(orjson.dumps(result))


if __name__ == "__main__":
    main()
