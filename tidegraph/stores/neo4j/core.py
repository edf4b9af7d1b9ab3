"""The Neo4j store's common operations: ``StoreCore`` runs the queries (``queries``,
``common_queries``, ``asof``) on the executor (``executor.Neo4jExecutor``) and turns the rows
into records. The queries answer with fixed column names (an entity ``e`` with
``community_uuid``, a fact ``r`` with ``source_uuid`` and ``target_uuid``, an episode ``ep``),
so reading, checking, folding, sorting and the exact as-of filter (``AsOf.believed``) happen
here. ``store.Neo4jStore`` adds the schema, the batched reads and the group commit; the
store's other roles are classes of their own over the same executor (``search``,
``browse``, ``outbox``, ``forget``, ``communities``). The embedded store speaks SQL:
``tidegraph.stores.sqlite.store``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import (
    EntityRecord,
    EpisodeRecord,
    FactRecord,
)
from tidegraph.records.times import utc
from tidegraph.stores.base import GraphStore
from tidegraph.stores.errors import StoreSchemaError, check_same_episode
from tidegraph.stores.executor import Row
from tidegraph.stores.neo4j import common_queries as cq
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j import search_queries as sq
from tidegraph.stores.neo4j.asof import as_of_params, as_of_query
from tidegraph.stores.neo4j.executor import Neo4jExecutor
from tidegraph.stores.neo4j.search import Neo4jSearch
from tidegraph.stores.rows import (
    entity_record,
    episode_record,
    fact_of,
    rank,
    sort_entities,
    sort_facts,
    unique,
)


class StoreCore(GraphStore):
    """``GraphStore``'s common operations over the executor (see the module docstring; the
    searches: ``search.Neo4jSearch``)."""

    search: Neo4jSearch

    def __init__(self, executor: Neo4jExecutor) -> None:
        self.ex = executor
        self._dim: int | None = None
        self.search = Neo4jSearch(self)

    # ------------------------------------------------------------------ Neo4jStore's hooks
    @abc.abstractmethod
    async def _declared_dim(self) -> int | None:
        """The embedding dimension the schema declares, None before ``setup``."""

    async def _entities_of(self, group_id: str, rows: list[Row]) -> list[EntityRecord]:
        """Entities from rows with ``e`` and ``community_uuid``, by name then uuid."""
        return sort_entities(entity_record(r["e"], r.get("community_uuid")) for r in rows)

    async def _with_fact_embeddings(
        self, group_id: str, facts: list[FactRecord]
    ) -> list[FactRecord]:
        """The facts with their stored embeddings (the fact rows carry them)."""
        return facts

    async def _facts_by_uuids(self, group_id: str, uuids: list[str]) -> list[FactRecord]:
        """The group's facts of these uuids, with their embeddings."""
        rows = await self.ex.rows(q.FACTS_BY_UUIDS, {"group_id": group_id, "uuids": uuids})
        return [fact_of(r) for r in rows]

    # ------------------------------------------------------------------ plumbing
    async def _embedding_dim(self) -> int:
        if self._dim is None:
            dim = await self._declared_dim()
            if dim is None:
                raise StoreSchemaError(f"the {self.name} schema is missing: run setup() first")
            self._dim = dim
        return self._dim

    async def close(self) -> None:
        await self.ex.close()

    # ------------------------------------------------------------------ episodes
    async def _episode_marker(
        self, group_id: str, episode_uuid: str, content_hash: str | None = None
    ) -> list[str] | None:
        params = {"group_id": group_id, "uuid": episode_uuid}
        rows = await self.ex.rows(q.EPISODE_PROCESSED, params)
        if not rows:
            return None
        check_same_episode(episode_uuid, rows[0]["content_hash"], content_hash)
        return list(rows[0]["created_entities"] or [])

    async def episode_status(self, group_id: str, episode_uuid: str) -> str:
        return (await self.episode_statuses(group_id, [episode_uuid]))[episode_uuid]

    async def episode_statuses(self, group_id: str, episode_uuids: list[str]) -> dict[str, str]:
        params = {"group_id": group_id, "uuids": list(episode_uuids)}
        found = {
            row["uuid"]: "forgotten"
            if row["forgotten_at"] is not None
            else "processed"
            if row["not_extracted"] is None
            else "not_extracted"
            for row in await self.ex.rows(cq.EPISODE_STATUSES, params)
        }
        return {uuid: found.get(uuid, "missing") for uuid in episode_uuids}

    async def pending_episodes(self, group_id: str, limit: int) -> list[EpisodeRecord]:
        if limit <= 0:
            return []
        params = {"group_id": group_id, "limit": limit}
        rows = await self.ex.rows(q.PENDING_EPISODES, params)
        return [episode_record(r["ep"]) for r in rows]

    async def pending_groups(self) -> list[str]:
        return [r["group_id"] for r in await self.ex.rows(cq.PENDING_GROUPS, {})]

    async def recent_episodes(
        self, group_id: str, before: datetime, limit: int
    ) -> list[EpisodeRecord]:
        if limit <= 0:
            return []
        params = {"group_id": group_id, "before": utc(before), "limit": limit}
        rows = await self.ex.rows(q.RECENT_EPISODES, params)
        return [episode_record(r["ep"]) for r in reversed(rows)]

    async def _producers(self, group_id: str, episode_uuids: Iterable[str]) -> dict[str, str]:
        """{episode uuid: producer id} of the group's episodes among these."""
        uuids = unique(episode_uuids)
        if not uuids:
            return {}
        rows = await self.ex.rows(q.PRODUCER_IDS, {"group_id": group_id, "uuids": uuids})
        return {r["uuid"]: r["producer_id"] or "" for r in rows}

    # ------------------------------------------------------------------ entities
    async def _entities(self, group_id: str, query: str, **params: Any) -> list[EntityRecord]:
        return await self._entities_by(group_id, query, {"group_id": group_id, **params})

    async def _entities_by(
        self, group_id: str, query: str, params: dict[str, Any]
    ) -> list[EntityRecord]:
        """The entities ``query`` finds with ``params`` as given (a kept plan's: one map)."""
        return await self._entities_of(group_id, await self.ex.rows(query, params))

    async def entities_by_names(self, group_id: str, names: list[str]) -> list[EntityRecord]:
        if not names:
            return []
        params = {"group_id": group_id, "names": unique(names)}
        return await self._entities_by(group_id, q.ENTITIES_BY_NAMES, params)

    async def entities_by_keys(self, group_id: str, keys: list[str]) -> list[EntityRecord]:
        if not keys:
            return []
        params = {"group_id": group_id, "keys": unique(keys)}
        return await self._entities_by(group_id, q.ENTITIES_BY_KEYS, params)

    async def entities_by_key_prefix(self, group_id: str, prefix: str) -> list[EntityRecord]:
        return await self._entities(group_id, q.ENTITIES_BY_KEY_PREFIX, prefix=prefix)

    async def entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]:
        if not uuids:
            return []
        params = {"group_id": group_id, "uuids": unique(uuids)}
        return await self._entities_by(group_id, q.ENTITIES_BY_UUIDS, params)

    async def fulltext_entities(
        self, group_id: str, text: str, limit: int
    ) -> list[tuple[EntityRecord, float]]:
        query = sq.fulltext_query(text)
        if query is None or limit <= 0:
            return []
        params = {"group_id": group_id, "query": query, "limit": limit}
        rows = await self.ex.rows(q.FULLTEXT_ENTITIES, params)
        entities = await self._entities_of(group_id, rows)
        scores = {r["e"]["uuid"]: float(r["score"]) for r in rows}
        return rank(((e, scores[e.uuid]) for e in entities), limit)

    async def vector_entities(
        self, group_id: str, embedding: list[float], limit: int
    ) -> list[tuple[EntityRecord, float]]:
        candidates, scan = sq.VECTOR["entity"]
        small = sq.SMALL_SCAN["entity"]
        hits, _ = await self.search._nearest(candidates, scan, [group_id], embedding, limit, small)
        found = {e.uuid: e for e in await self.entities_by_uuids(group_id, [u for u, _ in hits])}
        return rank(((found[u], s) for u, s in hits if u in found), limit)

    # ------------------------------------------------------------------ facts
    async def facts_touching(self, group_id: str, entity_uuids: list[str]) -> list[FactRecord]:
        if not entity_uuids:
            return []
        params = {"group_id": group_id, "uuids": unique(entity_uuids)}
        rows = [row for query in q.FACTS_TOUCHING for row in await self.ex.rows(query, params)]
        facts = sort_facts({f.uuid: f for f in map(fact_of, rows)}.values())  # each once
        return await self._with_fact_embeddings(group_id, facts)

    async def _believed(self, group_id: str, asof: AsOf) -> list[Row]:
        """The rows (``FACT_VIEW_RETURN``) of the facts ``asof`` believes: the Cypher filter's
        superset, decided fact by fact by ``AsOf.believed``; each row's ``fact`` added."""
        query = as_of_query(asof, q.FACT_VIEW_RETURN, q.ANCHOR_HINTS)
        rows = await self.ex.rows(query, as_of_params(group_id, asof))
        kept = []
        for row in rows:
            fact = fact_of(row)
            if asof.believed(fact):
                kept.append({**row, "fact": fact})
        return kept

    # ------------------------------------------------------------------ communities

    # ------------------------------------------------------------------ maintenance
