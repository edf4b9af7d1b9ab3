"""Text episodes through tidegraph and through Graphiti, side by side, against one Neo4j.

    python -m benchmarks.graphiti_compare --latency-ms 0 50 200 --groups 16 --episodes 200
    python -m benchmarks.graphiti_compare --scaling            # 1, 4, 16, 64 groups at 50 ms
    python -m benchmarks.graphiti_compare --repeat 3          # median of 3, order alternating
    python -m benchmarks.graphiti_compare --latency-ms 0 --profile   # pyinstrument, both sides
    python -m benchmarks.graphiti_compare --latency-ms 50 --py-spy   # py-spy (GIL) CPU profile
    python -m benchmarks.graphiti_compare --cleanup   # leftovers of a killed run (SIGKILL)

One generated file of support-chat messages (benchmarks/text_feed.py: every message names
known entities and states known facts, some contradicting earlier ones, with its ground
truth) goes through

* **tidegraph**: the in-process pipeline (benchmarks/graphiti_tidegraph_runner.py) into the
  Neo4j store, hashing embedder, the real ``openai`` client;
* **Graphiti** (graphiti-core 0.31.2 in its own venv, benchmarks/graphiti_env.py):
  ``add_episode`` awaited in order within a group, all groups concurrently
  (benchmarks/graphiti_runner.py), with tidegraph's hashing embedder (383 dimensions: see
  ``GRAPHITI_EMBEDDING_DIM``) and no reranker model;

each in a process of its own, against the same Neo4j server under distinct group ids (deleted
afterwards), and the same fake OpenAI-compatible server in this process
(``ScriptedLLMServer``: every request answered after the fixed latency, from the ground truth:
benchmarks/graphiti_answers.py says how both get the same entities and facts). It prints
episodes/s of each, their ratio, LLM calls and prompt characters per episode by stage, and what
each wrote, and writes the JSON to benchmarks/results/.

Neo4j schema: tidegraph's schema is set up first; Graphiti's ``build_indices_and_constraints``
then adds only the indexes whose names are still free (its ``entity_uuid``/``community_uuid``
range indexes and ``community_name`` fulltext index collide by name with tidegraph's and are
no-ops), and the indexes it added are dropped again after each Graphiti run, so tidegraph's
runs never pay for Graphiti's extra index maintenance and other users of the server keep
tidegraph's schema only. ``--repeat N`` runs every configuration N times, alternating which
system goes first, and reports the median (the machine is shared: its load changes).

Size: about 770 lines, one script on purpose: both systems' runs, the repeat/alternate
logic and the report must stay in step, and each part is only used here.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from neo4j import AsyncGraphDatabase

from benchmarks import chain_trace
from benchmarks.graphiti_answers import FairAnswers, llm_usage
from benchmarks.graphiti_env import ensure, graphiti_env
from benchmarks.text_feed import FeedEpisode, FeedIndex, feed_stats, text_feed

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_NEO4J = "bolt://127.0.0.1:17687"
EMBEDDING_DIM = 384
# Graphiti's vectors are one dimension shorter, so that they stay out of tidegraph's 384-d HNSW
# vector indexes on the same label and property (Entity.name_embedding,
# RELATES_TO.fact_embedding): Graphiti creates no vector index on Neo4j and rewrites every
# node and edge of an episode with its embedding, so with 384 dims it paid for HNSW updates it
# never has in its own database (measured: 64 groups, Neo4j CPU 93-180 s instead of 32 s).
GRAPHITI_EMBEDDING_DIM = 383
MODEL = "fake-model"
SYSTEMS = ("tidegraph", "graphiti")
RUN_TIMEOUT = 3600.0

FAIRNESS = (
    "Both systems get the same messages and the same fake LLM. Extraction is answered from "
    "each message's ground truth, found by the exact text of the prompt's current-episode "
    "section: the same entity names and the same facts (subject, relation, object, wording, "
    "stated date) for both (extraction_answers shows the totals each was given). Entity "
    "resolution: same name (case-insensitive) = duplicate, else new. Fact resolution: same "
    "subject-relation-object = duplicate; same subject and a one-valued relation with another "
    "object = contradiction. Graphiti's extra requests (entity summaries, edge timestamps) get "
    "short deterministic answers. Fixed latency per request, no response cache, no rate limit, "
    "one process per system, same Neo4j server, same hashing embedder (384 dims for tidegraph, "
    "383 for Graphiti so that its vectors stay out of tidegraph's HNSW indexes)."
)


# ---- one run ----------------------------------------------------------------------------------
def group_id(run_id: str, system: str, tenant: str) -> str:
    return f"gbench-{run_id}-{'tg' if system == 'tidegraph' else 'gr'}-{tenant}"


def spec_groups(feed: list[FeedEpisode], run_id: str, system: str) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = {}
    for episode in feed:
        gid = group_id(run_id, system, episode.group)
        groups.setdefault(gid, []).append(episode.envelope(gid))
    return groups


def runner_command(system: str, python: Path, spec: Path, out: Path) -> list[str]:
    if system == "tidegraph":
        return [sys.executable, "-m", "benchmarks.graphiti_tidegraph_runner", str(spec), str(out)]
    return [str(python), str(REPO / "benchmarks" / "graphiti_runner.py"), str(spec), str(out)]


def neo4j_pid(uri: str) -> int | None:
    """The local Neo4j server's pid (``tidegraph services up``), when ``uri`` is that server."""
    pid_file = REPO / ".tidegraph" / "services" / "neo4j" / "neo4j.pid"
    if uri != DEFAULT_NEO4J or not pid_file.exists():
        return None
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"tidegraph.service=neo4j" in cmdline else None


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc), None when unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_process(cmd: list[str], env: dict[str, str], log: Path) -> None:
    """Run a side's process (stdout/stderr to ``log``); raise if it failed."""
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        except BaseException:  # interrupted (Ctrl-C, SIGTERM): do not leave the side running
            proc.kill()
            proc.wait()
            raise
    if code != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{' '.join(cmd[:3])} exited with {code}; log {log}:\n{tail}")


