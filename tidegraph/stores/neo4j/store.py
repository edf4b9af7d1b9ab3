"""The Neo4j graph store: ``StoreCore`` on a ``Neo4jExecutor``, with one class per role over
the same executor (``search``, ``browse``, ``outbox``, ``forget``, ``communities``; ``core``
says how the store is split), and what Neo4j does its own way:
the schema, writes of many rows in one UNWIND statement, the one-round-trip resolution
lookup, and the group commit of episode writes (``batching.GroupCommit``: writes that arrive
while a transaction runs share the next one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from neo4j import AsyncGraphDatabase, basic_auth

from tidegraph.connections import NEO4J_NOTIFICATIONS
from tidegraph.metrics import STORE_BATCH_SIZE
from tidegraph.records.conversation import search_fields
from tidegraph.records.graph import (
    EntityLookup,
    EntityRecord,
    EpisodeRecord,
    EpisodeWrite,
    FactRecord,
)
from tidegraph.records.times import utc
from tidegraph.settings import DEFAULT_TOPIC_PREFIX
from tidegraph.stores import errors
from tidegraph.stores.base import BatchRead, BatchWriteError, LookupRequest
from tidegraph.stores.episode_search import speaker_words
from tidegraph.stores.executor import Row, Tx, observe_write
from tidegraph.stores.neo4j import lifecycle_queries as lq
from tidegraph.stores.neo4j import migration_queries as mq
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j import search_queries as sq
from tidegraph.stores.neo4j.batching import (
    MAX_WRITES_PER_TRANSACTION,
    TRANSACTIONS_IN_FLIGHT,
    GroupCommit,
)
from tidegraph.stores.neo4j.browse import Neo4jBrowsing
from tidegraph.stores.neo4j.communities import Neo4jCommunities
from tidegraph.stores.neo4j.core import StoreCore
from tidegraph.stores.neo4j.executor import Neo4jExecutor
from tidegraph.stores.neo4j.forget import Neo4jForgetting
from tidegraph.stores.neo4j.keys import Neo4jKeys
from tidegraph.stores.neo4j.outbox import Neo4jOutbox
from tidegraph.stores.neo4j.plans import NO_RECORD, PLANS_AHEAD_GROUP, stand_ins
from tidegraph.stores.rows import (
    by_record,
    check_embedding,
    closure_row,
    entity_record,
    entity_row,
    episode_record,
    episode_row,
    fact_of,
    fact_record,
    fact_row,
    joined_outbox_rows,
    now_utc,
    outbox_row,
    rank,
    sort_entities,
    sort_facts,
    top,
    unique,
    with_epoch_times,
)
from tidegraph.stores.search_text import identifier_words

log = logging.getLogger(__name__)

# Batch reads (``read_batch``) that arrive while one runs share the next statement, up to this
# many groups' batches; two such statements at most run at once (reads take no locks).
MAX_BATCH_READS_PER_STATEMENT = 16
BATCH_READS_IN_FLIGHT = 2
AWAIT_INDEXES_SECONDS = 300


@dataclass(frozen=True)
class _EpisodeJob:
    """One ``write_episode`` call, its query parameters ready."""

    group_id: str
    write: EpisodeWrite
    params: dict[str, Any]
    outbox: dict[str, Any]  # its changes (``rows.outbox_row``)

    @property
    def rows(self) -> int:
        return 1 + sum(len(self.params[k]) for k in ("entities", "mentions", "facts", "closures"))


def _index_params(episode: EpisodeRecord) -> dict[str, Any]:
    """An episode's indexed fields but its context (set by the write's statement from the
    thread as stored: ``queries.thread_context``), and its speaker's name words."""
    fields = search_fields(episode.source, episode.content, episode.valid_at)
    return {
        "body": fields.body,
        "speaker": fields.speaker,
        "when": fields.when,
        "ids": " ".join(identifier_words(fields.body)),
        "speaker_words": speaker_words(fields.speaker),
    }


