"""The embedded graph store: the whole ``GraphStore`` on one SQLite file (no server, nothing
to install: SQLite ships with Python). The default store, for trying tidegraph, for tests and
for feeds one machine holds (docs/operations.md "Embedded store"); Neo4j is the production store.

The same graph as Neo4j (the tables: ``sqlite_db``), the same rules (``store.rows`` builds
every write's parameters and every record read back, ``store.errors`` checks every write
before it changes anything, ``records.asof`` decides what a question believes), in SQL run on
the database's one thread (``sqlite_db.SqliteDatabase.run``): each method is one call there,
a write one transaction. Every statement is constant text; names, labels, relation types and
search words travel only as parameters (a fulltext search as quoted FTS5 strings,
``sqlite_db.fulltext_phrase``). The search methods are in ``sqlite_search``.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tidegraph.metrics import STORE_BATCH_SIZE
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
from tidegraph.stores import errors
from tidegraph.stores.base import BatchRead, BatchWriteError, LookupRequest
from tidegraph.stores.executor import observe_write
from tidegraph.stores.rows import (
    EntityState,
    closure_row,
    community_rows,
    entity_row,
    episode_row,
    fact_row,
    fact_view,
    fold_communities,
    fold_edges,
    fold_entity_rows,
    neighbour_weights_of,
    now_utc,
    sort_entities,
    sort_facts,
    sort_views,
    unique,
)
from tidegraph.stores.sqlite.db import (
    DB_FILE,
    SCHEMA,
    SCHEMA_VERSION,
    SqliteDatabase,
    Transaction,
    ids,
    json_list,
    json_text,
    micros,
    micros_list,
    vector_blob,
)
from tidegraph.stores.sqlite.rows import (
    COMMUNITY_OF,
    ENTITY,
    ENTITY_FULL,
    EPISODE,
    FACT,
    FACT_FULL,
    IN_LIST,
    believed_facts,
    entity_of,
    episode_of,
    fact_of,
    names_of,
    producers_of,
)
from tidegraph.stores.sqlite.search import GroupVectors, SqliteSearch

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- reads
def _entities(
    conn: sqlite3.Connection, group_id: str, where: str, param: Any, *, full: bool = True
) -> list[EntityRecord]:
    columns = ENTITY_FULL if full else ENTITY
    query = f"SELECT {columns} FROM entity e WHERE e.group_id = ? AND {where}"
    return sort_entities(map(entity_of, conn.execute(query, (group_id, param))))


def _by_names(
    conn: sqlite3.Connection, group_id: str, names: list[str], *, full: bool = True
) -> list[EntityRecord]:
    where = (
        f"e.uuid IN (SELECT n.uuid FROM entity_name n WHERE n.group_id = ? AND n.name {IN_LIST})"
    )
    columns = ENTITY_FULL if full else ENTITY
    query = f"SELECT {columns} FROM entity e WHERE e.group_id = ? AND {where}"
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
        f"WHERE group_id = ? AND not_extracted IS NULL AND uuid {IN_LIST}"
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
) -> list[FactRecord]:
    columns = FACT_FULL if embeddings else FACT
    found: dict[str, FactRecord] = {}
    if pairs:  # by the (group, source, relation) index, the exact pairs kept
        wanted = set(pairs)
        query = (
            f"SELECT {columns} FROM fact f WHERE f.group_id = ? "
            f"AND f.source_uuid {IN_LIST} AND f.name {IN_LIST}"
        )
        sources, relations = unique(s for s, _ in pairs), unique(r for _, r in pairs)
        for row in conn.execute(query, (group_id, json_text(sources), json_text(relations))):
            if (row["source_uuid"], row["name"]) in wanted:
                found.setdefault(row["uuid"], fact_of(row))
    if ends:
        param = json_text(ends)
        for end in ("source_uuid", "target_uuid"):
            query = f"SELECT {columns} FROM fact f WHERE f.group_id = ? AND f.{end} {IN_LIST}"
            for row in conn.execute(query, (group_id, param)):
                found.setdefault(row["uuid"], fact_of(row))
    return sort_facts(found.values())


def _lookup(conn: sqlite3.Connection, group_id: str, ask: LookupRequest) -> EntityLookup:
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
        lookup.facts = _fact_candidates(conn, group_id, pairs, [], False) if pairs else []
    return lookup


# ----------------------------------------------------------------------------- writes
def _index_text(
    conn: sqlite3.Connection, table: str, row_id: int, group_id: str, text: str
) -> None:
    """(Re)index one record's text in the fulltext table ``table`` (a constant)."""
    conn.execute(f"DELETE FROM {table} WHERE rowid = ?", (row_id,))
    conn.execute(
        f"INSERT INTO {table} (rowid, group_id, text) VALUES (?, ?, ?)", (row_id, group_id, text)
    )