@contextmanager
def fake_llm(feed: list[FeedEpisode], latency_ms: float) -> Iterator[tuple[Any, FairAnswers]]:
    from tests.support.fake_llm import ScriptedLLMServer

    answers = FairAnswers(FeedIndex(feed))
    with ScriptedLLMServer(
        latency_seconds=latency_ms / 1000, embedding_dim=EMBEDDING_DIM, model=MODEL
    ) as server:
        answers.install(server)
        yield server, answers


def run_side(
    system: str, feed: list[FeedEpisode], latency_ms: float, ctx: RunContext, *, label: str
) -> dict[str, Any]:
    """One system through the whole feed at one latency; the groups are deleted afterwards."""
    run_id = uuid.uuid4().hex[:8]
    groups = spec_groups(feed, run_id, system)
    load_before = os.getloadavg()
    try:
        with fake_llm(feed, latency_ms) as (server, answers):
            spec: dict[str, Any] = {
                "neo4j_uri": ctx.neo4j_uri,
                "base_url": server.base_url,
                "model": MODEL,
                "embedding_dim": ctx.embedding_dim(system),
                "groups": groups,
            }
            result, costs = spawn(system, spec, ctx, label)
            usage = llm_usage(server, len(feed))
            answered = dict(answers.answered)
    except BaseException:
        asyncio.run(graph_counts_and_cleanup(ctx.neo4j_uri, list(groups), keep=ctx.keep))
        raise
    graph = asyncio.run(graph_counts_and_cleanup(ctx.neo4j_uri, list(groups), keep=ctx.keep))
    n, seconds = len(feed), result["seconds"]
    return {
        "system": system,
        "group_prefix": group_id(run_id, system, ""),
        "latency_ms": latency_ms,
        "groups": len(groups),
        "episodes": n,
        "seconds": round(seconds, 3),
        "episodes_per_s": round(n / seconds, 3) if seconds else None,
        "cpu_seconds": round(result["cpu_seconds"], 3),
        "cpu_ms_per_episode": round(1000 * result["cpu_seconds"] / max(n, 1), 1),
        "neo4j_queries": result.get("neo4j_queries"),
        "neo4j_queries_per_episode": round(result.get("neo4j_queries", 0) / max(n, 1), 2),
        "failures": result["failures"],
        "llm": usage,
        "extraction_answers": {
            "entities": answered.get(f"{system}_entities", 0),
            "facts": answered.get(f"{system}_facts", 0),
        },
        "graph": graph,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "profiled": ctx.profile or ctx.py_spy,
        **costs,
        "peak_rss_mb": result.get("peak_rss_mb"),
        **({"report": result["report"]} if "report" in result else {}),
        **({"chain": result["chain"]} if "chain" in result else {}),
    }


