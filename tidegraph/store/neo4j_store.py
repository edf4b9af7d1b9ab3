"""The Neo4j graph store, on the official async driver.

Writes run as managed transactions (``execute_write`` retries transient errors); reads use
``execute_query`` with read routing. All Cypher lives in ``tidegraph.store.cypher``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from neo4j import (
    AsyncGraphDatabase,
    AsyncManagedTransaction,
    Record,
    RoutingControl,
    basic_auth,
)
from neo4j.exceptions import ClientError, ServiceUnavailable, SessionExpired, TransientError

from tidegraph.connections import neo4j_driver_options
from tidegraph.metrics import STORE_BATCH_SIZE, STORE_ERRORS
from tidegraph.records.asof import AsOf
from tidegraph.records.graph import (
    CommunityRecord,
    EntityLookup,
    EntityRecord,
    EpisodeRecord,
    EpisodeWrite,
    FactRecord,
    FactView,
    WeightedEdge,
)
from tidegraph.records.times import utc
from tidegraph.settings import Settings
from tidegraph.store import cypher as q
from tidegraph.store.base import GraphStore
from tidegraph.store.batching import GroupCommit
from tidegraph.store.cypher import (
    StoredFact,
    StoreSchemaError,
    as_of_params,
    check_community_owners,
    check_embedding,
    check_entity_owners,
    check_episode_write,
    check_same_episode,
    closure_row,
    community_rows,
    entity_record,
    entity_row,
    episode_record,
    episode_row,
    fact_record,
    fact_row,
    fact_view,
    fold_communities,
    fold_edges,
    lucene_query,
    neighbour_weights_of,
    now_utc,
    observe_write,
    rank,
    sort_entities,
    sort_facts,
    sort_views,
    top,
    unique,
    vector_candidates,
)

T = TypeVar("T")

# Episode writes that arrive while a transaction runs share the next one (GroupCommit).
MAX_EPISODES_PER_TRANSACTION = 32

AWAIT_INDEXES_SECONDS = 300
DELETE_BATCH = 2000
# Another process may create the same schema rule between our check and our create.
_ALREADY_EXISTS = frozenset(
    {
        "Neo.ClientError.Schema.EquivalentSchemaRuleAlreadyExists",
        "Neo.ClientError.Schema.IndexAlreadyExists",
        "Neo.ClientError.Schema.ConstraintAlreadyExists",
    }
)


@contextmanager
def _count_errors() -> Iterator[None]:
    """Count driver/server failures in STORE_ERRORS (caller mistakes, ValueError, are not)."""
    try:
        yield
    except ValueError:
        raise
    except (TransientError, ServiceUnavailable, SessionExpired):
        STORE_ERRORS.labels("transient").inc()
        raise
    except Exception:
        STORE_ERRORS.labels("other").inc()
        raise


@dataclass(frozen=True)
class _EpisodeJob:
    """One ``write_episode`` call, its query parameters ready."""

    group_id: str
    write: EpisodeWrite
    params: dict[str, Any]


async def _run(tx: AsyncManagedTransaction, query: str, params: dict[str, Any]) -> list[Record]:
    result = await tx.run(query, params)
    return [record async for record in result]


class Neo4jStore(GraphStore):
    """``GraphStore`` on a Neo4j 5.26+ server (Community edition is enough)."""

    name = "neo4j"

    def __init__(
        self,
        uri: str,
        user: str | None = None,
        password: str | None = None,
        database: str = "neo4j",
        driver_options: dict[str, Any] | None = None,
    ) -> None:
        auth = None if user is None else basic_auth(user, password or "")
        self._driver = AsyncGraphDatabase.driver(uri, auth=auth, **(driver_options or {}))
        self._database = database
        self._dim: int | None = None
        self._episodes: GroupCommit[_EpisodeJob, bool] = GroupCommit(
            self._commit_episodes, MAX_EPISODES_PER_TRANSACTION
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> Neo4jStore:
        return cls(
            settings.neo4j_uri,
            settings.neo4j_user,
            settings.neo4j_password.get_secret_value(),
            settings.neo4j_database,
            driver_options=neo4j_driver_options(settings),
        )

    # ------------------------------------------------------------------ plumbing
    async def _read(self, query: str, params: dict[str, Any]) -> list[Record]:
        with _count_errors():
            result = await self._driver.execute_query(
                query, params, database_=self._database, routing_=RoutingControl.READ
            )
        return result.records

    async def _write(
        self,
        operation: str,
        rows: int,
        work: Callable[[AsyncManagedTransaction], Awaitable[T]],
    ) -> T:
        """Run ``work`` as one managed write transaction (retried on transient errors)."""
        with _count_errors(), observe_write(operation, rows):
            async with self._driver.session(database=self._database) as session:
                return await session.execute_write(work)

    async def _vector_dims(self) -> dict[str, int]:
        records = await self._read(q.SHOW_VECTOR_INDEXES, {"names": list(q.VECTOR_INDEXES)})
        return {r["name"]: int(r["dim"]) for r in records}

    async def _embedding_dim(self) -> int:
        if self._dim is None:
            dims = await self._vector_dims()
            if q.ENTITY_VECTOR_INDEX not in dims:
                raise StoreSchemaError("the Neo4j schema is missing: run setup() first")
            self._dim = dims[q.ENTITY_VECTOR_INDEX]
        return self._dim

    # ------------------------------------------------------------------ lifecycle
    async def setup(self, embedding_dim: int) -> None:
        if embedding_dim < 1:
            raise ValueError("embedding_dim must be positive")
        self._check_dims(await self._vector_dims(), embedding_dim)
        params = {"dim": embedding_dim, "analyzer": q.FULLTEXT_ANALYZER}
        for statement in q.SCHEMA:
            await self._schema(statement, params)
        # A concurrent setup with another dimension may have won the race.
        self._check_dims(await self._vector_dims(), embedding_dim)
        with _count_errors():
            await self._driver.execute_query(
                q.AWAIT_INDEXES, {"timeout": AWAIT_INDEXES_SECONDS}, database_=self._database
            )
        self._dim = embedding_dim

    @staticmethod
    def _check_dims(dims: dict[str, int], wanted: int) -> None:
        for name, dim in sorted(dims.items()):
            if dim != wanted:
                raise StoreSchemaError(
                    f"Neo4j vector index {name!r} holds {dim}-dimensional embeddings but the "
                    f"embedder produces {wanted}. Either configure the embedder that made the "
                    f"stored graph (TIDEGRAPH_EMBEDDER / TIDEGRAPH_EMBEDDING_DIM), or switch "
                    f"models deliberately: DROP INDEX {name}, run setup again and re-embed "
                    f"the stored entities and facts (old embeddings would not be indexed)."
                )

    async def _schema(self, statement: str, params: dict[str, Any]) -> None:
        with _count_errors():
            try:
                await self._driver.execute_query(statement, params, database_=self._database)
            except ClientError as exc:
                if exc.code not in _ALREADY_EXISTS:
                    raise

    async def close(self) -> None:
        await self._driver.close()

    # ------------------------------------------------------------------ episodes
    async def episode_processed(
        self, group_id: str, episode_uuid: str, content_hash: str | None = None
    ) -> bool:
        records = await self._read(
            q.EPISODE_PROCESSED, {"group_id": group_id, "uuid": episode_uuid}
        )
        if not (records and records[0]["processed"]):
            return False
        check_same_episode(episode_uuid, records[0]["content_hash"], content_hash)
        return True

    async def recent_episodes(
        self, group_id: str, before: datetime, limit: int
    ) -> list[EpisodeRecord]:
        if limit <= 0:
            return []
        records = await self._read(
            q.RECENT_EPISODES, {"group_id": group_id, "before": utc(before), "limit": limit}
        )
        return [episode_record(dict(r["ep"])) for r in reversed(records)]

    # ------------------------------------------------------------------ entities
    async def _entities(self, query: str, params: dict[str, Any]) -> list[EntityRecord]:
        records = await self._read(query, params)
        return sort_entities(entity_record(dict(r["e"]), r["community_uuid"]) for r in records)

    async def entities_by_names(self, group_id: str, names: list[str]) -> list[EntityRecord]:
        if not names:
            return []
        return await self._entities(
            q.ENTITIES_BY_NAMES, {"group_id": group_id, "names": unique(names)}
        )

    async def entities_by_keys(self, group_id: str, keys: list[str]) -> list[EntityRecord]:
        if not keys:
            return []
        return await self._entities(
            q.ENTITIES_BY_KEYS, {"group_id": group_id, "keys": unique(keys)}
        )

    async def lookup_entities(
        self,
        group_id: str,
        keys: list[str],
        names: list[str],
        episode_uuid: str | None = None,
        relations: list[str] | None = None,
        content_hash: str | None = None,
    ) -> EntityLookup:
        params = {
            "group_id": group_id,
            "keys": unique(keys),
            "names": unique(names),
            "episode_uuid": episode_uuid,
            "relations": unique(relations or []),
        }
        records = await self._read(q.RESOLUTION_LOOKUP, params)
        if records and records[0]["processed"]:
            check_same_episode(str(episode_uuid), records[0]["stored_hash"], content_hash)
            return EntityLookup(processed=True)
        found: dict[str, list[EntityRecord]] = {"key": [], "name": []}
        facts: dict[str, FactRecord] = {}
        for record in records:
            if record["e"] is None:
                continue
            entity = entity_record(dict(record["e"]))
            found[record["how"]].append(entity)
            for r in record["facts"]:
                fact = fact_record(dict(r), entity.uuid, r["target_uuid"])
                facts[fact.uuid] = fact
        return EntityLookup(
            by_key=sort_entities(found["key"]),
            by_name=sort_entities(found["name"]),
            facts=None if relations is None else sort_facts(facts.values()),
        )

    async def entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]:
        if not uuids:
            return []
        return await self._entities(
            q.ENTITIES_BY_UUIDS, {"group_id": group_id, "uuids": unique(uuids)}
        )

    async def list_entities(self, group_id: str) -> list[EntityRecord]:
        return await self._entities(q.LIST_ENTITIES, {"group_id": group_id})

    async def fulltext_entities(
        self, group_id: str, text: str, limit: int
    ) -> list[tuple[EntityRecord, float]]:
        query = lucene_query(text)
        if query is None or limit <= 0:
            return []
        records = await self._read(
            q.FULLTEXT_ENTITIES,
            {
                "index": q.ENTITY_FULLTEXT_INDEX,
                "query": query,
                "group_id": group_id,
                "limit": limit,
            },
        )
        return rank(
            (
                (entity_record(dict(r["e"]), r["community_uuid"]), float(r["score"]))
                for r in records
            ),
            limit,
        )

    async def _nearest(
        self,
        candidates: str,
        scan: str,
        index: str,
        group_id: str,
        embedding: list[float],
        limit: int,
    ) -> list[tuple[str, float]]:
        """(uuid, score) of the group's nearest neighbours: from the global HNSW index, or by
        an exact scan of the group when the index's top candidates hold too few of them."""
        k = vector_candidates(limit)
        params = {
            "index": index,
            "k": k,
            "embedding": embedding,
            "group_id": group_id,
            "limit": limit,
        }
        record = (await self._read(candidates, params))[0]
        hits = [(h["uuid"], float(h["score"])) for h in record["hits"]]
        if len(hits) < limit and record["raw"] >= k:
            hits = [(r["uuid"], float(r["score"])) for r in await self._read(scan, params)]
        return top(hits, limit)

    async def vector_entities(
        self, group_id: str, embedding: list[float], limit: int
    ) -> list[tuple[EntityRecord, float]]:
        vector = check_embedding(embedding, await self._embedding_dim(), "query embedding")
        if limit <= 0 or vector is None:
            return []
        hits = await self._nearest(
            q.VECTOR_ENTITY_CANDIDATES,
            q.VECTOR_ENTITY_SCAN,
            q.ENTITY_VECTOR_INDEX,
            group_id,
            vector,
            limit,
        )
        found = {e.uuid: e for e in await self.entities_by_uuids(group_id, [u for u, _ in hits])}
        return rank(((found[u], s) for u, s in hits if u in found), limit)

    async def upsert_entities(self, group_id: str, entities: list[EntityRecord]) -> None:
        if not entities:
            return
        dim = await self._embedding_dim()
        now = now_utc()
        rows = [entity_row(group_id, e, dim, now) for e in entities]
        uuids = unique(r["uuid"] for r in rows)

        async def work(tx: AsyncManagedTransaction) -> None:
            owners = await _run(tx, q.ENTITY_GROUPS, {"uuids": uuids})
            check_entity_owners(group_id, {r["uuid"]: r["group_id"] for r in owners})
            await _run(tx, q.UPSERT_ENTITIES, {"group_id": group_id, "rows": rows})

        await self._write("upsert_entities", len(rows), work)

    # ------------------------------------------------------------------ facts
    @staticmethod
    def _fact(record: Record) -> FactRecord:
        return fact_record(dict(record["r"]), record["source_uuid"], record["target_uuid"])

    async def facts_touching(self, group_id: str, entity_uuids: list[str]) -> list[FactRecord]:
        if not entity_uuids:
            return []
        records = await self._read(
            q.FACTS_TOUCHING, {"group_id": group_id, "uuids": unique(entity_uuids)}
        )
        return sort_facts(self._fact(r) for r in records)

    async def fact_candidates(
        self,
        group_id: str,
        pairs: list[tuple[str, str]],
        ends: list[str],
        *,
        embeddings: bool = True,
    ) -> list[FactRecord]:
        if not pairs and not ends:
            return []
        params = {
            "group_id": group_id,
            "pairs": [{"source": s, "relation": r} for s, r in sorted(set(pairs))],
            "ends": unique(ends),
        }
        query = q.FACT_CANDIDATES if embeddings else q.FACT_CANDIDATES_PLAIN
        return sort_facts(self._fact(r) for r in await self._read(query, params))

    async def vector_facts(
        self, group_id: str, embedding: list[float], limit: int
    ) -> list[tuple[FactRecord, float]]:
        vector = check_embedding(embedding, await self._embedding_dim(), "query embedding")
        if limit <= 0 or vector is None:
            return []
        hits = await self._nearest(
            q.VECTOR_FACT_CANDIDATES,
            q.VECTOR_FACT_SCAN,
            q.FACT_VECTOR_INDEX,
            group_id,
            vector,
            limit,
        )
        records = await self._read(
            q.FACTS_BY_UUIDS_FULL, {"group_id": group_id, "uuids": [u for u, _ in hits]}
        )
        found = {f.uuid: f for f in map(self._fact, records)}
        return rank(((found[u], s) for u, s in hits if u in found), limit)

    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        dim = await self._embedding_dim()
        now = now_utc()
        params = {
            "group_id": group_id,
            "entities": [entity_row(group_id, e, dim, now) for e in write.entities],
            "ep": episode_row(group_id, write.episode, now),
            "mentions": unique(write.mentions),
            "facts": [fact_row(group_id, f, dim, now) for f in write.facts],
            "closures": [closure_row(c) for c in write.closures],
        }
        rows = sum(len(params[k]) for k in ("entities", "mentions", "facts", "closures")) + 1
        with observe_write("write_episode", rows):
            return await self._episodes.submit(_EpisodeJob(group_id, write, params))

    async def _commit_episodes(self, jobs: list[_EpisodeJob]) -> list[bool]:
        """One transaction for the episode writes of ``jobs``, in order (group commit)."""

        async def work(tx: AsyncManagedTransaction) -> list[bool]:
            written = []
            for job in jobs:
                fresh = await self._check_write(tx, job.group_id, job.write)
                if fresh:
                    await _run(tx, q.WRITE_EPISODE, job.params)
                written.append(fresh)
            return written

        STORE_BATCH_SIZE.labels("episodes_per_transaction").observe(len(jobs))
        with _count_errors():
            async with self._driver.session(database=self._database) as session:
                return await session.execute_write(work)

    @staticmethod
    async def _check_write(tx: AsyncManagedTransaction, group_id: str, write: EpisodeWrite) -> bool:
        """False when the episode is already processed in the group (nothing to write); raises
        ``StoreIntegrityError`` for a write that would cross groups or dangle."""
        upserted = unique(e.uuid for e in write.entities)
        entity_uuids = unique(
            [
                *upserted,
                *write.mentions,
                *(u for f in write.facts for u in (f.source_uuid, f.target_uuid)),
            ]
        )
        fact_uuids = unique([*(f.uuid for f in write.facts), *(c.uuid for c in write.closures)])
        [state] = await _run(
            tx,
            q.WRITE_STATE,
            {
                "episode_uuid": write.episode.uuid,
                "entity_uuids": entity_uuids,
                "fact_uuids": fact_uuids,
            },
        )
        if state["episode_group"] == group_id:
            check_same_episode(
                write.episode.uuid, state["episode_hash"], write.episode.content_hash
            )
            return False
        owners = {uuid: group for uuid, group in state["entities"]}
        check_entity_owners(group_id, {u: owners[u] for u in upserted if u in owners})
        facts = {u: StoredFact(g, source, target) for u, g, source, target in state["facts"]}
        check_episode_write(
            group_id,
            write,
            state["episode_group"],
            {**owners, **dict.fromkeys(upserted, group_id)},
            facts,
        )
        return True

    async def query_facts(
        self,
        group_id: str,
        *,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        include_invalid: bool = False,
        entity_uuid: str | None = None,
    ) -> list[FactView]:
        asof = AsOf.resolve(valid_at, known_at, include_invalid, entity_uuid)
        records = await self._read(q.query_facts_cypher(asof), as_of_params(group_id, asof))
        rows = [(self._fact(r), r["subject"], r["object"]) for r in records]
        rows = [(f, s, o) for f, s, o in rows if asof.believed(f)]
        producers = await self._producers(group_id, [f for f, _, _ in rows])
        return sort_views((fact_view(f, s, o, producers, asof), f) for f, s, o in rows)

    async def _producers(self, group_id: str, facts: list[FactRecord]) -> dict[str, str]:
        uuids = unique(u for f in facts for u in f.episodes)
        if not uuids:
            return {}
        records = await self._read(q.PRODUCER_IDS, {"group_id": group_id, "uuids": uuids})
        return {r["uuid"]: r["producer_id"] or "" for r in records}

    # ------------------------------------------------------------------ communities
    async def entity_graph(
        self, group_id: str, at: datetime | None = None
    ) -> tuple[list[str], list[WeightedEdge]]:
        asof = AsOf.resolve(at, None, False, None)
        nodes = await self._read(q.GROUP_ENTITY_UUIDS, {"group_id": group_id})
        rows = await self._read(
            q.entity_graph_cypher(asof, q.NEO4J_ANCHOR_HINTS), as_of_params(group_id, asof)
        )
        edges = fold_edges((r[0], r[1], r[2]) for r in rows)
        return sorted(r[0] for r in nodes), [WeightedEdge(a, b, w) for a, b, w in edges]

    async def neighbour_weights(
        self, group_id: str, entity_uuid: str, at: datetime | None = None
    ) -> dict[str, int]:
        asof = AsOf.resolve(at, None, False, entity_uuid)
        rows = await self._read(
            q.entity_graph_cypher(asof, q.NEO4J_ANCHOR_HINTS), as_of_params(group_id, asof)
        )
        return neighbour_weights_of(entity_uuid, ((r[0], r[1], r[2]) for r in rows))

    async def communities(self, group_id: str) -> list[CommunityRecord]:
        heads = await self._read(q.GROUP_COMMUNITIES, {"group_id": group_id})
        members = await self._read(q.GROUP_COMMUNITY_MEMBERS, {"group_id": group_id})
        folded = fold_communities(
            ((r[0], r[1], r[2]) for r in heads), ((r[0], r[1]) for r in members)
        )
        return [CommunityRecord(u, n, s, m) for u, n, s, m in folded]

    async def write_communities(
        self, group_id: str, upserts: list[CommunityRecord], deletes: list[str]
    ) -> None:
        if not upserts and not deletes:
            return
        rows, memberships, members = community_rows(upserts, await self._embedding_dim())
        uuids = [r["uuid"] for r in rows]
        params = {"group_id": group_id}

        async def work(tx: AsyncManagedTransaction) -> None:
            owners = await _run(tx, q.COMMUNITY_GROUPS, {"uuids": unique([*uuids, *deletes])})
            check_community_owners(group_id, {r[0]: r[1] for r in owners})
            if deletes:
                await _run(tx, q.DELETE_COMMUNITIES, {**params, "uuids": unique(deletes)})
            if rows:
                await _run(tx, q.UPSERT_COMMUNITIES, {**params, "rows": rows})
                await _run(tx, q.DROP_MEMBERSHIPS, {**params, "uuids": uuids, "members": members})
            if memberships:
                await _run(tx, q.ADD_MEMBERSHIPS, {**params, "rows": memberships})

        await self._write("write_communities", len(rows) + len(memberships), work)

    async def assign_member(self, group_id: str, community_uuid: str, entity_uuid: str) -> None:
        params = {
            "group_id": group_id,
            "community_uuid": community_uuid,
            "entity_uuid": entity_uuid,
        }

        async def work(tx: AsyncManagedTransaction) -> None:
            found = await _run(tx, q.MEMBER_TARGETS, params)
            if not found or int(found[0][0]) == 0:
                return
            await _run(tx, q.DROP_OTHER_MEMBERSHIPS, params)
            await _run(tx, q.MERGE_MEMBERSHIP, params)

        await self._write("assign_member", 1, work)

    # ------------------------------------------------------------------ maintenance
    async def counts(self, group_id: str) -> dict[str, int]:
        record = (await self._read(q.COUNTS, {"group_id": group_id}))[0]
        return {k: int(record[k]) for k in ("episodes", "entities", "facts", "mentions")}

    async def delete_group(self, group_id: str) -> None:
        for query in q.DELETE_GROUP_BATCH.values():
            while True:

                async def work(tx: AsyncManagedTransaction, query: str = query) -> int:
                    records = await _run(tx, query, {"group_id": group_id, "batch": DELETE_BATCH})
                    return int(records[0]["deleted"])

                if await self._write("delete_group", DELETE_BATCH, work) == 0:
                    break