def _entity_text(name: str, summary: str | None) -> str:
    return f"{name} {summary or ''}".strip()


def _owners(conn: sqlite3.Connection, uuids: Sequence[str]) -> dict[str, str]:
    query = f"SELECT uuid, group_id FROM entity WHERE uuid {IN_LIST}"
    return dict(conn.execute(query, (json_text(uuids),)).fetchall())


def _upsert_entities(conn: sqlite3.Connection, group_id: str, rows: list[dict[str, Any]]) -> None:
    """Entity rows (``rows.entity_row``) applied as a sequence of MERGEs (checked before)."""
    if not rows:
        return
    query = f"SELECT id, uuid, name, labels, aliases, summary, key FROM entity WHERE uuid {IN_LIST}"
    stored_rows = conn.execute(query, (json_text(unique(r["uuid"] for r in rows)),)).fetchall()
    stored = {
        r["uuid"]: EntityState(
            json_list(r["labels"]), json_list(r["aliases"]), r["summary"] or "", r["key"]
        )
        for r in stored_rows
    }
    row_ids = {r["uuid"]: (r["id"], r["name"]) for r in stored_rows}
    creates, updates = fold_entity_rows(rows, stored)
    for row in creates:
        [row_id] = conn.execute(
            "INSERT INTO entity (uuid, group_id, name, labels, summary, key, aliases, "
            "name_embedding, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (
                row["uuid"],
                group_id,
                row["name"],
                json_text(row["labels"]),
                row["summary"] or None,
                row["key"],
                json_text(row["aliases"]),
                vector_blob(row["name_embedding"]),
                micros(row["created_at"]),
            ),
        ).fetchone()
        _index_text(
            conn, "entity_text", row_id, group_id, _entity_text(row["name"], row["summary"])
        )
        names = unique([row["name_norm"], *row["aliases"]])
        conn.executemany(
            "INSERT OR IGNORE INTO entity_name (group_id, name, uuid) VALUES (?, ?, ?)",
            [(group_id, name, row["uuid"]) for name in names],
        )
    for uuid, state in updates.items():
        before = stored[uuid]
        if vars(state) == vars(before):
            continue
        conn.execute(
            "UPDATE entity SET labels = ?, aliases = ?, summary = ?, key = ? WHERE uuid = ?",
            (
                json_text(state.labels),
                json_text(state.aliases),
                state.summary or None,
                state.key,
                uuid,
            ),
        )
        if state.summary != before.summary:
            row_id, name = row_ids[uuid]
            _index_text(conn, "entity_text", row_id, group_id, _entity_text(name, state.summary))
        added = [a for a in state.aliases if a not in before.aliases]
        conn.executemany(
            "INSERT OR IGNORE INTO entity_name (group_id, name, uuid) VALUES (?, ?, ?)",
            [(group_id, alias, uuid) for alias in added],
        )