def _write_params(group_id: str, write: EpisodeWrite, dim: int, now: datetime) -> dict[str, Any]:
    """The parameters of one episode write (a row of ``WRITE_EPISODES``)."""
    return {
        "group_id": group_id,
        "entities": [with_epoch_times(entity_row(group_id, e, dim, now)) for e in write.entities],
        "ep": with_epoch_times(episode_row(group_id, write.episode, dim, now, write.created)),
        "index": _index_params(write.episode),
        "mentions": unique(write.mentions),
        "facts": [with_epoch_times(fact_row(group_id, f, dim, now)) for f in write.facts],
        "closures": [with_epoch_times(closure_row(c)) for c in write.closures],
    }


def _lookup_of(found: list[Row], *, with_facts: bool) -> EntityLookup:
    """An ``EntityLookup`` from rows of an entity found (``e``), how (``hows``: by key, by
    name or both) and its facts (``facts``), as RESOLUTION_LOOKUP and READ_BATCHES give them."""
    by: dict[str, list[EntityRecord]] = {"key": [], "name": []}
    facts: dict[str, FactRecord] = {}
    for row in found:
        entity = entity_record(row["e"])
        for how in row["hows"]:
            by[how].append(entity)
        for r in row["facts"]:
            fact = fact_record(r, entity.uuid, r["target_uuid"])
            facts[fact.uuid] = fact
    return EntityLookup(
        by_key=sort_entities(by["key"]),
        by_name=sort_entities(by["name"]),
        facts=sort_facts(facts.values()) if with_facts else None,
    )


@dataclass(eq=False)  # an ask is its own key in the shared reads (no order between them)
class _BatchAsk:
    group_id: str
    keys: list[str]
    names: list[str]
    relations: list[str]
    episodes: list[str]
    facts_from: datetime | None


