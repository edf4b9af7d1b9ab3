"""Search and context latency at 10k and 100k facts per group (docs/retrieval.md "Memory
retrieval").

A synthetic group is written straight through the store's own episode write (no chain, no
LLM: the graph's shape is what matters here): ``--facts`` facts between ``facts/5`` entities,
ten facts per episode, words drawn from a 2,000-word vocabulary so BM25 has realistic
postings, hashing embeddings (384 dimensions; the vector index does the same work for any
model of that size). Then ``--queries`` queries of 2-4 vocabulary words are searched with each
recipe and turned into context; p50/p95/p99 per recipe, in milliseconds.

    python -m benchmarks.recall_latency --facts 10000 --store neo4j
    python -m benchmarks.recall_latency --facts 100000 --store embedded
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.records.graph import EntityRecord, EpisodeRecord, EpisodeWrite, FactRecord
from tidegraph.records.search import SearchRequest

FACTS_PER_EPISODE = 10
DIM = 384
RELATIONS = [f"REL_{n:02d}" for n in range(20)]
START = datetime(2024, 1, 1, tzinfo=UTC)
WRITE_WINDOW = 32  # episode writes in flight while building (Neo4j commits them in groups)


def vocabulary(rng: random.Random, size: int = 2000) -> list[str]:
    letters = "bcdfghklmnprstvz"
    vowels = "aeiou"
    words: set[str] = set()
    while len(words) < size:
        n = rng.randint(2, 4)
        words.add("".join(rng.choice(letters) + rng.choice(vowels) for _ in range(n)))
    return sorted(words)


def _id(*parts: object) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "/".join(map(str, parts))))


async def build_group(
    store: Any, group_id: str, facts: int, seed: int, episodes: int | None = None
) -> float:
    """Write the synthetic group (``episodes`` episodes, default one per ten facts); returns
    the seconds it took."""
    per_episode = FACTS_PER_EPISODE if episodes is None else max(1, -(-facts // episodes))
    rng = random.Random(seed)
    words = vocabulary(rng)
    embedder = HashingEmbedder(dim=DIM)
    n_entities = max(facts // 5, 2)
    names = [" ".join(rng.sample(words, 2)).title() for _ in range(n_entities)]
    entity_uuids = [_id(group_id, "e", i) for i in range(n_entities)]
    started = time.perf_counter()
    written: set[int] = set()
    pending: list[asyncio.Future[bool]] = []
    for start in range(0, facts, per_episode):
        count = min(per_episode, facts - start)
        at = START + timedelta(minutes=start)
        episode_uuid = _id(group_id, "ep", start)
        ends = [(rng.randrange(n_entities), rng.randrange(n_entities)) for _ in range(count)]
        texts = [
            f"{names[s]} {rng.choice(['uses', 'owns', 'likes', 'reports'])} {names[o]} "
            + " ".join(rng.sample(words, 5))
            for s, o in ends
        ]
        content = ". ".join(texts)
        vectors = await embedder.embed([*texts, content])
        new = sorted({i for pair in ends for i in pair} - written)
        name_vectors = await embedder.embed([names[i] for i in new]) if new else []
        written.update(new)
        entities = [
            EntityRecord(
                uuid=entity_uuids[i],
                group_id=group_id,
                name=names[i],
                summary=" ".join(rng.sample(words, 6)),
                name_embedding=vector,
            )
            for i, vector in zip(new, name_vectors, strict=True)
        ]
        fact_records = [
            FactRecord(
                uuid=_id(group_id, "f", start + k),
                group_id=group_id,
                source_uuid=entity_uuids[s],
                target_uuid=entity_uuids[o],
                name=rng.choice(RELATIONS),
                fact=texts[k],
                fact_embedding=vectors[k],
                episodes=[episode_uuid],
                valid_at=at,
            )
            for k, (s, o) in enumerate(ends)
        ]
        episode = EpisodeRecord(
            uuid=episode_uuid,
            group_id=group_id,
            name=f"episode {start}",
            source="text",
            source_description="synthetic",
            content=content,
            valid_at=at,
            producer_id=f"ep-{start}",
            content_embedding=vectors[-1],
        )
        write = EpisodeWrite(
            episode=episode,
            mentions=sorted({entity_uuids[i] for pair in ends for i in pair}),
            facts=fact_records,
            entities=entities,
        )
        pending.append(asyncio.ensure_future(store.write_episode(group_id, write)))
        if len(pending) >= WRITE_WINDOW:  # submitted in order: the store commits them so
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return time.perf_counter() - started


def percentiles(values: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {
        "p50": round(cuts[49], 1),
        "p95": round(cuts[94], 1),
        "p99": round(cuts[98], 1),
        "mean": round(statistics.fmean(values), 1),
    }


async def measure(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    from tidegraph.recall.context import build_context
    from tidegraph.recall.search import Searcher
    from tidegraph.settings import Settings
    from tidegraph.stores import open_store

    settings = Settings(store=args.store, data_dir=data_dir, neo4j_uri=args.neo4j_uri)
    store = open_store(settings)
    embedder = HashingEmbedder(dim=DIM)
    group_id = (
        f"latency-{args.facts}-{args.seed}" if args.keep else f"latency-{uuid.uuid4().hex[:8]}"
    )
    result: dict[str, Any] = {"store": args.store, "facts": args.facts}
    try:
        await store.setup(DIM)
        per = (
            FACTS_PER_EPISODE if args.episodes is None else max(1, -(-args.facts // args.episodes))
        )
        last = _id(group_id, "ep", (args.facts - 1) // per * per)
        if args.keep and await store.episode_status(group_id, last) == "processed":
            result["build_seconds"] = 0.0  # kept from an earlier --keep run
        else:
            build = await build_group(store, group_id, args.facts, args.seed, args.episodes)
            result["build_seconds"] = round(build, 1)
        searcher = Searcher(store.search, embedder)
        rng = random.Random(args.seed + 1)
        words = vocabulary(random.Random(args.seed))
        queries = [" ".join(rng.sample(words, rng.randint(2, 4))) for _ in range(args.queries)]
        for recipe in args.recipes:
            await searcher.search(
                SearchRequest(query=queries[0], group_ids=[group_id], recipe=recipe)
            )  # warm-up
            search_ms: list[float] = []
            context_ms: list[float] = []
            cpu = time.process_time()
            for query in queries:
                started = time.perf_counter()
                results = await searcher.search(
                    SearchRequest(query=query, group_ids=[group_id], recipe=recipe)
                )
                searched = time.perf_counter()
                build_context(results, max_chars=4000)
                done = time.perf_counter()
                search_ms.append(1000 * (searched - started))
                context_ms.append(1000 * (done - started))
            result[recipe] = {
                "search_ms": percentiles(search_ms),
                "context_ms": percentiles(context_ms),
                # this process's CPU (all its threads) per query: what throughput is bound by
                "cpu_ms": round(1000 * (time.process_time() - cpu) / len(queries), 1),
            }
    finally:
        if args.store == "neo4j" and not args.keep:
            await store.forget.delete_group(group_id)
        await store.close()
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=10_000)
    parser.add_argument("--episodes", type=int, default=None, help="default: facts / 10")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--store", choices=("embedded", "neo4j"), default="neo4j")
    parser.add_argument("--neo4j-uri", default="bolt://127.0.0.1:17687")
    parser.add_argument("--recipes", default="facts_rrf,combined")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the group (named by --facts and --seed; embedded: in benchmarks/results/) "
        "and reuse it on the next run",
    )
    args = parser.parse_args(argv)
    args.recipes = [r for r in args.recipes.split(",") if r]
    if args.keep:  # the embedded store's folder is kept too
        kept = Path("benchmarks/results/latency-embedded")
        kept.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(measure(args, kept))
    else:
        with tempfile.TemporaryDirectory(prefix="tidegraph-latency-") as tmp:
            result = asyncio.run(measure(args, Path(tmp)))
    print(f"{args.store}, {args.facts} facts in one group (built in {result['build_seconds']} s)")
    for recipe in args.recipes:
        s, c = result[recipe]["search_ms"], result[recipe]["context_ms"]
        print(
            f"  {recipe:12s} search p50/p95/p99 {s['p50']}/{s['p95']}/{s['p99']} ms; "
            f"search+context p50/p95/p99 {c['p50']}/{c['p95']}/{c['p99']} ms; "
            f"CPU {result[recipe]['cpu_ms']} ms a query"
        )
    return result


if __name__ == "__main__":
    main()