def spawn(
    system: str, spec: dict[str, Any], ctx: RunContext, label: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run a side's process on ``spec``: (its result, the CPU the servers spent meanwhile)."""
    if ctx.trace and system == "tidegraph":
        spec["trace"] = True
    if ctx.profile:
        spec["profile"] = str(RESULTS / f"graphiti_profile_{system}_{label}")
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_bytes(orjson.dumps(spec))
        cmd = runner_command(system, ctx.graphiti_python, spec_path, out)
        spy = RESULTS / f"graphiti_pyspy_{system}_{label}"
        if ctx.py_spy:
            cmd = [str(py_spy_binary()), "record", "--gil", "--format", "raw", "--rate", "200",
                   "-o", f"{spy}.raw", "--", *cmd]  # fmt: skip
        env = graphiti_env() if system == "graphiti" else dict(os.environ)
        server_pid = neo4j_pid(ctx.neo4j_uri)
        neo4j_before, own_before = process_cpu_seconds(server_pid), time.process_time()
        run_process(cmd, env, RESULTS / f"graphiti_compare_{system}_{label}.log")
        neo4j_after = process_cpu_seconds(server_pid)
        costs = {
            "llm_server_cpu_seconds": round(time.process_time() - own_before, 3),
            "neo4j_cpu_seconds": (
                round(neo4j_after - neo4j_before, 3)
                if neo4j_before is not None and neo4j_after is not None
                else None
            ),
        }
        if ctx.py_spy:
            Path(f"{spy}.txt").write_text(summarise_py_spy(Path(f"{spy}.raw"), system))
        return orjson.loads(out.read_bytes()), costs


# ---- py-spy: where the CPU goes -----------------------------------------------------------------
CATEGORIES = (
    ("neo4j driver", ("neo4j/",)),
    ("openai client + HTTP", ("openai/", "httpx", "httpcore", "h11/", "anyio/", "ssl")),
    ("pydantic", ("pydantic",)),
    ("graphiti_core", ("graphiti_core/",)),
    ("tidegraph", ("tidegraph/",)),
    ("asyncio + selectors", ("asyncio/", "selectors", "concurrent/", "threading")),
    ("imports", ("<frozen", "importlib")),
)
OWN_CODE = {"graphiti": ("graphiti_core/",), "tidegraph": ("tidegraph/",)}


def _path(frame: str) -> str:
    """The file of a py-spy frame ``function (path:line)``, as py-spy shortens it."""
    return frame[frame.rfind("(") + 1 :].rstrip(")").rsplit(":", 1)[0]


def py_spy_binary() -> Path:
    found = ensure(profiler=True).parent / "py-spy"
    if not found.exists():
        raise RuntimeError(f"py-spy not found at {found}")
    return found


def _without_line(frame: str) -> str:
    """``function (path:line)`` -> ``function (path)``: one entry per function."""
    head, _, tail = frame.rpartition(":")
    return f"{head})" if tail.rstrip(")").isdigit() else frame


def _category(frame: str) -> str:
    path = _path(frame)
    found = (name for name, keys in CATEGORIES if any(path.startswith(k) for k in keys))
    return next(found, "other")


def summarise_py_spy(raw: Path, system: str, top: int = 25) -> str:
    """Samples holding the GIL (Python CPU time) by library, by leaf and by own function."""
    self_by_category: dict[str, int] = {}
    leaves: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        total += n
        leaf = frames[-1]
        self_by_category[_category(leaf)] = self_by_category.get(_category(leaf), 0) + n
        leaves[leaf] = leaves.get(leaf, 0) + n
        for function in {_without_line(f) for f in frames}:
            if _path(function).startswith(OWN_CODE[system]):
                inclusive[function] = inclusive.get(function, 0) + n

    def ranked(counts: dict[str, int], limit: int) -> list[str]:
        best = sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
        return [f"  {100 * n / max(total, 1):5.1f}%  {name}" for name, n in best]

    return "\n".join(
        [f"{system}: {total} samples holding the GIL (py-spy --gil, 200 Hz)", "",
         "Self time by library:", *ranked(self_by_category, 20), "",
         f"Top {top} functions by self time:", *ranked(leaves, top), "",
         f"Top {top} of {system}'s own functions, inclusive:", *ranked(inclusive, top)]
    )  # fmt: skip


# ---- Neo4j: counts, cleanup, Graphiti's indexes ------------------------------------------------
COUNTS = """
CALL () { MATCH (n:Entity) WHERE n.group_id IN $groups RETURN count(n) AS entities }
CALL () { MATCH (n:Episodic) WHERE n.group_id IN $groups RETURN count(n) AS episodes }
CALL () {
  MATCH (:Entity)-[r:RELATES_TO]->(:Entity) WHERE r.group_id IN $groups
  RETURN count(r) AS facts, count(r.expired_at) AS facts_expired,
         count(r.invalid_at) AS facts_with_invalid_at
}
RETURN entities, episodes, facts, facts_expired, facts_with_invalid_at
"""
FACTS = """
MATCH (a:Entity)-[r:RELATES_TO]->(b:Entity) WHERE r.group_id IN $groups
RETURN r.group_id AS group_id, a.name AS subject, r.name AS relation, b.name AS object,
       r.valid_at AS valid_at, r.invalid_at AS invalid_at, r.expired_at IS NOT NULL AS expired
"""
DELETE_BATCH = """
MATCH (n) WHERE n.group_id IN $groups
WITH n LIMIT 2000 DETACH DELETE n RETURN count(*) AS deleted
"""


def _when(value: Any) -> str | None:
    """A Neo4j DateTime as a UTC ISO string to the second (both systems store DateTime)."""
    if value is None:
        return None
    moment = value.to_native() if hasattr(value, "to_native") else value
    return moment.astimezone(UTC).isoformat(timespec="seconds")


def fact_rows(records: list[Any], prefix_of: dict[str, str]) -> list[tuple[Any, ...]]:
    """Every fact as (tenant, subject, relation, object, valid_at, invalid_at, expired)."""
    rows = []
    for r in records:
        tenant = r["group_id"].removeprefix(prefix_of[r["group_id"]])
        rows.append(
            (tenant, r["subject"], r["relation"], r["object"], _when(r["valid_at"]),
             _when(r["invalid_at"]), r["expired"])
        )  # fmt: skip
    return sorted(rows, key=repr)


async def graph_counts_and_cleanup(uri: str, groups: list[str], *, keep: bool) -> dict[str, Any]:
    """What the run wrote (counts, and every fact with both timelines), then delete it."""
    driver = AsyncGraphDatabase.driver(uri, auth=None)
    try:
        records, _, _ = await driver.execute_query(COUNTS, groups=groups)
        counts: dict[str, Any] = dict(records[0])
        records, _, _ = await driver.execute_query(FACTS, groups=groups)
        prefix_of = {g: g[: g.index("tenant-")] for g in groups}
        counts["fact_rows"] = fact_rows(records, prefix_of)
        while not keep:
            records, _, _ = await driver.execute_query(DELETE_BATCH, groups=groups)
            if records[0]["deleted"] == 0:
                break
    finally:
        await driver.close()
    return counts


async def index_names(uri: str) -> set[str]:
    driver = AsyncGraphDatabase.driver(uri, auth=None)
    try:
        records, _, _ = await driver.execute_query("SHOW INDEXES YIELD name RETURN name")
        return {r["name"] for r in records}
    finally:
        await driver.close()


async def drop_indexes(uri: str, names: list[str]) -> None:
    driver = AsyncGraphDatabase.driver(uri, auth=None)
    try:
        for name in names:
            await driver.execute_query(f"DROP INDEX `{name}` IF EXISTS")
    finally:
        await driver.close()


async def tidegraph_schema(uri: str) -> None:
    from tidegraph.stores.neo4j.store import Neo4jStore

    store = Neo4jStore(uri)
    try:
        await store.setup(EMBEDDING_DIM)
    finally:
        await store.close()


class RunContext:
    def __init__(self, args: argparse.Namespace) -> None:
        self.neo4j_uri: str = args.neo4j_uri
        self.profile: bool = args.profile
        self.py_spy: bool = args.py_spy
        self.trace: bool = args.trace
        self.repeat: int = max(args.repeat, 1)
        self.graphiti_dim: int = args.graphiti_embedding_dim
        self.keep: bool = args.keep
        self.graphiti_python = Path()

    def embedding_dim(self, system: str) -> int:
        return self.graphiti_dim if system == "graphiti" else EMBEDDING_DIM


def graphiti_index_names(ctx: RunContext, *, build: bool) -> set[str]:
    """The names of Graphiti's Neo4j indexes (its runner reports them); ``build`` creates them."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = {
            "neo4j_uri": ctx.neo4j_uri,
            "base_url": "http://127.0.0.1:9/v1",  # never called: no episodes
            "model": MODEL,
            "embedding_dim": EMBEDDING_DIM,
            "groups": {},
            "build_indices": build,
        }
        spec_path, out = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_bytes(orjson.dumps(spec))
        cmd = runner_command("graphiti", ctx.graphiti_python, spec_path, out)
        run_process(cmd, graphiti_env(), RESULTS / "graphiti_compare_setup.log")
        return set(orjson.loads(out.read_bytes())["graphiti_index_names"])


@contextmanager
def neo4j_lock() -> Iterator[None]:
    """One Graphiti phase (or cleanup) at a time on this machine."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / ".graphiti-neo4j.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def graphiti_schema(ctx: RunContext) -> Iterator[list[str]]:
    """Graphiti's indexes for the duration of a Graphiti run.

    Yields the names it added; they are dropped at the end."""
    with neo4j_lock():
        asyncio.run(tidegraph_schema(ctx.neo4j_uri))  # first: its names win any collision
        before = asyncio.run(index_names(ctx.neo4j_uri))
        own = graphiti_index_names(ctx, build=True)
        added = sorted((asyncio.run(index_names(ctx.neo4j_uri)) - before) & own)
        try:
            asyncio.run(await_indexes(ctx.neo4j_uri))
            yield added
        finally:
            asyncio.run(drop_indexes(ctx.neo4j_uri, added))


def tidegraph_index_names() -> set[str]:
    from tidegraph.stores.neo4j import queries as neo4j_queries

    return {
        m.group(1)
        for statement in neo4j_queries.SCHEMA
        if (m := re.search(r"(?:INDEX|CONSTRAINT)\s+(\w+)\s+IF NOT EXISTS", statement))
    }


def cleanup(ctx: RunContext) -> dict[str, Any]:
    """After an interrupted run: delete every benchmark group (``gbench-*``) and drop the
    indexes Graphiti creates that are not tidegraph's."""
    ctx.graphiti_python = ensure()
    with neo4j_lock():
        stray = graphiti_index_names(ctx, build=False) - tidegraph_index_names()
        dropped = sorted(stray & asyncio.run(index_names(ctx.neo4j_uri)))
        asyncio.run(drop_indexes(ctx.neo4j_uri, dropped))
        deleted = asyncio.run(delete_benchmark_groups(ctx.neo4j_uri))
    return {"indexes_dropped": dropped, "nodes_deleted": deleted}


async def delete_benchmark_groups(uri: str) -> int:
    driver = AsyncGraphDatabase.driver(uri, auth=None)
    total = 0
    try:
        while True:
            records, _, _ = await driver.execute_query(
                "MATCH (n) WHERE n.group_id STARTS WITH 'gbench-' "
                "WITH n LIMIT 2000 DETACH DELETE n RETURN count(*) AS deleted"
            )
            if records[0]["deleted"] == 0:
                return total
            total += records[0]["deleted"]
    finally:
        await driver.close()


async def await_indexes(uri: str) -> None:
    driver = AsyncGraphDatabase.driver(uri, auth=None)
    try:
        await driver.execute_query("CALL db.awaitIndexes(120)")
    finally:
        await driver.close()


# ---- plans ------------------------------------------------------------------------------------
def run_all(
    configs: list[tuple[str, list[FeedEpisode], float]], systems: list[str], ctx: RunContext
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every (label, feed, latency) ``ctx.repeat`` times for each system, interleaved.

    The order of the systems alternates between repetitions, so a change of the machine's
    load does not always hit the same side. Graphiti's indexes exist only during its runs."""
    runs: list[dict[str, Any]] = []
    added: set[str] = set()
    if "graphiti" in systems:
        ctx.graphiti_python = ensure(profiler=ctx.profile or ctx.py_spy)
    for label, feed, latency in configs:
        for rep in range(ctx.repeat):
            order = systems if rep % 2 == 0 else list(reversed(systems))
            for system in order:
                tag = label if ctx.repeat == 1 else f"{label}_r{rep + 1}"
                if system == "graphiti":
                    with graphiti_schema(ctx) as new:
                        runs.append(run_side(system, feed, latency, ctx, label=tag))
                    added.update(new)
                else:
                    runs.append(run_side(system, feed, latency, ctx, label=tag))
                runs[-1]["repetition"] = rep + 1
                print(_line(runs[-1]), flush=True)
                if "chain" in runs[-1]:
                    print(chain_trace.line(runs[-1]["chain"]), flush=True)
    compare_graphs(runs)
    return runs, sorted(added)


def compare_graphs(runs: list[dict[str, Any]]) -> None:
    """Mark each Graphiti run with how its facts differ from tidegraph's on the same input.

    A fact is (tenant, subject, relation, object, valid_at, invalid_at, expired); the rows
    themselves are dropped from the results (they only serve this comparison)."""
    by_config: dict[tuple[Any, ...], dict[str, Any]] = {}
    for run in runs:
        config = (run["latency_ms"], run["groups"], run["episodes"], run.get("repetition"))
        by_config.setdefault(config, {})[run["system"]] = run
    for pair in by_config.values():
        tg, gr = pair.get("tidegraph"), pair.get("graphiti")
        if tg and gr:
            mine, theirs = set(tg["graph"]["fact_rows"]), set(gr["graph"]["fact_rows"])
            gr["same_facts_as_tidegraph"] = mine == theirs
            gr["facts_only_in_tidegraph"] = [list(r) for r in sorted(mine - theirs, key=repr)][:20]
            gr["facts_only_in_graphiti"] = [list(r) for r in sorted(theirs - mine, key=repr)][:20]
    for run in runs:
        run["graph"].pop("fact_rows", None)


def _line(run: dict[str, Any]) -> str:
    return (
        f"  {run['system']:<9} {run['groups']:>3} groups {run['episodes']:>4} episodes "
        f"{run['latency_ms']:>5g} ms: {run['episodes_per_s']:.2f} episodes/s, "
        f"{run['llm']['calls_per_episode']:.2f} LLM calls/episode, "
        f"{len(run['failures'])} failed"
    )


def summarise(runs: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """One row per ``key`` value (latency or groups), both systems side by side; episodes/s
    is the median over repetitions (the LLM and query counts do not change between them)."""
    rows: dict[Any, dict[str, Any]] = {}
    rates: dict[tuple[Any, str], list[float]] = {}
    for run in runs:
        row = rows.setdefault(run[key], {key: run[key], "episodes": run["episodes"]})
        prefix = run["system"]
        rates.setdefault((run[key], prefix), []).append(run["episodes_per_s"])
        row[f"{prefix}_calls_per_episode"] = run["llm"]["calls_per_episode"]
        row[f"{prefix}_prompt_chars_per_episode"] = run["llm"]["prompt_chars_per_episode"]
        row[f"{prefix}_calls_per_episode_by_stage"] = run["llm"]["calls_per_episode_by_stage"]
        row[f"{prefix}_neo4j_queries_per_episode"] = run["neo4j_queries_per_episode"]
        alike = [r for r in runs if (r[key], r["system"]) == (run[key], prefix)]
        cpu = [r["cpu_ms_per_episode"] for r in alike]
        row[f"{prefix}_cpu_ms_per_episode"] = round(statistics.median(cpu), 1)
        neo4j = [
            1000 * r["neo4j_cpu_seconds"] / r["episodes"]
            for r in alike
            if r.get("neo4j_cpu_seconds") is not None
        ]
        row[f"{prefix}_neo4j_cpu_ms_per_episode"] = (
            round(statistics.median(neo4j), 1) if neo4j else None
        )
    for (value, prefix), values in rates.items():
        rows[value][f"{prefix}_episodes_per_s"] = round(statistics.median(values), 2)
        rows[value][f"{prefix}_episodes_per_s_runs"] = values
    for row in rows.values():
        tg, gr = row.get("tidegraph_episodes_per_s"), row.get("graphiti_episodes_per_s")
        row["ratio"] = round(tg / gr, 2) if tg and gr else None
    return list(rows.values())


# The JSON also has the Neo4j server's CPU per episode, but on a shared server that includes
# the other clients' work, so the table leaves it out.
COLUMNS = (
    ("tidegraph_episodes_per_s", "ep/s tg", ".2f"),
    ("graphiti_episodes_per_s", "ep/s Gr", ".2f"),
    ("ratio", "ratio", ".2f"),
    ("tidegraph_calls_per_episode", "calls/ep tg", ".2f"),
    ("graphiti_calls_per_episode", "calls/ep Gr", ".2f"),
    ("tidegraph_prompt_chars_per_episode", "prompt ch/ep tg", ".0f"),
    ("graphiti_prompt_chars_per_episode", "prompt ch/ep Gr", ".0f"),
    ("tidegraph_neo4j_queries_per_episode", "queries/ep tg", ".1f"),
    ("graphiti_neo4j_queries_per_episode", "queries/ep Gr", ".1f"),
    ("tidegraph_cpu_ms_per_episode", "CPU ms/ep tg", ".1f"),
    ("graphiti_cpu_ms_per_episode", "CPU ms/ep Gr", ".1f"),
)


def table(rows: list[dict[str, Any]], key: str) -> str:
    """The summary as a text table (``-`` where a system did not run)."""
    head = " | ".join([f"{key:>10}", *(title for _, title, _ in COLUMNS)])
    lines = [head, "-" * len(head)]
    for row in rows:
        cells = [f"{row[key]:>10g}"]
        for name, title, fmt in COLUMNS:
            value = row.get(name)
            cells.append(
                f"{value:>{len(title)}{fmt}}" if value is not None else f"{'-':>{len(title)}}"
            )
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def stage_table(runs: list[dict[str, Any]]) -> str:
    """LLM calls per episode by stage and response type, one line per run."""
    lines = []
    for run in runs:
        by_schema = ", ".join(
            f"{name} {n:.2f}" for name, n in run["llm"]["calls_per_episode_by_schema"].items()
        )
        lines.append(
            f"  {run['system']:<9} {run['groups']:>3}g {run['latency_ms']:>5g} ms: {by_schema}; "
            f"wrote {run['graph']['entities']} entities, {run['graph']['facts']} facts "
            f"({run['graph']['facts_expired']} expired); extraction answers "
            f"{run['extraction_answers']['entities']} entities / "
            f"{run['extraction_answers']['facts']} facts; peak RSS {run['peak_rss_mb']} MB"
            + (
                f"; same facts as tidegraph (both timelines): {run['same_facts_as_tidegraph']}"
                if "same_facts_as_tidegraph" in run
                else ""
            )
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0, 50, 200])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument(
        "--scaling", action="store_true", help="run the scaling curve instead of the comparison"
    )
    parser.add_argument("--scaling-groups", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--scaling-latency-ms", type=float, default=50.0)
    parser.add_argument("--scaling-episodes-per-group", type=int, default=8)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per configuration (median reported)"
    )
    parser.add_argument("--neo4j-uri", default=os.environ.get("TIDEGRAPH_NEO4J_URI", DEFAULT_NEO4J))
    parser.add_argument(
        "--profile", action="store_true", help="pyinstrument profile (wall clock, async) per run"
    )
    parser.add_argument(
        "--py-spy", action="store_true", help="py-spy CPU profile per run (summary in .txt)"
    )
    parser.add_argument(
        "--graphiti-embedding-dim",
        type=int,
        default=GRAPHITI_EMBEDDING_DIM,
        help="dimension of Graphiti's hashing vectors (384 puts them in tidegraph's indexes)",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="where tidegraph's group wall time goes (benchmarks/chain_trace.py)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the benchmark's groups")
    parser.add_argument(
        "--cleanup",
        action="store_true",
        help="only delete leftover benchmark groups and Graphiti's indexes (interrupted run)",
    )
    parser.add_argument("--out", type=Path, help="JSON path (default: benchmarks/results/...)")
    return parser.parse_args(argv)


def write_feeds(configs: list[tuple[str, list[FeedEpisode], float]], scaling: bool) -> list[str]:
    """The episode file(s) with their ground truth, one JSON line per message."""
    paths = []
    for label, feed, _ in configs:
        path = RESULTS / f"graphiti_text_feed_{label if scaling else 'compare'}.jsonl"
        path.write_bytes(b"".join(orjson.dumps(e.as_json()) + b"\n" for e in feed))
        paths.append(str(path))
    return paths


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(args)
    if args.cleanup:
        done = cleanup(ctx)
        print(f"cleanup: {done}")
        return done
    # SIGTERM unwinds like Ctrl-C: the side's process is killed, its groups deleted and
    # Graphiti's indexes dropped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = machine()
    if args.scaling:
        key = "groups"
        configs = []
        for groups in args.scaling_groups:
            feed = text_feed(groups * args.scaling_episodes_per_group, groups, seed=args.seed)
            configs.append((f"scaling_{groups}g", feed, args.scaling_latency_ms))
        feeds = {label: feed_stats(feed) for label, feed, _ in configs}
        name = f"graphiti_scaling_{args.scaling_latency_ms:g}ms.json"
    else:
        key = "latency_ms"
        feed = text_feed(args.episodes, args.groups, seed=args.seed)
        configs = [(f"{ms:g}ms", feed, ms) for ms in args.latency_ms]
        feeds = {"feed": feed_stats(feed)}
        name = f"graphiti_compare_{args.groups}g_{args.episodes}e.json"
    feed_files = write_feeds(configs if args.scaling else configs[:1], args.scaling)
    print(f"feed: {feeds} ({', '.join(feed_files)})", flush=True)
    runs, added = run_all(configs, args.systems, ctx)
    rows = summarise(runs, key)
    result = {
        "benchmark": "graphiti_scaling" if args.scaling else "graphiti_compare",
        "command": " ".join(["python -m benchmarks.graphiti_compare", *(argv or sys.argv[1:])]),
        "machine": started,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "feed": feeds,
        "feed_files": feed_files,
        "fairness": FAIRNESS,
        "graphiti_indexes_added_and_dropped": added,
        "summary": rows,
        "runs": runs,
    }
    out = args.out or RESULTS / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print()
    print(table(rows, key))
    print()
    print("LLM calls per episode by response type, and what each side wrote:")
    print(stage_table(runs))
    print(f"\nload average {started['load_average']} -> {result['load_average_end']}; "
          f"{os.cpu_count()} cpus. JSON: {out}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