_MERGE_FACT = """
INSERT INTO fact (uuid, group_id, source_uuid, target_uuid, name, fact, fact_embedding, episodes,
                  valid_at, invalid_at, created_at, expired_at, cardinality, prior_ends,
                  prior_ends_learned_at, end_learned_at, prior_starts, prior_starts_learned_at,
                  start_learned_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (uuid) DO UPDATE SET
  name = excluded.name,
  fact = excluded.fact,
  fact_embedding = coalesce(excluded.fact_embedding, fact.fact_embedding),
  episodes = excluded.episodes,
  valid_at = excluded.valid_at,
  invalid_at = excluded.invalid_at,
  cardinality = excluded.cardinality,
  prior_ends = coalesce(excluded.prior_ends, fact.prior_ends),
  prior_ends_learned_at = coalesce(excluded.prior_ends_learned_at, fact.prior_ends_learned_at),
  end_learned_at = coalesce(excluded.end_learned_at, fact.end_learned_at),
  prior_starts = coalesce(excluded.prior_starts, fact.prior_starts),
  prior_starts_learned_at =
    coalesce(excluded.prior_starts_learned_at, fact.prior_starts_learned_at),
  start_learned_at = coalesce(excluded.start_learned_at, fact.start_learned_at),
  expired_at = coalesce(fact.expired_at, excluded.expired_at)
RETURNING id
"""

_CLOSE_FACT = """
UPDATE fact SET
  invalid_at = ?,
  prior_ends = coalesce(?, prior_ends),
  prior_ends_learned_at = coalesce(?, prior_ends_learned_at),
  end_learned_at = coalesce(?, end_learned_at),
  expired_at = coalesce(expired_at, ?)
WHERE uuid = ? AND group_id = ?
"""

_MERGE_EPISODE = """
INSERT INTO episode (uuid, group_id, name, source, source_description, content, valid_at,
                     created_at, producer_id, content_hash, created_entities, not_extracted,
                     content_embedding)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (uuid) DO UPDATE SET
  name = excluded.name,
  source = excluded.source,
  source_description = excluded.source_description,
  content = excluded.content,
  valid_at = excluded.valid_at,
  producer_id = excluded.producer_id,
  content_hash = excluded.content_hash,
  created_entities = excluded.created_entities,
  not_extracted = excluded.not_extracted,
  content_embedding = excluded.content_embedding
RETURNING id
"""


def _merge_fact(
    conn: sqlite3.Connection, group_id: str, row: dict[str, Any], text: str | None
) -> None:
    """MERGE one fact row (``rows.fact_row``); ``text``: its stored sentence (None: new)."""
    [row_id] = conn.execute(
        _MERGE_FACT,
        (
            row["uuid"],
            group_id,
            row["source_uuid"],
            row["target_uuid"],
            row["name"],
            row["fact"],
            vector_blob(row["fact_embedding"]),
            json_text(row["episodes"]),
            micros(row["valid_at"]),
            micros(row["invalid_at"]),
            micros(row["created_at"]),
            micros(row["expired_at"]),
            row["cardinality"],
            micros_list(row["prior_ends"]),
            micros_list(row["prior_ends_learned_at"]),
            micros(row["end_learned_at"]),
            micros_list(row["prior_starts"]),
            micros_list(row["prior_starts_learned_at"]),
            micros(row["start_learned_at"]),
        ),
    ).fetchone()
    if text != row["fact"]:
        _index_text(conn, "fact_text", row_id, group_id, row["fact"])


def _close_fact(conn: sqlite3.Connection, group_id: str, row: dict[str, Any]) -> None:
    conn.execute(
        _CLOSE_FACT,
        (
            micros(row["invalid_at"]),
            micros_list(row["prior_ends"]),
            micros_list(row["prior_ends_learned_at"]),
            micros(row["end_learned_at"]),
            micros(row["expired_at"]),
            row["uuid"],
            group_id,
        ),
    )


