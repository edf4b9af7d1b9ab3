"""Community maintenance over a store's communities (docs/communities.md "Communities"), used
by the CLI and the worker.

    service = CommunityService(store, llm, embedder)
    await service.assign(group_id, entity_uuid)     # each new entity (new-entities topic)
    if service.should_refresh(group_id, threshold=0.1, max_age=timedelta(hours=6)):
        await service.refresh(group_id, trigger="drift")   # the timer

Refreshes of one group are serialised by a per-group asyncio lock (one process; across
workers a group lives on one partition, hence one worker). Assignments do not wait for a
refresh: an entity assigned while its group is refreshing is placed again once the refresh has
written, since the refresh's rewrite of the memberships may drop a membership it did not know
of. Drift counters live in memory: a restarted worker has none, so ``refresh_trigger``
answers "initial" for a group it never refreshed.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from tidegraph.embed.base import Embedder
from tidegraph.llm.client import LLMClient
from tidegraph.metrics import (
    COMMUNITIES_CHANGED,
    COMMUNITY_ASSIGNMENTS,
    COMMUNITY_DRIFT_ARI,
    COMMUNITY_DRIFT_RATIO,
    COMMUNITY_REFRESH_SECONDS,
    COMMUNITY_REFRESHES,
    COMMUNITY_SUMMARIES,
)
from tidegraph.processors.communities import (
    DEFAULT_MAX_ITERATIONS,
    SUMMARY_SYSTEM,
    CommunitySummaryOutput,
    adjusted_rand_index,
    assign_by_majority,
    default_name,
    degrees,
    drift_ratio,
    label_propagation,
    partition_of,
    plan_refresh,
    summary_prompt,
)
from tidegraph.records.graph import CommunityRecord, EntityRecord, WeightedEdge
from tidegraph.records.times import utcnow

LLM_STAGE = "communities"


@dataclass(frozen=True)
class RefreshResult:
    changed: int
    unchanged: int
    created: int
    deleted: int
    seconds: float
    llm_calls: int
    iterations: int = 0
    drift_ari: float = 1.0  # stored partition vs the fresh one, before the rewrite


@dataclass
class _GroupState:
    assignments_since_refresh: int = 0
    group_size: int = 0
    last_refresh: datetime | None = None
    # entities assigned while a refresh of the group ran: placed again after its write
    assigned_during_refresh: set[str] = field(default_factory=set)


class Memberships(Protocol):
    """A store's ``communities`` (``tidegraph.stores.roles.Communities`` says what each
    method does)."""

    async def entity_graph(
        self, group_id: str, at: datetime | None = None
    ) -> tuple[list[str], list[WeightedEdge]]: ...

    async def neighbour_weights_many(
        self, group_id: str, entity_uuids: list[str], at: datetime | None = None
    ) -> list[dict[str, int]]: ...

    async def communities_of(
        self, group_id: str, entity_uuids: list[str]
    ) -> dict[str, str | None]: ...

    async def list_communities(self, group_id: str) -> list[CommunityRecord]: ...

    async def write_communities(
        self, group_id: str, upserts: list[CommunityRecord], deletes: list[str]
    ) -> None: ...

    async def assign_members(self, group_id: str, assignments: list[tuple[str, str]]) -> None: ...


class CommunityStore(Protocol):
    """What community maintenance reads and writes: the store's communities, and its entities
    (their names and summaries describe a community)."""

    @property
    def communities(self) -> Memberships: ...

    async def entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]: ...


class CommunityService:
    def __init__(
        self, store: CommunityStore, llm: LLMClient | None = None, embedder: Embedder | None = None
    ) -> None:
        self.store = store
        self.llm = llm
        self.embedder = embedder
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._state: dict[str, _GroupState] = defaultdict(_GroupState)

    # ------------------------------------------------------------------ incremental
    async def assign(self, group_id: str, entity_uuid: str) -> str | None:
        """Put a new entity into its neighbours' weighted-majority community (over facts
        valid now); None (and no write) when no neighbour has one. Idempotent: the choice
        does not depend on the entity's own membership, and the write replaces it."""
        [choice] = await self.assign_many(group_id, [entity_uuid])
        return choice

    async def assign_many(self, group_id: str, entity_uuids: list[str]) -> list[str | None]:
        """``assign`` for new entities of a group, in order, as one unit: one read of their
        neighbours' communities and one write transaction for all the memberships. Each
        entity sees the memberships the ones before it were given, as one at a time."""
        state = self._state[group_id]
        state.assignments_since_refresh += len(entity_uuids)  # also when the write fails
        self._publish_drift(group_id)
        if self.is_refreshing(group_id):
            state.assigned_during_refresh.update(entity_uuids)
        choices = await self._place(group_id, entity_uuids)
        for choice in choices:
            COMMUNITY_ASSIGNMENTS.labels("joined" if choice else "none").inc()
        return choices

    async def _place(self, group_id: str, entity_uuids: list[str]) -> list[str | None]:
        weights = await self.store.communities.neighbour_weights_many(group_id, entity_uuids)
        neighbours = sorted({n for w in weights for n in w})
        held = await self.store.communities.communities_of(group_id, neighbours)
        choices: list[str | None] = []
        writes: list[tuple[str, str]] = []
        for entity_uuid, entity_weights in zip(entity_uuids, weights, strict=True):
            choice = assign_by_majority(entity_weights, held)
            choices.append(choice)
            if choice is not None:
                writes.append((choice, entity_uuid))
                held[entity_uuid] = choice  # a later entity of the batch sees it
        await self.store.communities.assign_members(group_id, writes)
        return choices

    # ------------------------------------------------------------------ scheduling
    def drift(self, group_id: str) -> float:
        state = self._state[group_id]
        return drift_ratio(state.assignments_since_refresh, state.group_size)

    def refresh_trigger(
        self,
        group_id: str,
        threshold: float,
        max_age: timedelta,
        now: datetime | None = None,
    ) -> str | None:
        """Why the group needs a refresh now, or None: "initial" when this process never
        refreshed it, "drift" when assignments since the last refresh exceed ``threshold``
        of its size, "age" when the last refresh is older than ``max_age`` and something
        was assigned since."""
        state = self._state[group_id]
        if state.last_refresh is None:
            return "initial"
        if self.drift(group_id) > threshold:
            return "drift"
        age = (now or utcnow()) - state.last_refresh
        if age > max_age and state.assignments_since_refresh > 0:
            return "age"
        return None

    def should_refresh(
        self,
        group_id: str,
        threshold: float,
        max_age: timedelta,
        now: datetime | None = None,
    ) -> bool:
        return self.refresh_trigger(group_id, threshold, max_age, now) is not None

    def forget(self, group_id: str) -> None:
        """Drop the group's drift state (its partition went to another worker). A group
        being refreshed keeps its lock until the refresh ends."""
        self._state.pop(group_id, None)
        lock = self._locks.get(group_id)
        if lock is not None and not lock.locked():
            del self._locks[group_id]
        COMMUNITY_DRIFT_RATIO.remove(group_id)  # absent labels are fine
        COMMUNITY_DRIFT_ARI.remove(group_id)

    def _publish_drift(self, group_id: str) -> None:
        if self._state[group_id].last_refresh is not None:  # no size to relate to before
            COMMUNITY_DRIFT_RATIO.labels(group_id).set(self.drift(group_id))

    def is_refreshing(self, group_id: str) -> bool:
        return self._locks[group_id].locked()

    # ------------------------------------------------------------------ refresh
    async def refresh(
        self,
        group_id: str,
        *,
        seed: int = 0,
        max_iterations: int = DEFAULT_MAX_ITERATIONS,
        trigger: str = "manual",
    ) -> RefreshResult:
        """Label propagation over the group's valid-fact graph, diffed against the stored
        communities: only changed and new ones are rewritten and re-summarised."""
        async with self._locks[group_id]:
            started = time.perf_counter()
            assigned_before = self._state[group_id].assignments_since_refresh
            nodes, edges = await self.store.communities.entity_graph(group_id)
            stored = await self.store.communities.list_communities(group_id)
            fresh = label_propagation(nodes, edges, seed=seed, max_iterations=max_iterations)
            plan = plan_refresh(group_id, stored, fresh.labels)
            ari = adjusted_rand_index(
                partition_of(stored), partition_of(plan.unchanged + plan.rewrites)
            )
            rewrites, calls = await self._describe(group_id, plan.rewrites, degrees(edges))
            await self.store.communities.write_communities(group_id, rewrites, plan.deleted)
            state = self._state[group_id]
            # entities the projection did not see may have lost the membership that their
            # assignment wrote meanwhile: place them again, on the new communities
            projected = set(nodes)
            late = sorted(state.assigned_during_refresh - projected)
            state.assigned_during_refresh.clear()
            if late:
                await self._place(group_id, late)
            seconds = time.perf_counter() - started

            state.assignments_since_refresh -= assigned_before
            state.group_size = len(nodes)
            state.last_refresh = utcnow()
            self._publish_drift(group_id)
            COMMUNITY_REFRESHES.labels(trigger).inc()
            COMMUNITY_REFRESH_SECONDS.observe(seconds)
            COMMUNITY_DRIFT_ARI.labels(group_id).set(ari)
            for kind, n in (
                ("changed", len(plan.changed)),
                ("created", len(plan.created)),
                ("deleted", len(plan.deleted)),
                ("unchanged", len(plan.unchanged)),
            ):
                COMMUNITIES_CHANGED.labels(kind).inc(n)
            return RefreshResult(
                changed=len(plan.changed),
                unchanged=len(plan.unchanged),
                created=len(plan.created),
                deleted=len(plan.deleted),
                seconds=seconds,
                llm_calls=calls,
                iterations=fresh.iterations,
                drift_ari=ari,
            )

    async def _describe(
        self, group_id: str, communities: list[CommunityRecord], degree: dict[str, int]
    ) -> tuple[list[CommunityRecord], int]:
        """Names, summaries and name embeddings for the communities to rewrite: one LLM call
        per community, all at once (the client's rate limiter paces them); without an LLM a
        name from the top members and a member-list summary."""
        if not communities:
            return [], 0
        members = sorted({m for c in communities for m in c.members})
        entities = {e.uuid: e for e in await self.store.entities_by_uuids(group_id, members)}
        names = {u: e.name for u, e in entities.items()}
        summaries = {u: e.summary for u, e in entities.items()}
        if self.llm is None:
            COMMUNITY_SUMMARIES.labels("default").inc(len(communities))
            described = [
                (default_name(c.members, degree, names), self._plain_summary(c, degree, names))
                for c in communities
            ]
        else:
            llm = self.llm
            answers = await asyncio.gather(
                *(
                    llm.structured(
                        stage=LLM_STAGE,
                        system=SUMMARY_SYSTEM,
                        user=summary_prompt(c.members, degree, names, summaries),
                        schema=CommunitySummaryOutput,
                    )
                    for c in communities
                )
            )
            COMMUNITY_SUMMARIES.labels("llm").inc(len(communities))
            described = [
                (a.name.strip() or default_name(c.members, degree, names), a.summary.strip())
                for a, c in zip(answers, communities, strict=True)
            ]
        embeddings: list[list[float] | None] = [None] * len(communities)
        if self.embedder is not None:
            embeddings = list(await self.embedder.embed([name for name, _ in described]))
        out = [
            CommunityRecord(c.uuid, name, summary, c.members, embedding)
            for c, (name, summary), embedding in zip(
                communities, described, embeddings, strict=True
            )
        ]
        return out, 0 if self.llm is None else len(communities)

    @staticmethod
    def _plain_summary(
        community: CommunityRecord, degree: dict[str, int], names: dict[str, str]
    ) -> str:
        return f"{len(community.members)} entities, most connected: " + default_name(
            community.members, degree, names, k=10
        )
