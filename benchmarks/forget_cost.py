"""What a forget costs (docs/performance.md "Forgetting"): one episode of a large group, and a
subject with many mentions, on the embedded store or Neo4j.

    python -m benchmarks.forget_cost --store embedded --records 8000
    python -m benchmarks.forget_cost --store neo4j --records 8000 --neo4j-uri bolt://127.0.0.1:17687

One group gets the generated CRM feed (``tests.support.crm_feed``, one tenant) through the
real pipeline; then ``--forgets`` single episodes, chosen at random, are forgotten one after
the other (each on the group as the previous one left it), and ``--subjects`` entities with
about ``--mentions`` mentions each are forgotten by subject. Prints the seconds each took (p50,
p95, max), the group's size, which path each forget took (incremental or the whole group),
and writes ``benchmarks/results/forget_cost-<store>.json``. The group is deleted afterwards,
unless ``--keep FOLDER`` (the embedded store's files and the group's id stay in FOLDER): a
large group (``--records 90000``, about 100,000 facts; its ingest takes minutes) is ingested
once and measured again with ``--reuse FOLDER`` (each run forgets a few more of its episodes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from tests.support.crm_feed import crm_mappings, generate
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.metrics import FORGET_PATHS
from tidegraph.pipelines.forget import forget_episodes, forget_subject
from tidegraph.pipelines.ingest import ingest, read_jsonl
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.stores.base import GraphStore
from tidegraph.stores.neo4j.store import Neo4jStore
from tidegraph.stores.sqlite.store import SqliteStore

RESULTS = Path(__file__).parent / "results"
DIM = 384


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 3),
        "p95": round(at(0.95), 3),
        "max": round(ordered[-1], 3),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    kept = Path(args.reuse or args.keep) if (args.reuse or args.keep) else None
    folder = kept or Path(tempfile.mkdtemp(prefix="forget-cost-"))
    folder.mkdir(parents=True, exist_ok=True)
    store: GraphStore
    if args.store == "neo4j":
        store = Neo4jStore(args.neo4j_uri)
    else:
        store = SqliteStore(folder / "graph")
    await store.setup(DIM)
    runner = GroupRunner.of(
        store=store, embedder=HashingEmbedder(dim=DIM), llm=None, mappings=crm_mappings()
    )
    meta = folder / f"forget_cost-{args.store}.json"
    ingested: dict[str, Any]
    if args.reuse:
        ingested = orjson.loads(meta.read_bytes())
    else:
        prefix = f"forget{uuid.uuid4().hex[:8]}"
        feed = generate(args.records, 1, prefix=prefix, seed=args.seed)
        episodes, bad = read_jsonl(orjson.dumps(e) for e in feed.episodes)
        assert not bad
        started = time.perf_counter()
        report = await ingest(runner, episodes)
        ingested = {
            "group": feed.groups[0],
            "records": args.records,
            "ingest": report.line(),
            "ingest_seconds": round(time.perf_counter() - started, 1),
        }
        if args.keep:
            meta.write_bytes(orjson.dumps(ingested))
    group = ingested["group"]
    paths: list[str] = []
    try:
        size = await store.browse.counts(group)
        rng = random.Random(args.seed)
        history = await store.forget.group_history(group)
        ids = [e.producer_id for e in history.episodes]
        single: list[float] = []
        for producer in rng.sample(ids, args.forgets):
            before = _paths()
            started = time.perf_counter()
            await forget_episodes(runner, group, [producer])
            single.append(time.perf_counter() - started)
            paths.append(_path_taken(before))
        history = await store.forget.group_history(group)
        mentions: dict[str, int] = {}
        for entities in history.mentions.values():
            for entity in entities:
                mentions[entity] = mentions.get(entity, 0) + 1
        subjects = sorted(mentions, key=lambda e: (abs(mentions[e] - args.mentions), e))
        by_subject: list[float] = []
        subject_mentions: list[int] = []
        for entity in subjects[: args.subjects]:
            before = _paths()
            started = time.perf_counter()
            done = await forget_subject(runner, group, entity)
            by_subject.append(time.perf_counter() - started)
            subject_mentions.append(done.forgotten)
            paths.append(_path_taken(before))
        return {
            "store": args.store,
            **ingested,
            "group_size": size,
            "forget_one_episode_seconds": quantiles(single),
            "forget_subject_seconds": quantiles(by_subject),
            # in the order they ran: whether a slow one is the first (a cold cache, plans)
            "each_episode_seconds": [round(x, 3) for x in single],
            "each_subject_seconds": [round(x, 3) for x in by_subject],
            "subject_episodes": subject_mentions,
            "paths": paths,
        }
    finally:
        if kept is None:
            await store.forget.delete_group(group)
        await store.close()


def _paths() -> dict[str, float]:
    return {path: FORGET_PATHS.labels(path)._value.get() for path in ("incremental", "whole")}


def _path_taken(before: dict[str, float]) -> str:
    after = _paths()
    return next((p for p in after if after[p] > before[p]), "none")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["embedded", "neo4j"], default="embedded")
    parser.add_argument("--records", type=int, default=8000, help="CRM records in the group")
    parser.add_argument("--forgets", type=int, default=10, help="single episodes forgotten")
    parser.add_argument("--subjects", type=int, default=3, help="subjects forgotten")
    parser.add_argument("--mentions", type=int, default=100, help="mentions of a subject")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--neo4j-uri", default="bolt://127.0.0.1:17687")
    parser.add_argument("--keep", help="keep the store and the group in this folder")
    parser.add_argument("--reuse", help="measure on the group kept in this folder (--keep)")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    result = asyncio.run(run(args))
    result["command"] = "python -m benchmarks.forget_cost " + " ".join(sys.argv[1:])
    result["load_before"] = round(load, 2)
    result["load_after"] = round(os.getloadavg()[0], 2)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"forget_cost-{args.store}.json"
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
