"""The embedded graph store, on kuzu 0.11.3 (no server; the data lives in one folder):
``StoreCore`` on a ``KuzuExecutor`` with the kuzu dialect (``kuzu_queries``), and what kuzu
needs done its own way.

The same graph as Neo4j, bent around kuzu's rules, each measured on 0.11.3 (the vector and
fts extensions are linked in: nothing is downloaded, and both indexes work with no network):

- the schema is declared (tables are created by ``setup``); list types are ``STRING[]`` and
  embeddings ``DOUBLE[dim]`` (doubles, so they come back exactly as Neo4j returns them);
- a vector-indexed property cannot be SET after creation, not even by MERGE's ON CREATE SET,
  so an entity is CREATEd with its ``name_embedding`` inline (it never changes afterwards);
- the HNSW and BM25 indexes follow single-row inserts, updates (also UNWIND-batched), deletes,
  rollbacks and reopening by themselves, BUT a multi-row CREATE into a fulltext-indexed table
  indexes every row under the first row's words, and a multi-row MERGE that creates such
  nodes crashes the process: those nodes are created one statement per row;
- a fulltext index with a custom stop-word table crashes on the next insert: the default
  (English, ~570 words) is kept, and ``search_text.SEARCH_STOP_WORDS`` mirrors it for both
  stores; digits are never indexed;
- relationship properties cannot be indexed, and a fixed-size array on a relationship table
  makes every checkpoint rewrite all of them (measured: 0.4 s at 2,000 facts, 76 s at
  12,000). So each fact has a row in the node table ``FactIndex``, keyed by the fact's uuid:
  its group, its two ends and its embedding (checkpoint 0.5 s at 12,000). A fact is found by
  uuid through it (a primary-key lookup, then the source's adjacency), never by scanning
  RELATES_TO; its text is there too, for fulltext search;
- a vector-indexed property cannot be SET, and an HNSW index that once became empty finds
  nothing again: the embeddings that change (a fact's, a community's) are searched in tables
  of their own (FactVector, CommunityVector), a new row per embedding, created before the
  replaced one is deleted (``kuzu_writes.new_vector``); episodes are created once, with
  their content embedding;
- no secondary indexes: entities are found by key and by name through the ``EntityLookupKey``
  table (``kuzu_queries.LOOKUP_KEY``), and by uuid one primary-key lookup each (kuzu plans
  ``uuid IN [...]`` as a scan);
- ``TIMESTAMP`` drops the UTC offset, so naive UTC goes in and comes back as aware UTC;
- an UNWIND row whose field is null in every row is typed STRING, hence the CASTs; a null
  embedding inside rows that also carry embeddings fails, hence rows are split by it;
- a statement failing inside a manual transaction rolls the transaction back at once;
- no ``SET n += map``, no ``CALL {}``, no list comprehensions, no startNode(); parameters
  inside ``any(...)`` or list lambdas crash 0.11.3, so those are avoided.

The operations made of many small statements (a primary-key lookup per uuid, an episode's
write: ``kuzu_writes``) run as one function on the executor's thread (``KuzuExecutor.run``),
the others as the shared core's queries. One process at a time may open the folder (kuzu locks it).
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from tidegraph.records.graph import EntityLookup, EntityRecord, EpisodeWrite, FactRecord
from tidegraph.records.ids import normalize_name
from tidegraph.store import errors, kuzu_search_queries
from tidegraph.store import kuzu_queries as q
from tidegraph.store.base import BatchWriteError, LookupRequest
from tidegraph.store.core import StoreCore
from tidegraph.store.executor import Row, Tx
from tidegraph.store.kuzu_executor import KuzuDatabase, KuzuExecutor
from tidegraph.store.kuzu_writes import (
    fact_index,
    lookup_key_id,
    lookup_key_ids,
    new_vector_id,
    write_entities,
)
from tidegraph.store.kuzu_writes import write_episode as write_episode_on_thread
from tidegraph.store.rows import (
    closure_row,
    entity_record,
    entity_row,
    episode_row,
    fact_of,
    fact_row,
    now_utc,
    sort_entities,
    sort_facts,
    unique,
)

_ARRAY_DIM = re.compile(r"^DOUBLE\[(\d+)\]$")
# The embedding columns, by table (RELATES_TO's: a store made before FactIndex).
_EMBEDDINGS = (
    ("Entity", "name_embedding"),
    ("Community", "name_embedding"),
    ("FactIndex", "embedding"),
    ("Episodic", "content_embedding"),
    *((table, "embedding") for table in q.VECTOR_TABLES),
    ("RELATES_TO", "fact_embedding"),
)


def _tables(db: KuzuDatabase) -> set[str]:
    return {row["name"] for row in db.rows(q.SHOW_TABLES)}


def _columns(db: KuzuDatabase, table: str) -> dict[str, str]:
    return {row["name"]: str(row["type"]) for row in db.rows(q.table_info(table))}


def _declared_dims(db: KuzuDatabase) -> dict[str, int] | None:
    """Declared embedding sizes by ``table.column``, or None before the schema exists."""
    tables = _tables(db)
    if "Entity" not in tables:
        return None
    dims = {}
    for table, prop in _EMBEDDINGS:
        if table in tables:
            match = _ARRAY_DIM.match(_columns(db, table).get(prop, ""))
            if match:
                dims[f"{table}.{prop}"] = int(match.group(1))
    return dims


class KuzuStore(StoreCore):
    """``GraphStore`` on an embedded kuzu database in the folder ``path``."""

    name = "kuzu"

    def __init__(
        self, path: Path, buffer_pool_mb: int = 2048, max_db_size_mb: int | None = None
    ) -> None:
        # max_db_size_mb: kuzu's own default (8 TiB of address space) unless given
        self.kuzu = KuzuExecutor(Path(path), buffer_pool_mb, max_db_size_mb)
        super().__init__(self.kuzu, q, kuzu_search_queries)

    # ------------------------------------------------------------------ schema
    async def _declared_dim(self) -> int | None:
        dims = await self.kuzu.run(_declared_dims)
        return None if dims is None else dims.get("Entity.name_embedding")

    async def setup(self, embedding_dim: int) -> None:
        if embedding_dim < 1:
            raise ValueError("embedding_dim must be positive")
        await self.kuzu.run(self._setup, embedding_dim)
        self._dim = embedding_dim

    def _setup(self, db: KuzuDatabase, dim: int) -> None:
        declared = _declared_dims(db) or {}
        errors.check_dimensions(
            declared,
            dim,
            lambda name: f"the embedded store at {db.folder} ({name})",
            lambda _: "start a new store in another data folder and replay the episodes into it",
        )
        tables = _tables(db)
        for statement in q.schema(dim):
            db.rows(statement)
        if "Entity" in tables and "EntityLookupKey" not in tables:
            self._build_lookup_keys(db)  # a store made before the lookup table
        if "RELATES_TO.fact_embedding" in declared:
            for statement in q.LEGACY_FACT_INDEX:
                db.rows(statement)
        added = set()
        for table, columns in q.added_columns(dim).items():
            existing = _columns(db, table)
            for name, statement in columns:
                if name not in existing:
                    db.rows(statement)
                    added.add(f"{table}.{name}")
        new = {table for table in ("FactIndex", *q.VECTOR_TABLES) if table not in tables}
        backfills = {
            "FactIndex.fact": "FactIndex.fact" in added or "FactIndex" in new,
            **{table: table in new for table in q.VECTOR_TABLES},
        }
        for name, due in backfills.items():
            if due and "Entity" in tables:  # a store made before search
                db.rows(q.BACKFILL[name])
        present = {row["index_name"] for row in db.rows(q.SHOW_INDEXES)}
        for name, statement in q.INDEXES:
            if name not in present:
                db.rows(statement)
        for name, statement in q.DROPPED_INDEXES:
            if name in present:
                db.rows(statement)
        db.forget_statements()  # prepared before the schema changed

    @staticmethod
    def _build_lookup_keys(db: KuzuDatabase) -> None:
        uuids: dict[str, tuple[str, list[str]]] = {}
        for row in db.rows(q.ALL_ENTITY_NAMES):
            names = [row["name_norm"], *(row["aliases"] or [])]
            for row_id in lookup_key_ids(row["group_id"], row["key"], names):
                uuids.setdefault(row_id, (row["group_id"], []))[1].append(row["uuid"])
        rows = [{"id": i, "group_id": g, "uuids": sorted(u)} for i, (g, u) in uuids.items()]
        with db.transaction():
            for start in range(0, len(rows), 1000):
                db.rows(q.CREATE_LOOKUP_KEYS, {"rows": rows[start : start + 1000]})

    # ------------------------------------------------------------------ entities
    async def _entities_of(self, group_id: str, rows: list[Row]) -> list[EntityRecord]:
        uuids = [r["e"]["uuid"] for r in rows]
        params = {"group_id": group_id, "uuids": uuids}
        found = await self.ex.rows(q.COMMUNITIES, params) if uuids else []
        communities = {r["uuid"]: r["community_uuid"] for r in found}
        return sort_entities(entity_record(r["e"], communities.get(r["e"]["uuid"])) for r in rows)

    @staticmethod
    def _entity_rows(db: KuzuDatabase, group_id: str, uuids: list[str], query: str) -> list[Row]:
        """The group's entities of these uuids (``query``: ENTITY_BY_UUID or LOOKUP_BY_UUID),
        one primary-key lookup each."""
        rows = [row for uuid in unique(uuids) for row in db.rows(query, {"uuid": uuid})]
        return [row for row in rows if row["e"]["group_id"] == group_id]

    def _found_rows(
        self, db: KuzuDatabase, group_id: str, kind: str, values: list[str], query: str
    ) -> list[Row]:
        """The group's entities with one of these keys (``kind`` "key") or normalised names
        or aliases ("name"), through EntityLookupKey, each checked against what it holds."""
        wanted = set(values)
        uuids = [
            uuid
            for value in unique(values)
            for row in db.rows(q.LOOKUP_KEY, {"id": lookup_key_id(group_id, kind, value)})
            for uuid in row["uuids"] or []
        ]

        def matches(e: dict[str, Any]) -> bool:
            if kind == "key":
                return e["key"] in wanted
            return bool({normalize_name(e["name"]), *(e["aliases"] or [])} & wanted)

        return [r for r in self._entity_rows(db, group_id, uuids, query) if matches(r["e"])]

    async def _entities_found(self, group_id: str, kind: str, values: list[str]) -> list[Any]:
        if not values:
            return []
        found = self._found_rows
        rows = await self.kuzu.run(found, group_id, kind, unique(values), q.ENTITY_BY_UUID)
        return await self._entities_of(group_id, rows)

    async def entities_by_names(self, group_id: str, names: list[str]) -> list[EntityRecord]:
        return await self._entities_found(group_id, "name", names)

    async def entities_by_keys(self, group_id: str, keys: list[str]) -> list[EntityRecord]:
        return await self._entities_found(group_id, "key", keys)

    async def entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]:
        if not uuids:
            return []
        rows = await self.kuzu.run(self._entity_rows, group_id, uuids, q.ENTITY_BY_UUID)
        return await self._entities_of(group_id, rows)

    async def _lookup(self, group_id: str, ask: LookupRequest) -> EntityLookup:
        return await self.kuzu.run(self._lookup_on_thread, group_id, ask)

    def _lookup_on_thread(self, db: KuzuDatabase, group_id: str, ask: LookupRequest) -> Any:
        if ask.episode_uuid:
            params = {"group_id": group_id, "uuid": ask.episode_uuid}
            marker = db.rows(q.EPISODE_PROCESSED, params)
            if marker:
                errors.check_same_episode(
                    ask.episode_uuid, marker[0]["content_hash"], ask.content_hash
                )
                created = list(marker[0]["created_entities"] or [])
                return EntityLookup(processed=True, created_entities=created)

        def read(kind: str, values: list[str]) -> list[EntityRecord]:
            if not values:
                return []
            rows = self._found_rows(db, group_id, kind, values, q.LOOKUP_BY_UUID)
            return sort_entities(entity_record(row["e"]) for row in rows)

        lookup = EntityLookup(by_key=read("key", ask.keys), by_name=read("name", ask.names))
        if ask.relations is not None:
            rows: list[Row] = []
            of_source: dict[str, Any] = {"group_id": group_id, "relations": ask.relations}
            for source in unique(e.uuid for e in [*lookup.by_key, *lookup.by_name]):
                if ask.relations:
                    rows += db.rows(q.FACTS_OF_SOURCE, {**of_source, "uuid": source})
            lookup.facts = sort_facts({f.uuid: f for f in map(fact_of, rows)}.values())
        return lookup

    # ------------------------------------------------------------------ facts
    def _embedded(self, db: KuzuDatabase, group_id: str, facts: list[FactRecord]) -> list[Any]:
        index = fact_index(db, [f.uuid for f in facts])
        found = []
        for fact in facts:
            row = index.get(fact.uuid)
            if row is not None and row["group_id"] == group_id and row["embedding"] is not None:
                fact = fact.model_copy(update={"fact_embedding": list(row["embedding"])})
            found.append(fact)
        return found

    async def _with_fact_embeddings(
        self, group_id: str, facts: list[FactRecord]
    ) -> list[FactRecord]:
        return await self.kuzu.run(self._embedded, group_id, facts) if facts else facts

    async def _facts_by_uuids(self, group_id: str, uuids: list[str]) -> list[FactRecord]:
        return await self.kuzu.run(self._facts_on_thread, group_id, uuids)

    def _facts_on_thread(self, db: KuzuDatabase, group_id: str, uuids: list[str]) -> list[Any]:
        """The group's facts of these uuids, read from their FactIndex rows' sources."""
        index = {u: r for u, r in fact_index(db, uuids).items() if r["group_id"] == group_id}
        if not index:
            return []
        params = {
            "group_id": group_id,
            "uuids": list(index),
            "sources": unique(r["source_uuid"] for r in index.values()),
        }
        found = []
        for row in db.rows(q.FACTS_FROM_SOURCES, params):
            fact = fact_of(row)
            embedding = index[fact.uuid]["embedding"]
            embedding = None if embedding is None else list(embedding)
            found.append(fact.model_copy(update={"fact_embedding": embedding}))
        return found

    async def _fact_candidates(
        self, group_id: str, pairs: list[tuple[str, str]], ends: list[str], embeddings: bool
    ) -> list[FactRecord]:
        return await self.kuzu.run(self._candidates, group_id, pairs, ends, embeddings)

    def _candidates(
        self,
        db: KuzuDatabase,
        group_id: str,
        pairs: list[tuple[str, str]],
        ends: list[str],
        embeddings: bool,
    ) -> list[FactRecord]:
        rows: list[Row] = []
        for source, relation in pairs:
            params = {"group_id": group_id, "source": source, "relation": relation}
            rows += db.rows(q.FACT_CANDIDATES["pair"], params)
        for uuid in ends:
            for part in ("from", "to"):
                rows += db.rows(q.FACT_CANDIDATES[part], {"group_id": group_id, "uuid": uuid})
        facts = sort_facts({fact.uuid: fact for fact in map(fact_of, rows)}.values())
        return self._embedded(db, group_id, facts) if embeddings else facts

    # ------------------------------------------------------------------ writes
    async def upsert_entities(self, group_id: str, entities: list[EntityRecord]) -> None:
        if not entities:
            return
        dim = await self._embedding_dim()
        rows = [entity_row(group_id, e, dim, now_utc()) for e in entities]
        await self.kuzu.run_write("upsert_entities", len(rows), self._upsert, group_id, rows)

    def _upsert(self, db: KuzuDatabase, group_id: str, rows: list[dict[str, Any]]) -> None:
        with db.transaction():
            write_entities(db, group_id, rows)

    async def _upsert_communities(
        self, tx: Tx, group_id: str, rows: list[dict[str, Any]], stored: set[str]
    ) -> None:
        for row in rows:
            params = {"uuid": row["uuid"], "name": row["name"], "summary": row["summary"]}
            embedding = row["name_embedding"]
            if embedding is not None:
                vector_id = new_vector_id(row["uuid"])
                vector = {"id": vector_id, "group_id": group_id, "owner": row["uuid"]}
                await tx.rows(
                    q.CREATE_VECTOR["CommunityVector"], {**vector, "embedding": embedding}
                )
                params.update(name_embedding=embedding, vector_id=vector_id)
            if row["uuid"] in stored:
                old = await tx.rows(q.COMMUNITY_VECTOR_ID, {"uuid": row["uuid"]})
                query = q.UPDATE_COMMUNITY if embedding is None else q.UPDATE_COMMUNITY_EMBEDDED
                await tx.rows(query, params)
                if embedding is not None and old and old[0]["vector_id"] is not None:
                    delete = q.DELETE_VECTOR["CommunityVector"]
                    await tx.rows(delete, {"id": old[0]["vector_id"]})
            else:
                params.update(group_id=group_id, created_at=row["created_at"])
                query = q.CREATE_COMMUNITY if embedding is None else q.CREATE_COMMUNITY_EMBEDDED
                await tx.rows(query, params)
            stored.add(row["uuid"])

    async def _communities_deleted(self, tx: Tx, group_id: str, uuids: list[str]) -> None:
        await tx.rows(q.DROP_COMMUNITY_VECTORS, {"group_id": group_id, "uuids": uuids})

    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        [written] = await self.write_episodes(group_id, [write])
        return written

    async def write_episodes(self, group_id: str, writes: list[EpisodeWrite]) -> list[bool]:
        """One call on the store's thread for all of ``writes``, each written (and committed)
        as ``write_episode`` writes one; a checkpoint, if due, after the last."""
        dim = await self._embedding_dim()
        now = now_utc()
        batch = [(write, _write_params(group_id, write, dim, now)) for write in writes]
        size = sum(
            1 + len(w.entities) + len(w.mentions) + len(w.facts) + len(w.closures) for w in writes
        )
        return await self.kuzu.run_write(
            "write_episode", size, _write_in_order, group_id, batch, single=len(writes) == 1
        )


def _write_params(group_id: str, write: EpisodeWrite, dim: int, now: datetime) -> dict[str, Any]:
    return {
        "entities": [entity_row(group_id, e, dim, now) for e in write.entities],
        "episode": episode_row(group_id, write.episode, dim, now, write.created),
        "facts": [fact_row(group_id, f, dim, now) for f in write.facts],
        "closures": [closure_row(c) for c in write.closures],
    }


def _write_in_order(
    db: KuzuDatabase,
    group_id: str,
    batch: list[tuple[EpisodeWrite, dict[str, Any]]],
    *,
    single: bool,
) -> list[bool]:
    """Each write in turn (``kuzu_writes.write_episode``); the writes before a failing one
    stay committed (BatchWriteError says how many), as ``GraphStore.write_episodes`` allows."""
    written: list[bool] = []
    for write, params in batch:
        try:
            written.append(write_episode_on_thread(db, group_id, write, params))
        except Exception as exc:
            if single:
                raise
            raise BatchWriteError(written) from exc
    return written