def _write_episode(
    conn: sqlite3.Connection, group_id: str, write: EpisodeWrite, dim: int, now: datetime
) -> bool:
    """One episode's write inside the caller's transaction: read what it touches, check it
    (``errors``), then write it; False when its episode is processed already."""
    entities = [entity_row(group_id, e, dim, now) for e in write.entities]
    episode = episode_row(group_id, write.episode, dim, now, write.created)
    facts = [fact_row(group_id, f, dim, now) for f in write.facts]
    closures = [closure_row(c) for c in write.closures]
    stored = conn.execute(
        "SELECT id, group_id, content_hash, not_extracted, content FROM episode WHERE uuid = ?",
        (episode["uuid"],),
    ).fetchone()
    if stored is not None and errors.skips_write(
        group_id, write, stored["group_id"], stored["content_hash"], stored["not_extracted"]
    ):
        return False
    owners = _owners(conn, errors.written_entity_uuids(write)[1])
    query = f"SELECT uuid, group_id, source_uuid, target_uuid, fact FROM fact WHERE uuid {IN_LIST}"
    fact_rows = conn.execute(query, (json_text(errors.written_fact_uuids(write)),)).fetchall()
    facts_stored = {r[0]: errors.StoredFact(r[1], r[2], r[3]) for r in fact_rows}
    errors.check_write(
        group_id, write, None if stored is None else stored["group_id"], owners, facts_stored
    )
    # Checked: what follows writes.
    _upsert_entities(conn, group_id, entities)
    [row_id] = conn.execute(
        _MERGE_EPISODE,
        (
            episode["uuid"],
            group_id,
            episode["name"],
            episode["source"],
            episode["source_description"],
            episode["content"],
            micros(episode["valid_at"]),
            micros(episode["created_at"]),
            episode["producer_id"],
            episode["content_hash"],
            json_text(episode["created_entities"]),
            episode["not_extracted"],
            vector_blob(episode["content_embedding"]),
        ),
    ).fetchone()
    if stored is None or stored["content"] != episode["content"]:
        _index_text(conn, "episode_text", row_id, group_id, episode["content"])
    conn.executemany(
        "INSERT OR IGNORE INTO mention (episode_uuid, entity_uuid, group_id) VALUES (?, ?, ?)",
        [(episode["uuid"], uuid, group_id) for uuid in unique(write.mentions)],
    )
    texts = {r[0]: r[4] for r in fact_rows}
    for row in facts:
        _merge_fact(conn, group_id, row, texts.get(row["uuid"]))
        texts[row["uuid"]] = row["fact"]
    for row in closures:
        _close_fact(conn, group_id, row)
    return True


def _write_episodes(
    conn: sqlite3.Connection, group_id: str, writes: list[EpisodeWrite], dim: int
) -> list[bool]:
    """The writes in order, in one transaction; each in a savepoint of its own, so that on a
    failure the writes before it are committed and BatchWriteError says which they were."""
    now = now_utc()
    written: list[bool] = []
    with Transaction(conn):
        for write in writes:
            conn.execute("SAVEPOINT episode")
            try:
                written.append(_write_episode(conn, group_id, write, dim, now))
            except Exception as exc:
                conn.execute("ROLLBACK TO episode")
                conn.execute("RELEASE episode")
                failure: Exception = exc
                break
            conn.execute("RELEASE episode")
        else:
            return written
    if len(writes) == 1:
        raise failure
    raise BatchWriteError(written) from failure


