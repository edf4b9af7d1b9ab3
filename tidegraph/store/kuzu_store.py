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
  RELATES_TO; fact vector search is an exact cosine scan of the group's rows;
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
write) run as one function on the executor's thread (``KuzuExecutor.run``), the others as
the shared core's queries. One process at a time may open the folder (kuzu locks it).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tidegraph.records.graph import EntityLookup, EntityRecord, EpisodeWrite, FactRecord
from tidegraph.records.ids import normalize_name
from tidegraph.store import errors
from tidegraph.store import kuzu_queries as q
from tidegraph.store.base import LookupRequest
from tidegraph.store.core import StoreCore, fact_of
from tidegraph.store.executor import Row, Tx
from tidegraph.store.kuzu_executor import KuzuDatabase, KuzuExecutor
from tidegraph.store.rows import (
    EntityState,
    closure_row,
    entity_record,
    entity_row,
    episode_row,
    fact_row,
    fold_entity_rows,
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
    ("RELATES_TO", "fact_embedding"),
)


def lookup_key_id(group_id: str, kind: str, value: str) -> str:
    """The EntityLookupKey id of a key (``kind`` "key") or a normalised name ("name")."""
    return "\x1f".join((group_id, kind, value))


def lookup_key_ids(group_id: str, key: str | None, names: list[str]) -> list[str]:
    """The id of every lookup row an entity with this key and these names belongs to."""
    ids = [lookup_key_id(group_id, "name", n) for n in unique(n for n in names if n)]
    return ([lookup_key_id(group_id, "key", key)] if key else []) + ids


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
        super().__init__(self.kuzu, q)

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
        for table, added in q.ADDED_COLUMNS.items():
            columns = _columns(db, table)
            for name, statement in added:
                if name not in columns:
                    db.rows(statement)
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
    @staticmethod
    def _fact_index(db: KuzuDatabase, uuids: list[str]) -> dict[str, Row]:
        """The FactIndex rows of these facts (one primary-key lookup each: kuzu plans
        ``uuid IN [...]`` as a scan of the whole table)."""
        return {uuid: row for uuid in uuids for row in db.rows(q.FACT_INDEX_ROW, {"uuid": uuid})}

    def _embedded(self, db: KuzuDatabase, group_id: str, facts: list[FactRecord]) -> list[Any]:
        index = self._fact_index(db, [f.uuid for f in facts])
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
        """The group's facts of these uuids, each from its FactIndex row's source."""
        found = []
        for uuid, index in self._fact_index(db, uuids).items():
            if index["group_id"] != group_id:
                continue
            params = {"group_id": group_id, "uuid": uuid, "source_uuid": index["source_uuid"]}
            for row in db.rows(q.FACT_FROM_SOURCE, params):
                embedding = None if index["embedding"] is None else list(index["embedding"])
                found.append(fact_of(row).model_copy(update={"fact_embedding": embedding}))
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
            self._write_entities(db, group_id, rows)

    @staticmethod
    def _write_entities(db: KuzuDatabase, group_id: str, rows: list[dict[str, Any]]) -> None:
        """The upsert's statements (``entity_row`` rows), inside the caller's transaction."""
        stored = {
            uuid: found
            for uuid in unique(r["uuid"] for r in rows)
            for found in db.rows(q.ENTITY_STATE, {"uuid": uuid})
        }
        errors.check_entity_owners(group_id, {u: row["group_id"] for u, row in stored.items()})
        states = {
            uuid: EntityState(
                list(r["labels"] or []), list(r["aliases"] or []), r["summary"] or "", r["key"]
            )
            for uuid, r in stored.items()
        }
        creates, updates = fold_entity_rows(rows, states)
        for row in creates:
            fields = ("uuid", "name", "name_norm", "labels", "summary", "key", "aliases")
            params = {"group_id": group_id, "created_at": row["created_at"]}
            params.update({name: row[name] for name in fields})
            if row["name_embedding"] is None:
                db.rows(q.CREATE_ENTITY, params)
            else:
                db.rows(
                    q.CREATE_ENTITY_EMBEDDED, {**params, "name_embedding": row["name_embedding"]}
                )
        if updates:
            db.rows(
                q.UPDATE_ENTITIES, {"rows": [{"uuid": u, **vars(s)} for u, s in updates.items()]}
            )
        # The lookup rows of every key, name and alias the write added.
        added: list[tuple[str, str]] = []
        for row in creates:
            names = [row["name_norm"], *row["aliases"]]
            added += [(row["uuid"], i) for i in lookup_key_ids(group_id, row["key"], names)]
        for uuid, state in updates.items():
            before = states[uuid]
            key = state.key if state.key != before.key else None
            new_aliases = [a for a in state.aliases if a not in before.aliases]
            added += [(uuid, i) for i in lookup_key_ids(group_id, key, new_aliases)]
        for uuid, row_id in added:
            db.rows(q.ADD_LOOKUP_KEY, {"id": row_id, "group_id": group_id, "uuid": uuid})

    async def _upsert_communities(
        self, tx: Tx, group_id: str, rows: list[dict[str, Any]], stored: set[str]
    ) -> None:
        for row in rows:
            params = {"uuid": row["uuid"], "name": row["name"], "summary": row["summary"]}
            embedding = row["name_embedding"]
            if row["uuid"] in stored:
                query = q.UPDATE_COMMUNITY if embedding is None else q.UPDATE_COMMUNITY_EMBEDDED
            else:
                params["group_id"] = group_id
                query = q.CREATE_COMMUNITY if embedding is None else q.CREATE_COMMUNITY_EMBEDDED
            if embedding is not None:
                params["name_embedding"] = embedding
            await tx.rows(query, params)
            stored.add(row["uuid"])

    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        dim = await self._embedding_dim()
        now = now_utc()
        params = {
            "entities": [entity_row(group_id, e, dim, now) for e in write.entities],
            "episode": episode_row(group_id, write.episode, now, write.created),
            "facts": [fact_row(group_id, f, dim, now) for f in write.facts],
            "closures": [closure_row(c) for c in write.closures],
        }
        size = 1 + len(write.entities) + len(write.mentions) + len(write.facts)
        size += len(write.closures)
        return await self.kuzu.run_write(
            "write_episode", size, self._write_episode, group_id, write, params
        )

    def _write_episode(
        self, db: KuzuDatabase, group_id: str, write: EpisodeWrite, params: dict[str, Any]
    ) -> bool:
        stored = db.rows(q.EPISODE_GROUP, {"uuid": write.episode.uuid})
        episode_group = stored[0]["group_id"] if stored else None
        if stored and errors.skips_write(
            group_id,
            write,
            episode_group,
            stored[0]["content_hash"],
            stored[0]["not_extracted"],
        ):
            return False  # already processed: nothing may change (see GraphStore)
        # Checked before anything is written: the entities go in a transaction of their own,
        # committed first, because inside one transaction kuzu 0.11.3 finds the wrong node by
        # primary key (`uuid IN [...]`) once nodes were created in it, and may crash. Nothing
        # else runs in between (one call at a time).
        _, entity_uuids = errors.written_entity_uuids(write)
        owners = {
            uuid: row["group_id"]
            for uuid in entity_uuids
            for row in db.rows(q.ENTITY_GROUP, {"uuid": uuid})
        }
        facts = {
            uuid: errors.StoredFact(row["group_id"], row["source_uuid"], row["target_uuid"])
            for uuid, row in self._fact_index(db, errors.written_fact_uuids(write)).items()
        }
        errors.check_write(group_id, write, episode_group, owners, facts)
        if params["entities"]:
            with db.transaction():
                self._write_entities(db, group_id, params["entities"])
        episode = params["episode"]
        with db.transaction():
            db.rows(q.MERGE_EPISODE, {"group_id": group_id, **episode})
            for entity_uuid in unique(write.mentions):
                mention = {"episode_uuid": episode["uuid"], "entity_uuid": entity_uuid}
                db.rows(q.CREATE_MENTION, {"group_id": group_id, **mention})
            for row in params["facts"]:
                self._write_fact(db, group_id, row, row["uuid"] in facts)
                facts[row["uuid"]] = errors.StoredFact(
                    group_id, row["source_uuid"], row["target_uuid"]
                )
            for row in params["closures"]:
                ends = facts[row["uuid"]]  # checked: written or stored in the group
                db.rows(
                    q.CLOSE_FACT,
                    {
                        **row,
                        "group_id": group_id,
                        "source_uuid": ends.source_uuid,
                        "target_uuid": ends.target_uuid,
                    },
                )
        return True

    @staticmethod
    def _write_fact(db: KuzuDatabase, group_id: str, row: dict[str, Any], stored: bool) -> None:
        params = {"group_id": group_id, **row}
        embedding = params.pop("fact_embedding")
        if stored:
            del params["group_id"], params["created_at"]
            db.rows(q.UPDATE_FACT, params)
            if embedding is not None:
                db.rows(q.SET_FACT_EMBEDDING, {"uuid": row["uuid"], "embedding": embedding})
            return
        db.rows(q.CREATE_FACT, params)
        index = {name: row[name] for name in ("uuid", "source_uuid", "target_uuid")}
        index["group_id"] = group_id
        if embedding is None:
            db.rows(q.CREATE_FACT_INDEX_ROW, index)
        else:
            db.rows(q.CREATE_FACT_INDEX_ROW_EMBEDDED, {**index, "embedding": embedding})
