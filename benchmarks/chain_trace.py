"""Where each group's wall time goes in tidegraph's side of the Graphiti comparison
(``python -m benchmarks.graphiti_compare --trace``).

Records, per group, when each of its waits started and ended: the LLM calls (by response type),
the store calls of the write path (the episode write, the entity search, the unit's read, the
others), and every episode-write transaction (how many episodes, how long). A group's episodes
are written in order, so its wall time is the chain of these; each millisecond of it is counted
once, for the first of: the write, an LLM call, the search, the unit's read, another store call,
else ``cpu_or_loop`` (its own work, or waiting for the event loop). ``entity_judging_calls``
counts the entity judging calls hidden under the group's write or fact judging call (started
ahead on a guess) and those the group waited for alone, on its chain. The transactions'
``busy_share`` is the part of their span during which one ran: near 1, the groups queue for the
one write transaction at a time (``TRANSACTIONS_IN_FLIGHT``), and the rate is the
transactions' rate, not the groups' chains.

It wraps methods of the runner, the LLM client and the Neo4j store in this process only (the
tidegraph side's own process); nothing else changes.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from tidegraph.llm import LLMClient
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.stores.neo4j.store import Neo4jStore

_GROUP: contextvars.ContextVar[str] = contextvars.ContextVar("traced_group", default="")
STORE_CALLS = (
    "write_episodes",
    "entity_candidates",
    "read_batch",
    "fact_candidates",
    "entity_names",
    "lookup_entities",
    "episode_markers",
    "recent_episodes_before",
)
# What an entity judging call started ahead runs under.
HIDING = ("store:write_episodes", "llm:FactResolutionOutput")
# Which wait a millisecond of a group's chain counts for, first match first.
ORDER = ("store:write_episodes", "llm:", "store:entity_candidates", "store:read_batch", "store:")


class ChainTrace:
    def __init__(self) -> None:
        self.spans: list[tuple[str, str, float, float]] = []  # group, what, start, end
        self.transactions: list[tuple[int, float, float]] = []  # episodes, start, end

    def install(self) -> None:
        trace = self
        run = GroupRunner.run

        async def traced_run(runner: GroupRunner, episodes: Any, on_outcome: Any = None) -> Any:
            _GROUP.set(episodes[0].group_id if episodes else "")
            return await trace._timed("group", run(runner, episodes, on_outcome))

        setattr(GroupRunner, "run", traced_run)  # noqa: B010 (a wrapper of another type)
        self._wrap(LLMClient, "structured", lambda kw: f"llm:{kw['schema'].__name__}")
        for name in STORE_CALLS:
            self._wrap(Neo4jStore, name, functools.partial(_store_call, name))
        commit = Neo4jStore._commit_episodes

        async def traced_commit(store: Neo4jStore, jobs: list[Any]) -> list[bool]:
            started = time.perf_counter()
            try:
                return await commit(store, jobs)
            finally:
                trace.transactions.append((len(jobs), started, time.perf_counter()))

        setattr(Neo4jStore, "_commit_episodes", traced_commit)  # noqa: B010

    def _wrap(self, cls: type, name: str, what: Callable[[dict[str, Any]], str]) -> None:
        method = getattr(cls, name)
        trace = self

        @functools.wraps(method)
        async def traced(obj: Any, *args: Any, **kwargs: Any) -> Any:
            return await trace._timed(what(kwargs), method(obj, *args, **kwargs))

        setattr(cls, name, traced)

    async def _timed(self, what: str, call: Any) -> Any:
        started = time.perf_counter()
        try:
            return await call
        finally:
            self.spans.append((_GROUP.get(), what, started, time.perf_counter()))

    def summary(self) -> dict[str, Any]:
        by_group: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
        for group, what, start, end in self.spans:
            by_group[group].append((what, start, end))
        seconds: Counter[str] = Counter()
        ahead: Counter[str] = Counter()
        wall = 0.0
        for spans in by_group.values():
            whole = [(s, e) for what, s, e in spans if what == "group"]
            if not whole:
                continue
            start, end = whole[0]
            wall += end - start
            seconds.update(_chain(spans, start, end))
            cover = [(s, e) for what, s, e in spans if what in HIDING]
            for what, s, e in spans:
                if what == "llm:EntityResolutionOutput":
                    hidden = any(cs < e and s < ce for cs, ce in cover)
                    ahead["hidden" if hidden else "on the chain"] += 1
        txn = self.transactions
        span = max(e for _, _, e in txn) - min(s for _, s, _ in txn) if txn else 0.0
        busy = sum(e - s for _, s, e in txn)
        return {
            "group_seconds": round(wall, 2),
            "share": {k: round(v / wall, 3) for k, v in seconds.most_common()} if wall else {},
            "entity_judging_calls": dict(ahead),
            "transactions": {
                "count": len(txn),
                "episodes_each": round(sum(n for n, _, _ in txn) / len(txn), 2) if txn else None,
                "ms_each": round(1000 * busy / len(txn), 1) if txn else None,
                "busy_share": round(busy / span, 3) if span else None,
            },
        }


def _store_call(name: str, kwargs: dict[str, Any]) -> str:
    return f"store:{name}"


def _chain(spans: list[tuple[str, float, float]], start: float, end: float) -> Counter[str]:
    """Seconds of the group's wall time by the first wait of ``ORDER`` running then."""
    slots: list[str | None] = [None] * (int((end - start) * 1000) + 1)
    for prefix in ORDER:
        for what, s, e in spans:
            if what == "group" or not what.startswith(prefix):
                continue
            for ms in range(
                max(0, int((s - start) * 1000)), min(len(slots), int((e - start) * 1000))
            ):
                if slots[ms] is None:
                    slots[ms] = what
    return Counter({k: v / 1000 for k, v in Counter(s or "cpu_or_loop" for s in slots).items()})


def line(summary: dict[str, Any]) -> str:
    share = ", ".join(f"{k} {100 * v:.0f}%" for k, v in summary["share"].items())
    txn = summary["transactions"]
    return (
        f"    chain: {share}; entity judging calls {summary['entity_judging_calls']}; "
        f"write transactions {txn['count']} of {txn['episodes_each']} episodes, "
        f"{txn['ms_each']} ms each, busy {100 * (txn['busy_share'] or 0):.0f}% of their span"
    )