# ----------------------------------------------------------------------------- the store
class SqliteStore(SqliteSearch):
    """``GraphStore`` on the SQLite file ``DB_FILE`` in the folder ``path``."""

    name = "sqlite"

    def __init__(self, path: Path, cache_mb: int = 128) -> None:
        self.db = SqliteDatabase(Path(path), cache_mb)
        self.vectors = GroupVectors()
        self._dim: int | None = None

    # ------------------------------------------------------------------ lifecycle
    async def setup(self, embedding_dim: int) -> None:
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

    async def open_existing(self, embedding_dim: int) -> bool:
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
        return True

    def _setup(self, conn: sqlite3.Connection, dim: int) -> None:
        with Transaction(conn):
            for statement in SCHEMA:
                conn.execute(statement)
            meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
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
    async def episode_marker(
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
    ) -> BatchRead:
        ask = LookupRequest(unique(keys), unique(names), None, None, unique(relations))

        def read(conn: sqlite3.Connection) -> BatchRead:
            return BatchRead(_lookup(conn, group_id, ask), _markers(conn, group_id, episodes))

        return await self.db.run(read)

    async def episode_status(self, group_id: str, episode_uuid: str) -> str:
        return (await self.episode_statuses(group_id, [episode_uuid]))[episode_uuid]

    async def episode_statuses(self, group_id: str, episode_uuids: list[str]) -> dict[str, str]:
        def read(conn: sqlite3.Connection) -> dict[str, str]:
            query = f"SELECT uuid, not_extracted FROM episode WHERE group_id = ? AND uuid {IN_LIST}"
            found = dict(conn.execute(query, (group_id, json_text(episode_uuids))).fetchall())
            return {
                uuid: "missing"
                if uuid not in found
                else "processed"
                if found[uuid] is None
                else "not_extracted"
                for uuid in episode_uuids
            }

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
                "WHERE ep.group_id = ? AND ep.valid_at < ? "
                "ORDER BY ep.valid_at DESC, ep.uuid DESC LIMIT ?"
            )
            rows = conn.execute(query, (group_id, micros(before), max(limit, 0)))
            return list(map(episode_of, rows))[::-1]

        return await self.db.run(read)

    # ------------------------------------------------------------------ entities
    async def entities_by_names(self, group_id: str, names: list[str]) -> list[EntityRecord]:
        return await self.db.run(_by_names, group_id, names) if names else []

    async def entities_by_keys(self, group_id: str, keys: list[str]) -> list[EntityRecord]:
        return await self.db.run(_by_keys, group_id, keys) if keys else []

    async def entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]:
        if not uuids:
            return []
        return await self.db.run(_entities, group_id, f"e.uuid {IN_LIST}", json_text(uuids))

    async def list_entities(self, group_id: str) -> list[EntityRecord]:
        return await self.db.run(_entities, group_id, "1 = ?", 1)

    async def upsert_entities(self, group_id: str, entities: list[EntityRecord]) -> None:
        if not entities:
            return
        dim, now = self._dimension(), now_utc()
        rows = [entity_row(group_id, e, dim, now) for e in entities]

        def write(conn: sqlite3.Connection) -> None:
            with Transaction(conn):
                owners = _owners(conn, unique(r["uuid"] for r in rows))
                errors.check_entity_owners(group_id, owners)
                _upsert_entities(conn, group_id, rows)

        with observe_write("upsert_entities", len(rows)):
            await self.db.run(write)

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
            return await self.db.run(_write_episodes, group_id, writes, dim)

    async def facts_as_of(self, group_id: str, asof: AsOf) -> list[FactView]:
        def read(conn: sqlite3.Connection) -> list[FactView]:
            about = None if asof.entity_uuid is None else [asof.entity_uuid]
            facts = believed_facts(conn, group_id, asof, about)
            names = names_of(conn, (u for f in facts for u in (f.source_uuid, f.target_uuid)))
            producers = producers_of(conn, group_id, (u for f in facts for u in f.episodes))
            return sort_views(
                (fact_view(f, names[f.source_uuid], names[f.target_uuid], producers, asof), f)
                for f in facts
            )

        return await self.db.run(read)

    # ------------------------------------------------------------------ maintenance
    async def counts(self, group_id: str) -> dict[str, int]:
        def read(conn: sqlite3.Connection) -> dict[str, int]:
            tables = {
                "episodes": "episode",
                "entities": "entity",
                "facts": "fact",
                "mentions": "mention",
            }
            return {
                name: conn.execute(
                    f"SELECT count(*) FROM {table} WHERE group_id = ?", (group_id,)
                ).fetchone()[0]
                for name, table in tables.items()
            }

        return await self.db.run(read)

    async def delete_group(self, group_id: str) -> None:
        def delete(conn: sqlite3.Connection) -> None:
            with Transaction(conn):
                for table, kind in (
                    ("fact_text", "fact"),
                    ("entity_text", "entity"),
                    ("episode_text", "episode"),
                    ("community_text", "community"),
                ):
                    conn.execute(
                        f"DELETE FROM {table} WHERE rowid IN "
                        f"(SELECT id FROM {kind} WHERE group_id = ?)",
                        (group_id,),
                    )
                for table in (
                    "fact",
                    "mention",
                    "member",
                    "entity_name",
                    "entity",
                    "episode",
                    "community",
                ):
                    conn.execute(f"DELETE FROM {table} WHERE group_id = ?", (group_id,))

        with observe_write("delete_group", 1):
            await self.db.run(delete)

    # ------------------------------------------------------------------ communities
    async def entity_graph(
        self, group_id: str, at: datetime | None = None
    ) -> tuple[list[str], list[WeightedEdge]]:
        asof = AsOf.resolve(at, None, False, None)

        def read(conn: sqlite3.Connection) -> tuple[list[str], list[WeightedEdge]]:
            nodes = ids(conn, "SELECT uuid FROM entity WHERE group_id = ? ORDER BY uuid", group_id)
            facts = believed_facts(conn, group_id, asof, None)
            edges = fold_edges((f.source_uuid, f.target_uuid, 1) for f in facts)
            return nodes, [WeightedEdge(a, b, w) for a, b, w in edges]

        return await self.db.run(read)

    async def neighbour_weights(
        self, group_id: str, entity_uuid: str, at: datetime | None = None
    ) -> dict[str, int]:
        [weights] = await self.neighbour_weights_many(group_id, [entity_uuid], at)
        return weights

    async def neighbour_weights_many(
        self, group_id: str, entity_uuids: list[str], at: datetime | None = None
    ) -> list[dict[str, int]]:
        if not entity_uuids:
            return []
        asof = AsOf.resolve(at, None, False, None)

        def read(conn: sqlite3.Connection) -> list[dict[str, int]]:
            facts = believed_facts(conn, group_id, asof, unique(entity_uuids))
            return [
                neighbour_weights_of(
                    uuid,
                    (
                        (f.source_uuid, f.target_uuid, 1)
                        for f in facts
                        if uuid in (f.source_uuid, f.target_uuid)
                    ),
                )
                for uuid in entity_uuids
            ]

        return await self.db.run(read)

    async def communities_of(self, group_id: str, entity_uuids: list[str]) -> dict[str, str | None]:
        def read(conn: sqlite3.Connection) -> dict[str, str | None]:
            query = (
                f"SELECT e.uuid, {COMMUNITY_OF} FROM entity e "
                f"WHERE e.group_id = ? AND e.uuid {IN_LIST}"
            )
            return dict(conn.execute(query, (group_id, json_text(entity_uuids))).fetchall())

        return await self.db.run(read) if entity_uuids else {}

    async def communities(self, group_id: str) -> list[CommunityRecord]:
        def read(conn: sqlite3.Connection) -> list[CommunityRecord]:
            heads = conn.execute(
                "SELECT uuid, name, summary FROM community WHERE group_id = ?", (group_id,)
            )
            members = conn.execute(
                "SELECT community_uuid, entity_uuid FROM member WHERE group_id = ?", (group_id,)
            )
            folded = fold_communities(list(heads), list(members))
            return [CommunityRecord(u, n, s, m) for u, n, s, m in folded]

        return await self.db.run(read)

    async def write_communities(
        self, group_id: str, upserts: list[CommunityRecord], deletes: list[str]
    ) -> None:
        if not upserts and not deletes:
            return
        rows, memberships, members = community_rows(upserts, self._dimension(), now_utc())

        def write(conn: sqlite3.Connection) -> None:
            with Transaction(conn):
                named = unique([*(r["uuid"] for r in rows), *deletes])
                query = f"SELECT uuid, group_id FROM community WHERE uuid {IN_LIST}"
                errors.check_community_owners(
                    group_id, dict(conn.execute(query, (json_text(named),)).fetchall())
                )
                _delete_communities(conn, group_id, unique(deletes))
                for row in rows:
                    _upsert_community(conn, group_id, row)
                if rows:  # the upserted communities' members are replaced, and leave others
                    conn.execute(
                        f"DELETE FROM member WHERE group_id = ? AND (community_uuid {IN_LIST} "
                        f"OR entity_uuid {IN_LIST})",
                        (group_id, json_text(r["uuid"] for r in rows), json_text(members)),
                    )
                owned = set(_owners(conn, members).items())
                conn.executemany(
                    "INSERT OR IGNORE INTO member (community_uuid, entity_uuid, group_id) "
                    "VALUES (?, ?, ?)",
                    [
                        (m["community"], m["entity"], group_id)
                        for m in memberships
                        if (m["entity"], group_id) in owned
                    ],
                )

        with observe_write("write_communities", len(rows) + len(memberships)):
            await self.db.run(write)

    async def assign_members(self, group_id: str, assignments: list[tuple[str, str]]) -> None:
        if not assignments:
            return

        def write(conn: sqlite3.Connection) -> None:
            with Transaction(conn):
                for community_uuid, entity_uuid in assignments:
                    found = conn.execute(
                        "SELECT (SELECT count(*) FROM community WHERE uuid = ? AND group_id = ?) "
                        "* (SELECT count(*) FROM entity WHERE uuid = ? AND group_id = ?)",
                        (community_uuid, group_id, entity_uuid, group_id),
                    ).fetchone()[0]
                    if not found:
                        continue
                    conn.execute(
                        "DELETE FROM member WHERE entity_uuid = ? AND group_id = ?",
                        (entity_uuid, group_id),
                    )
                    conn.execute(
                        "INSERT INTO member (community_uuid, entity_uuid, group_id) "
                        "VALUES (?, ?, ?)",
                        (community_uuid, entity_uuid, group_id),
                    )

        with observe_write("assign_member", len(assignments)):
            await self.db.run(write)


