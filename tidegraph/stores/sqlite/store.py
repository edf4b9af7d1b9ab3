"""The embedded graph store: the whole ``GraphStore`` on one SQLite file (no server, nothing
to install: SQLite ships with Python). The default store, for trying tidegraph, for tests and
for feeds one machine holds (docs/operations.md "Embedded store"); Neo4j is the production store.

The same graph as Neo4j (the tables: ``sqlite_db``), the same rules (``store.rows`` builds
every write's parameters and every record read back, ``store.errors`` checks every write
before it changes anything, ``records.asof`` decides what a question believes), in SQL run on
the database's one thread (``sqlite_db.SqliteDatabase.run``): each method is one call there,
a write one transaction. Every statement is constant text; names, labels, relation types and
search words travel only as parameters (a fulltext search as quoted FTS5 strings,
``sqlite_db.fulltext_phrase``). This module is the write path (``GraphStore``), each method a
short function run on the database's thread; the store's other roles are classes of their
own over the same database, one module each (``search``, which reads on the database's read
connections, ``SqliteDatabase.read``; ``browse``, ``outbox``, ``forget``, ``communities``),
and its writes are in ``writes``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tidegraph.metrics import STORE_BATCH_SIZE
from tidegraph.records.graph import (
    EntityLookup,
    EntityRecord,
    EpisodeRecord,
    EpisodeWrite,
    FactRecord,
)
from tidegraph.settings import DEFAULT_TOPIC_PREFIX
from tidegraph.stores import errors
from tidegraph.stores.base import BatchRead, GraphStore, LookupRequest
from tidegraph.stores.executor import observe_write
from tidegraph.stores.rows import (
    check_embedding,
    sort_entities,
    sort_facts,
    unique,
)
from tidegraph.stores.sqlite.browse import SqliteBrowsing
from tidegraph.stores.sqlite.communities import SqliteCommunities
from tidegraph.stores.sqlite.db import (
    ADDED_COLUMNS,
    ADDED_INDEXES,
    DB_FILE,
    DROPPED,
    OUTBOX_INDEX,
    OUTBOX_RECORDS,
    OUTBOX_RECORDS_TABLE,
    OUTBOX_ROWS,
    SCHEMA,
    SCHEMA_VERSION,
    SqliteDatabase,
    Transaction,
    ids,
    json_list,
    json_text,
    micros,
    migrate_outbox,
    outbox_before_migration,
)
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.erasure import secure_fulltext
from tidegraph.stores.sqlite.forget import SqliteForgetting
from tidegraph.stores.sqlite.keys import SqliteKeys
from tidegraph.stores.sqlite.outbox import SqliteOutbox
from tidegraph.stores.sqlite.rows import (
    ENTITY,
    ENTITY_FULL,
    EPISODE,
    FACT,
    FACT_FULL,
    IN_LIST,
    entity_of,
    episode_of,
    fact_of,
)
from tidegraph.stores.sqlite.search import (
    EntityHits,
    SqliteSearch,
    entity_text_hits,
    entity_vector_hits,
)
from tidegraph.stores.sqlite.writes import (
    index_outbox_records,
    reindex_episodes,
    reindex_texts,
    write_episodes,
)

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- reads
def _entities(
    conn: sqlite3.Connection, group_id: str, where: str, param: Any, *, full: bool = True
) -> list[EntityRecord]:
    columns = ENTITY_FULL if full else ENTITY
    query = f"SELECT {columns} FROM entity e WHERE e.group_id = ? AND {where}"
    return sort_entities(map(entity_of, conn.execute(query, (group_id, param))))


def _by_uuids(conn: sqlite3.Connection, group_id: str, uuids: list[str]) -> list[EntityRecord]:
    # ``+``: found by uuid, not by reading the group's entities (the group index)
    query = f"SELECT {ENTITY_FULL} FROM entity e WHERE +e.group_id = ? AND e.uuid {IN_LIST}"
    return sort_entities(map(entity_of, conn.execute(query, (group_id, json_text(uuids)))))


def _by_names(
    conn: sqlite3.Connection, group_id: str, names: list[str], *, full: bool = True
) -> list[EntityRecord]:
    where = (
        f"e.uuid IN (SELECT n.uuid FROM entity_name n WHERE n.group_id = ? AND n.name {IN_LIST})"
    )
    columns = ENTITY_FULL if full else ENTITY
    query = f"SELECT {columns} FROM entity e WHERE +e.group_id = ? AND {where}"
    rows = conn.execute(query, (group_id, group_id, json_text(names)))
    return sort_entities(map(entity_of, rows))


def _by_keys(
    conn: sqlite3.Connection, group_id: str, keys: list[str], *, full: bool = True
) -> list[EntityRecord]:
    return _entities(conn, group_id, f"e.key {IN_LIST}", json_text(keys), full=full)


def _marker(
    conn: sqlite3.Connection, group_id: str, uuid: str, content_hash: str | None
) -> list[str] | None:
    row = conn.execute(
        "SELECT content_hash, created_entities FROM episode "
        "WHERE uuid = ? AND group_id = ? AND not_extracted IS NULL",
        (uuid, group_id),
    ).fetchone()
    if row is None:
        return None
    errors.check_same_episode(uuid, row[0], content_hash)
    return json_list(row[1])


def _markers(
    conn: sqlite3.Connection, group_id: str, episodes: list[tuple[str, str | None]]
) -> dict[str, list[str]]:
    if not episodes:
        return {}
    wanted = dict(episodes)
    query = (
        "SELECT uuid, content_hash, created_entities FROM episode "
        f"WHERE +group_id = ? AND not_extracted IS NULL AND uuid {IN_LIST}"
    )
    found: dict[str, list[str]] = {}
    for uuid, stored_hash, created in conn.execute(query, (group_id, json_text(wanted))):
        errors.check_same_episode(uuid, stored_hash, wanted[uuid])
        found[uuid] = json_list(created)
    return {uuid: found[uuid] for uuid in wanted if uuid in found}


def _fact_candidates(
    conn: sqlite3.Connection,
    group_id: str,
    pairs: Sequence[tuple[str, str]],
    ends: Sequence[str],
    embeddings: bool,
    facts_from: datetime | None = None,
) -> list[FactRecord]:
    """``facts_from``: of the pairs' facts, those that ended before it are left out
    (``FactRecord.ended_before``)."""
    columns = FACT_FULL if embeddings else FACT
    found: dict[str, FactRecord] = {}
    if pairs:  # by the (group, source, relation) index, the exact pairs kept
        wanted = set(pairs)
        query = (
            f"SELECT {columns} FROM fact f WHERE f.group_id = ? "
            f"AND f.source_uuid {IN_LIST} AND f.name {IN_LIST}"
        )
        sources, relations = unique(s for s, _ in pairs), unique(r for _, r in pairs)
        params: tuple[Any, ...] = (group_id, json_text(sources), json_text(relations))
        if facts_from is not None:
            query += " AND (f.invalid_at IS NULL OR f.invalid_at >= ?)"
            params += (micros(facts_from),)
        for row in conn.execute(query, params):
            if (row["source_uuid"], row["name"]) in wanted:
                found.setdefault(row["uuid"], fact_of(row))
    if ends:
        param = json_text(ends)
        for end in ("source_uuid", "target_uuid"):
            query = f"SELECT {columns} FROM fact f WHERE f.group_id = ? AND f.{end} {IN_LIST}"
            for row in conn.execute(query, (group_id, param)):
                found.setdefault(row["uuid"], fact_of(row))
    return sort_facts(found.values())


def _lookup(
    conn: sqlite3.Connection,
    group_id: str,
    ask: LookupRequest,
    facts_from: datetime | None = None,
) -> EntityLookup:
    if ask.episode_uuid:
        created = _marker(conn, group_id, ask.episode_uuid, ask.content_hash)
        if created is not None:
            return EntityLookup(processed=True, created_entities=created)
    by_key = _by_keys(conn, group_id, ask.keys, full=False) if ask.keys else []
    by_name = _by_names(conn, group_id, ask.names, full=False) if ask.names else []
    lookup = EntityLookup(by_key=by_key, by_name=by_name)
    if ask.relations is not None:
        sources = sorted({e.uuid for e in [*by_key, *by_name]})
        pairs = [(source, relation) for source in sources for relation in ask.relations]
        lookup.facts = (
            _fact_candidates(conn, group_id, pairs, [], False, facts_from) if pairs else []
        )
    return lookup


# ----------------------------------------------------------------------------- writes
# ----------------------------------------------------------------------------- the store
class SqliteStore(GraphStore):
    """``GraphStore`` on the SQLite file ``DB_FILE`` in the folder ``path``."""

    name = "sqlite"

    def __init__(
        self, path: Path, cache_mb: int = 128, *, deployment: str = DEFAULT_TOPIC_PREFIX
    ) -> None:
        self.db = SqliteDatabase(Path(path), cache_mb)
        self.deployment = deployment
        self.outbox = SqliteOutbox(self)
        self.forget = SqliteForgetting(self)
        self.keys = SqliteKeys(self)
        self.browse = SqliteBrowsing(self)
        self.search = SqliteSearch(self)
        self.communities = SqliteCommunities(self)
        self._dim: int | None = None

    # ------------------------------------------------------------------ lifecycle
    async def setup(self, embedding_dim: int, embedding_model: str | None = None) -> None:
        if embedding_dim < 1:
            raise ValueError("embedding_dim must be positive")
        legacy = self.db.folder / "graph.kuzu"
        if legacy.exists():
            log.warning(
                "%s is an embedded store of an earlier tidegraph (kuzu), which this version no "
                "longer reads; the graph is now kept in %s. Replay the episodes into it "
                "(tidegraph ingest) and remove the old file.",
                legacy,
                self.db.folder / DB_FILE,
            )
        await self.db.run(self._setup, embedding_dim)
        self._dim = embedding_dim
        await self._check_model(embedding_model)

    async def open_existing(self, embedding_dim: int, embedding_model: str | None = None) -> bool:
        if not self.db.path.is_file():
            return False  # never written: opening the file would create it
        stored = await self.db.run(_stored_dimension)
        if stored is None:
            return False
        errors.check_dimensions(
            {"embeddings": stored},
            embedding_dim,
            lambda _: f"the embedded store at {self.db.path}",
            lambda _: "read it with the embedder it was written with (TIDEGRAPH_EMBEDDER)",
        )
        self._dim = embedding_dim
        await self._check_model(embedding_model)
        return True

    async def _check_model(self, model_name: str | None) -> None:
        if model_name is None:
            return
        stored = await self.db.run(_recorded_model, model_name)
        if stored != model_name:
            raise errors.StoreSchemaError(
                f"the embedded store at {self.db.path} holds embeddings of {stored} but the "
                f"embedder is {model_name}: their vectors cannot be compared. Either configure "
                "the embedder that made the stored graph (TIDEGRAPH_EMBEDDER), or start a new "
                "store in another data folder and replay the episodes into it with this "
                "embedder (docs/retrieval.md, Embedders)"
            )

    def _setup(self, conn: sqlite3.Connection, dim: int) -> None:
        with Transaction(conn):
            outbox_moves = outbox_before_migration(conn)
            for statement in SCHEMA:
                conn.execute(statement)
            if outbox_moves:
                moved = migrate_outbox(conn)
                log.info("migrated %s: %d outbox changes into a rowid table", self.db.path, moved)
            for table, columns in ADDED_COLUMNS.items():
                have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
                for column in columns:
                    if column.split()[0] not in have:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
            for statement in ADDED_INDEXES:
                conn.execute(statement)
            meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
            if meta.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
                indexed = reindex_episodes(conn)
                texts = reindex_texts(conn)
                log.info(
                    "migrated %s: %d episodes, %d facts and entities indexed for search",
                    self.db.path,
                    indexed,
                    texts,
                )
            if not conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (OUTBOX_INDEX,)
            ).fetchone():
                for statement in OUTBOX_ROWS:
                    conn.execute(statement)
            if not conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (OUTBOX_RECORDS,)
            ).fetchone():
                conn.execute(OUTBOX_RECORDS_TABLE)
                if indexed := index_outbox_records(conn):
                    log.info("%s: %d outbox rows indexed by record", self.db.path, indexed)
            for statement in DROPPED:
                conn.execute(statement)
            secured = secure_fulltext(conn)
            if secured and "schema_version" in meta:
                log.info("%s: fulltext indexes %s now delete securely", self.db.path, secured)
            if "embedding_dim" in meta:
                errors.check_dimensions(
                    {"embeddings": int(meta["embedding_dim"])},
                    dim,
                    lambda _: f"the embedded store at {self.db.path}",
                    lambda _: (
                        "start a new store in another data folder and replay the episodes into it"
                    ),
                )
            conn.executemany(
                "INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)",
                [("embedding_dim", str(dim)), ("schema_version", SCHEMA_VERSION)],
            )

    async def close(self) -> None:
        await self.db.close()

    def _dimension(self) -> int:
        if self._dim is None:
            raise errors.StoreSchemaError("the embedded store has no schema: run setup() first")
        return self._dim

    # ------------------------------------------------------------------ episodes
    async def _episode_marker(
        self, group_id: str, episode_uuid: str, content_hash: str | None = None
    ) -> list[str] | None:
        return await self.db.run(_marker, group_id, episode_uuid, content_hash)

    async def episode_markers(
        self, group_id: str, episodes: list[tuple[str, str | None]]
    ) -> dict[str, list[str]]:
        return await self.db.run(_markers, group_id, episodes)

    async def read_batch(
        self,
        group_id: str,
        keys: list[str],
        names: list[str],
        relations: list[str],
        episodes: list[tuple[str, str | None]],
        facts_from: datetime | None = None,
    ) -> BatchRead:
        ask = LookupRequest(unique(keys), unique(names), None, None, unique(relations))

        def read(conn: sqlite3.Connection) -> BatchRead:
            lookup = _lookup(conn, group_id, ask, facts_from)
            return BatchRead(lookup, _markers(conn, group_id, episodes))

        return await self.db.run(read)

    async def episode_status(self, group_id: str, episode_uuid: str) -> str:
        return (await self.episode_statuses(group_id, [episode_uuid]))[episode_uuid]

    async def episode_statuses(self, group_id: str, episode_uuids: list[str]) -> dict[str, str]:
        def read(conn: sqlite3.Connection) -> dict[str, str]:
            query = (
                "SELECT uuid, CASE WHEN forgotten_at IS NOT NULL THEN 'forgotten' "
                "WHEN not_extracted IS NOT NULL THEN 'not_extracted' ELSE 'processed' END "
                f"FROM episode WHERE +group_id = ? AND uuid {IN_LIST}"
            )
            found = dict(conn.execute(query, (group_id, json_text(episode_uuids))).fetchall())
            return {uuid: found.get(uuid, "missing") for uuid in episode_uuids}

        return await self.db.run(read)

    async def pending_episodes(self, group_id: str, limit: int) -> list[EpisodeRecord]:
        def read(conn: sqlite3.Connection) -> list[EpisodeRecord]:
            query = (
                f"SELECT {EPISODE}, ep.content_embedding FROM episode ep "
                "WHERE ep.group_id = ? AND ep.not_extracted IS NOT NULL "
                "ORDER BY ep.valid_at, ep.producer_id LIMIT ?"
            )
            return list(map(episode_of, conn.execute(query, (group_id, max(limit, 0)))))

        return await self.db.run(read)

    async def pending_groups(self) -> list[str]:
        query = "SELECT DISTINCT group_id FROM episode WHERE not_extracted IS NOT NULL ORDER BY 1"
        return await self.db.run(ids, query)

    async def recent_episodes(
        self, group_id: str, before: datetime, limit: int
    ) -> list[EpisodeRecord]:
        def read(conn: sqlite3.Connection) -> list[EpisodeRecord]:
            query = (
                f"SELECT {EPISODE}, ep.content_embedding FROM episode ep "
                "WHERE ep.group_id = ? AND ep.valid_at < ? AND ep.forgotten_at IS NULL "
                "ORDER BY ep.valid_at DESC, ep.uuid DESC LIMIT ?"
            )
            rows = conn.execute(query, (group_id, micros(before), max(limit, 0)))
            return list(map(episode_of, rows))[::-1]

        return await self.db.run(read)

    # ------------------------------------------------------------------ entities
    def _vector(self, embedding: Sequence[float]) -> list[float] | None:
        return check_embedding(embedding, self._dimension(), "query embedding")

    async def fulltext_entities(
        self, group_id: str, text: str, limit: int
    ) -> list[tuple[EntityRecord, float]]:
        return await self.db.run(entity_text_hits, group_id, text, limit)

    async def vector_entities(
        self, group_id: str, embedding: list[float], limit: int
    ) -> list[tuple[EntityRecord, float]]:
        return await self.db.run(entity_vector_hits, group_id, self._vector(embedding), limit)

    async def entity_candidates(
        self, group_id: str, searches: list[tuple[str, list[float]]], limit: int
    ) -> list[tuple[list[tuple[EntityRecord, float]], list[tuple[EntityRecord, float]]]]:
        """Every search in one call on the database's thread."""
        vectors = [self._vector(embedding) for _, embedding in searches]

        def read(conn: sqlite3.Connection) -> list[tuple[EntityHits, EntityHits]]:
            return [
                (
                    entity_vector_hits(conn, group_id, vector, limit),
                    entity_text_hits(conn, group_id, name, limit),
                )
                for (name, _), vector in zip(searches, vectors, strict=True)
            ]

        return await self.db.run(read)

    async def entities_by_names(self, group_id: str, names: list[str]) -> list[EntityRecord]:
        return await self.db.run(_by_names, group_id, names) if names else []

    async def entities_by_keys(self, group_id: str, keys: list[str]) -> list[EntityRecord]:
        return await self.db.run(_by_keys, group_id, keys) if keys else []

    async def entities_by_key_prefix(self, group_id: str, prefix: str) -> list[EntityRecord]:
        # substr, not LIKE: a key's own % and _ are no wildcards (?2: the prefix, each time).
        where = "e.key >= ?2 AND substr(e.key, 1, length(?2)) = ?2"
        return await self.db.run(_entities, group_id, where, prefix)

    async def entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]:
        if not uuids:
            return []
        return await self.db.run(_by_uuids, group_id, uuids)

    async def _lookup(self, group_id: str, ask: LookupRequest) -> EntityLookup:
        return await self.db.run(_lookup, group_id, ask)

    # ------------------------------------------------------------------ facts
    async def facts_touching(self, group_id: str, entity_uuids: list[str]) -> list[FactRecord]:
        if not entity_uuids:
            return []
        return await self.db.run(_fact_candidates, group_id, [], unique(entity_uuids), True)

    async def _fact_candidates(
        self, group_id: str, pairs: list[tuple[str, str]], ends: list[str], embeddings: bool
    ) -> list[FactRecord]:
        return await self.db.run(_fact_candidates, group_id, pairs, ends, embeddings)

    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        [written] = await self.write_episodes(group_id, [write])
        return written

    async def write_episodes(self, group_id: str, writes: list[EpisodeWrite]) -> list[bool]:
        """One transaction; a write that fails is rolled back alone and ends the batch: the
        ones before it are committed (BatchWriteError says which)."""
        if not writes:
            return []
        dim = self._dimension()
        STORE_BATCH_SIZE.labels("episodes_per_transaction").observe(len(writes))
        rows = sum(1 + len(w.entities) + len(w.facts) + len(w.closures) for w in writes)
        with observe_write("write_episode", rows):
            return await self.db.run(write_episodes, group_id, writes, dim, self.deployment)

    # ------------------------------------------------------------------ maintenance

    # ------------------------------------------------------------------ browsing

    # ------------------------------------------------------------------ the change stream

    # ------------------------------------------------------------------ forgetting


def _recorded_model(conn: sqlite3.Connection, model_name: str) -> str:
    """The embedding model the store records (``model_name`` is recorded when it records
    none: a store written before models were recorded, or a new one)."""
    with Transaction(conn):
        row = conn.execute("SELECT value FROM meta WHERE name = 'embedding_model'").fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO meta (name, value) VALUES ('embedding_model', ?)", (model_name,)
            )
            return model_name
        return str(row[0])


def _stored_dimension(conn: sqlite3.Connection) -> int | None:
    """The embedding dimension the file was set up with (None: no schema in it)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE name = 'embedding_dim'").fetchone()
    except sqlite3.OperationalError:  # no meta table: not a tidegraph store (yet)
        return None
    return None if row is None else int(row[0])