class Neo4jStore(StoreCore):
    """``GraphStore`` on a Neo4j 5.26+ server (Community edition is enough)."""

    name = "neo4j"

    def __init__(
        self,
        uri: str,
        user: str | None = None,
        password: str | None = None,
        database: str = "neo4j",
        driver_options: dict[str, Any] | None = None,
        deployment: str = DEFAULT_TOPIC_PREFIX,
    ) -> None:
        auth = None if user is None else basic_auth(user, password or "")
        driver = AsyncGraphDatabase.driver(
            uri, auth=auth, **NEO4J_NOTIFICATIONS, **(driver_options or {})
        )
        super().__init__(Neo4jExecutor(driver, database))
        self.deployment = deployment
        self.outbox = Neo4jOutbox(self)
        self.forget = Neo4jForgetting(self)
        self.keys = Neo4jKeys(self)
        self.browse = Neo4jBrowsing(self)
        self.communities = Neo4jCommunities(self)
        # An item is the writes of one call: one episode, or a group's micro-batch.
        self._episodes: GroupCommit[list[_EpisodeJob], list[bool]] = GroupCommit(
            self._commit_batches,
            MAX_WRITES_PER_TRANSACTION,
            key=lambda jobs: jobs[0].group_id,
            max_in_flight=TRANSACTIONS_IN_FLIGHT,
        )
        self._batch_reads: GroupCommit[_BatchAsk, Row] = GroupCommit(
            self._read_batches,
            MAX_BATCH_READS_PER_STATEMENT,
            key=lambda ask: ask,
            max_in_flight=BATCH_READS_IN_FLIGHT,
        )

    # ------------------------------------------------------------------ schema
    async def _vector_dims(self) -> dict[str, int]:
        records = await self.ex.rows(q.SHOW_VECTOR_INDEXES, {"names": list(q.VECTOR_INDEXES)})
        return {r["name"]: int(r["dim"]) for r in records}

    async def _declared_dim(self) -> int | None:
        return (await self._vector_dims()).get(q.ENTITY_VECTOR_INDEX)

    async def setup(self, embedding_dim: int, embedding_model: str | None = None) -> None:
        if embedding_dim < 1:
            raise ValueError("embedding_dim must be positive")
        await self.ex.reachable()  # at once, not after the driver's 30 s of retries
        self._check_dims(await self._vector_dims(), embedding_dim)
        params = {"dim": embedding_dim, "analyzer": q.FULLTEXT_ANALYZER}
        for statement in q.SCHEMA:
            await self.ex.execute(statement, params, schema=True)
        await self._number_stored_changes()
        await self._index_stored_changes()
        for statement in q.DROPPED:
            await self.ex.execute(statement, {}, schema=True)
        # A concurrent setup with another dimension may have won the race.
        self._check_dims(await self._vector_dims(), embedding_dim)
        await self._index_stored_episodes()
        await self._index_stored_ids()
        await self.ex.execute(q.AWAIT_INDEXES, {"timeout": AWAIT_INDEXES_SECONDS})
        self._dim = embedding_dim
        await self._plan_ahead()

    async def _until_none(self, query: str, column: str, params: dict[str, Any]) -> int:
        """Runs a migration statement, one transaction each, until it handles no row (the
        count it returns in ``column``); the rows it handled in all."""

        async def step(tx: Tx) -> int:
            [row] = await tx.rows(query, params)
            return int(row[column])

        handled = 0
        while done := await self.ex.transaction(step):
            handled += done
        return handled

    async def _number_stored_changes(self, batch: int = 5000) -> None:
        """The migration of an outbox whose ``Change`` nodes were one change each (while
        their index, ``change_group_seq``, exists): each becomes a row of one, found by
        (group, last) like the rows written since."""
        indexes = await self.ex.rows(q.SHOW_INDEXES, {"names": [q.OLD_CHANGE_INDEX]})
        if not indexes:
            return

        numbered = await self._until_none(lq.CHANGES_TO_NUMBER, "numbered", {"limit": batch})
        if numbered:
            log.info("numbered %d stored outbox changes as rows of one", numbered)

    async def _index_stored_changes(self, batch: int = q.OUTBOX_ROW_BATCH) -> None:
        """The migration of an outbox written before its index of records (while its group
        index, ``change_record_group``, is missing): every Change node's records indexed,
        then that index created, in one pass committed every ``batch`` rows. A row holds a
        whole write's records (hundreds), so a batch is counted in rows like the outbox's
        deletes: 2,000 rows at once ran out of transaction memory."""
        names = [q.CHANGE_RECORD_GROUP_INDEX]
        if await self.ex.rows(q.SHOW_INDEXES, {"names": names}):
            return
        [row] = await self.ex.batched(lq.CHANGES_TO_INDEX, {"rows": batch})
        indexed = int(row["indexed"])
        if indexed:
            log.info("indexed %d stored outbox rows by record", indexed)
        await self.ex.execute(q.CREATE_CHANGE_RECORD_GROUP_INDEX, {}, schema=True)

    async def _index_stored_episodes(self, batch: int = 2000) -> None:
        """The migration of episodes stored before their conversation fields (docs/retrieval.md
        "Conversation-aware episode search"): their fields and speakers' words, then the
        messages' contexts, a batch at a time; nothing to do (one read) once migrated."""
        indexed = 0
        while rows := await self.ex.rows(mq.EPISODES_TO_INDEX, {"limit": batch}):
            params = [
                {
                    "uuid": r["uuid"],
                    "index": _index_params(
                        EpisodeRecord(
                            uuid=r["uuid"],
                            group_id=r["group_id"],
                            name="",
                            source=r["source"] or "",
                            source_description="",
                            content=r["content"] or "",
                            valid_at=datetime.fromtimestamp(r["valid_at_ms"] / 1000, UTC),
                        )
                    ),
                }
                for r in rows
            ]
            await self.ex.execute(mq.SET_EPISODE_INDEX, {"rows": params})
            indexed += len(rows)

        await self._until_none(
            mq.THREADS_TO_INDEX, "indexed", {"limit": batch, **q.thread_params()}
        )
        if indexed:
            log.info("indexed %d stored episodes for conversation search", indexed)

    async def _index_stored_ids(self, batch: int = 2000) -> None:
        """The migration of facts and entities stored before their identifier words
        (docs/retrieval.md "Identifiers"), and of facts and episodes stored before their validity
        words ("Validity in the fulltext index"), and of entities stored with aliases before their
        alias key (``write_queries.set_alias_key``), a batch at a time; nothing to do (a read
        each) once migrated."""
        indexed = 0
        for to_index, set_ids in (
            (mq.FACTS_TO_INDEX, mq.SET_FACT_IDS),
            (mq.ENTITIES_TO_INDEX, mq.SET_ENTITY_IDS),
        ):
            while rows := await self.ex.rows(to_index, {"limit": batch}):
                ids = [
                    {"uuid": r["uuid"], "ids": " ".join(identifier_words(r["text"] or ""))}
                    for r in rows
                ]
                await self.ex.execute(set_ids, {"rows": ids})
                indexed += len(rows)
        if indexed:
            log.info("indexed the identifiers of %d stored facts and entities", indexed)

        timed = await self._until_none(mq.FACT_TIMES_TO_INDEX, "indexed", {"limit": batch})
        if timed:
            log.info("indexed the validity of %d stored facts", timed)
        ends = await self._until_none(mq.FACT_ENDS_TO_INDEX, "indexed", {"limit": batch})
        if ends:
            log.info("indexed the ends of %d stored facts", ends)
        said = await self._until_none(mq.EPISODE_TIMES_TO_INDEX, "indexed", {"limit": batch})
        if said:
            log.info("indexed the times of %d stored episodes", said)
        aliased = await self._until_none(mq.ALIAS_KEYS_TO_SET, "indexed", {"limit": batch})
        if aliased:
            log.info("indexed the aliases of %d stored entities", aliased)

    async def open_existing(self, embedding_dim: int, embedding_model: str | None = None) -> bool:
        await self.ex.reachable()
        dims = await self._vector_dims()
        if not dims:
            return False  # no tidegraph schema in this database: nothing was written
        self._check_dims(dims, embedding_dim)
        self._dim = embedding_dim
        return True

    @staticmethod
    def _check_dims(dims: dict[str, int], wanted: int) -> None:
        errors.check_dimensions(
            dims,
            wanted,
            lambda name: f"Neo4j vector index {name!r}",
            lambda name: (
                f"switch models deliberately: DROP INDEX {name}, run setup again and re-embed "
                "the stored entities and facts (old embeddings would not be indexed)"
            ),
        )

    # ------------------------------------------------------------------ reads in one trip
    async def episode_markers(
        self, group_id: str, episodes: list[tuple[str, str | None]]
    ) -> dict[str, list[str]]:
        hashes = dict(episodes)
        rows = await self.ex.rows(
            q.EPISODES_PROCESSED, {"group_id": group_id, "uuids": list(hashes)}
        )
        found: dict[str, list[str]] = {}
        for row in rows:
            errors.check_same_episode(row["uuid"], row["content_hash"], hashes[row["uuid"]])
            found[row["uuid"]] = list(row["created_entities"] or [])
        return found

    async def recent_episodes_before(
        self, group_id: str, befores: list[datetime], limit: int
    ) -> list[list[EpisodeRecord]]:
        if limit <= 0 or not befores:
            return [[] for _ in befores]
        params = {"group_id": group_id, "befores": [utc(b) for b in befores], "limit": limit}
        rows = await self.ex.rows(q.RECENT_EPISODES_BEFORE, params)
        return [[episode_record(ep) for ep in reversed(row["eps"])] for row in rows]

    async def read_batch(
        self,
        group_id: str,
        keys: list[str],
        names: list[str],
        relations: list[str],
        episodes: list[tuple[str, str | None]],
        facts_from: datetime | None = None,
    ) -> BatchRead:
        """One statement (``q.READ_BATCHES``), shared with the batch reads of other groups
        submitted while one runs (``GroupCommit``: a lone read runs at once)."""
        hashes = dict(episodes)
        ask = _BatchAsk(
            group_id,
            unique(keys),
            unique(names),
            unique(relations),
            list(hashes),
            utc(facts_from) if facts_from is not None else None,
        )
        row = await self._batch_reads.submit(ask)
        markers: dict[str, list[str]] = {}
        for uuid, content_hash, created in row["markers"]:
            errors.check_same_episode(uuid, content_hash, hashes[uuid])
            markers[uuid] = list(created or [])
        return BatchRead(_lookup_of(row["found"], with_facts=True), markers)

    async def _read_batches(self, asks: list[_BatchAsk]) -> list[Row]:
        params = [{"i": i, **vars(ask)} for i, ask in enumerate(asks)]
        rows = await self.ex.rows(q.READ_BATCHES, {"asks": params})
        return sorted(rows, key=lambda row: int(row["i"]))

    async def entity_candidates(
        self, group_id: str, searches: list[tuple[str, list[float]]], limit: int
    ) -> list[tuple[list[tuple[EntityRecord, float]], list[tuple[EntityRecord, float]]]]:
        """One statement for a small group (``q.ENTITY_CANDIDATES``: the hits of every
        search with their records); a larger one, or a search without an embedding, as the
        base."""
        dim = await self._embedding_dim()
        vectors = [check_embedding(e, dim, "query embedding") for _, e in searches]
        if not searches or limit <= 0 or any(v is None for v in vectors):
            return await super().entity_candidates(group_id, searches, limit)
        drafts = [
            {"query": sq.fulltext_query(name), "embedding": vector}
            for (name, _), vector in zip(searches, vectors, strict=True)
        ]
        params = {
            "group_id": group_id,
            "drafts": drafts,
            "limit": limit,
            "scan_below": self.search.scan_below,
        }
        rows = await self.ex.rows(q.ENTITY_CANDIDATES, params)
        rows.sort(key=lambda r: r["i"])
        if not all(row["small"] for row in rows):
            return await super().entity_candidates(group_id, searches, limit)
        records = {
            found["e"]["uuid"]: entity_record(found["e"], found["community_uuid"])
            for row in rows
            for found in row["records"]
        }
        answers = []
        for row in rows:
            nearest = top(((u, min(1.0, max(0.0, float(s)))) for u, s in row["vector_hits"]), limit)
            vector = rank(((records[u], s) for u, s in nearest if u in records), limit)
            text = rank(
                ((records[u], float(s)) for u, s in row["fulltext_hits"] if u in records), limit
            )
            answers.append((vector, text))
        return answers

    async def _lookup(self, group_id: str, ask: LookupRequest) -> EntityLookup:
        params = {
            "group_id": group_id,
            "keys": ask.keys,
            "names": ask.names,
            "episode_uuid": ask.episode_uuid,
            "relations": ask.relations or [],
        }
        records = await self.ex.rows(q.RESOLUTION_LOOKUP, params)
        if records and records[0]["processed"]:
            errors.check_same_episode(
                str(ask.episode_uuid), records[0]["stored_hash"], ask.content_hash
            )
            return EntityLookup(
                processed=True, created_entities=list(records[0]["created_entities"] or [])
            )
        found = [record for record in records if record["e"] is not None]
        return _lookup_of(found, with_facts=ask.relations is not None)

    async def _fact_candidates(
        self, group_id: str, pairs: list[tuple[str, str]], ends: list[str], embeddings: bool
    ) -> list[FactRecord]:
        params = {
            "group_id": group_id,
            "pairs": [{"source": s, "relation": r} for s, r in pairs],
            "ends": ends,
        }
        query = q.FACT_CANDIDATES if embeddings else q.FACT_CANDIDATES_PLAIN
        return sort_facts(fact_of(r) for r in await self.ex.rows(query, params))

    # ------------------------------------------------------------------ writes

    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        [written] = await self.write_episodes(group_id, [write])
        return written

    async def write_episodes(self, group_id: str, writes: list[EpisodeWrite]) -> list[bool]:
        """One transaction for all of ``writes`` (shared with concurrent callers'): all are
        committed or none (BatchWriteError with nothing written)."""
        if not writes:
            return []
        dim = await self._embedding_dim()
        now = now_utc()
        jobs = [
            _EpisodeJob(
                group_id,
                write,
                _write_params(group_id, write, dim, now),
                outbox_row(group_id, write.changes),
            )
            for write in writes
        ]
        rows = sum(job.rows for job in jobs)
        with observe_write("write_episode", rows):
            try:
                return await self._episodes.submit(jobs)
            except Exception as exc:
                if len(writes) == 1:
                    raise
                raise BatchWriteError([]) from exc

    async def _commit_batches(self, batches: list[list[_EpisodeJob]]) -> list[list[bool]]:
        written = await self._commit_episodes([job for jobs in batches for job in jobs])
        results, start = [], 0
        for jobs in batches:
            results.append(written[start : start + len(jobs)])
            start += len(jobs)
        return results

    async def _commit_episodes(self, jobs: list[_EpisodeJob]) -> list[bool]:
        """One transaction for the episode writes of ``jobs``, in order (group commit)."""
        STORE_BATCH_SIZE.labels("episodes_per_transaction").observe(len(jobs))
        return await self.ex.transaction(lambda tx: self._write_jobs(tx, jobs))

    async def _write_jobs(self, tx: Tx, jobs: list[_EpisodeJob]) -> list[bool]:
        """The episode writes of ``jobs`` in ``tx``: one read of what they touch, the checks
        in Python (``errors.WriteChecks``), one statement for every write that passes. Both
        statements keep their plan (``plans.kept_plan``): with lists as parameters of their
        own, Neo4j planned the write again for every new size class of a list (a second or
        more of the server's CPU each, during which no other write commits)."""
        episodes, entities, facts = errors.touched_by([job.write for job in jobs])
        touched = {"episode_uuids": episodes, "entity_uuids": entities, "fact_uuids": facts}
        [state] = await tx.rows(q.WRITE_STATES, touched)
        checks = errors.WriteChecks(
            episodes={
                uuid: errors.StoredEpisode(group, content_hash, not_extracted)
                for uuid, group, content_hash, not_extracted in state["episodes"]
            },
            owners={uuid: group for uuid, group in state["entities"]},
            facts={
                u: errors.StoredFact(g, source, target) for u, g, source, target in state["facts"]
            },
        )
        written = [checks.admit(job.group_id, job.write) for job in jobs]
        admitted = [job for job, fresh in zip(jobs, written, strict=True) if fresh]
        # the outbox: one row per group for the changes of its writes here, in order
        by_group: dict[str, list[dict[str, Any]]] = {}
        for job in admitted:
            by_group.setdefault(job.group_id, []).append(job.outbox)
        if admitted:
            params = {
                "writes": [job.params for job in admitted],
                "outbox": [by_record(joined_outbox_rows(rows)) for rows in by_group.values()],
                "deployment": self.deployment,
                **q.thread_params(),
            }
            await tx.rows(q.WRITE_EPISODES, params)
        return written

    async def _plan_ahead(self) -> None:
        """Has Neo4j plan the statements that keep their plan (``plans``) now, when the store
        starts, so that no episode write, read of the write path or forget pays it: the reads
        of the text write path's chain (processed markers, earlier episodes, the unit's read,
        the entity search) on a group no one has; the episode write, one write of that group
        in a transaction that is rolled back; the community assignment's and the change
        relay's, which run for every batch as well; and the forget's
        (``Neo4jForgetting.plan_ahead``)."""
        when = now_utc()
        entity, fact, episode = stand_ins(when)
        group_id = PLANS_AHEAD_GROUP
        dim = await self._embedding_dim()
        await self.episode_markers(group_id, [(NO_RECORD, None)])
        await self.recent_episodes_before(group_id, [when], 1)
        await self._read_batches(
            [_BatchAsk(group_id, [NO_RECORD], [NO_RECORD], ["R"], [NO_RECORD], when)]
        )
        await self.entity_candidates(group_id, [(NO_RECORD, [1.0] + [0.0] * (dim - 1))], 1)
        write = EpisodeWrite(episode, mentions=[NO_RECORD], facts=[fact], entities=[entity])
        job = _EpisodeJob(
            group_id, write, _write_params(group_id, write, dim, when), outbox_row(group_id, [])
        )

        async def work(tx: Tx) -> None:
            await self._write_jobs(tx, [job])

        await self.ex.rehearse(work)
        await Neo4jCommunities(self).plan_ahead()
        await Neo4jOutbox(self).plan_ahead()
        await Neo4jForgetting(self).plan_ahead()