def _delete_communities(conn: sqlite3.Connection, group_id: str, uuids: list[str]) -> None:
    if not uuids:
        return
    param = (group_id, json_text(uuids))
    conn.execute(
        f"DELETE FROM community_text WHERE rowid IN "
        f"(SELECT id FROM community WHERE group_id = ? AND uuid {IN_LIST})",
        param,
    )
    conn.execute(f"DELETE FROM member WHERE group_id = ? AND community_uuid {IN_LIST}", param)
    conn.execute(f"DELETE FROM community WHERE group_id = ? AND uuid {IN_LIST}", param)


def _upsert_community(conn: sqlite3.Connection, group_id: str, row: dict[str, Any]) -> None:
    """MERGE one community row (``rows.community_rows``): name and summary set, the embedding
    when given, ``created_at`` on create only."""
    [row_id] = conn.execute(
        "INSERT INTO community (uuid, group_id, name, summary, name_embedding, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (uuid) DO UPDATE SET name = excluded.name, "
        "summary = excluded.summary, "
        "name_embedding = coalesce(excluded.name_embedding, community.name_embedding) "
        "RETURNING id",
        (
            row["uuid"],
            group_id,
            row["name"],
            row["summary"],
            vector_blob(row["name_embedding"]),
            micros(row["created_at"]),
        ),
    ).fetchone()
    _index_text(conn, "community_text", row_id, group_id, f"{row['name']} {row['summary']}")


def _stored_dimension(conn: sqlite3.Connection) -> int | None:
    """The embedding dimension the file was set up with (None: no schema in it)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE name = 'embedding_dim'").fetchone()
    except sqlite3.OperationalError:  # no meta table: not a tidegraph store (yet)
        return None
    return None if row is None else int(row[0])
