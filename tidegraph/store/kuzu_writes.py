"""The embedded store's writes, statement by statement on the executor's thread (why they are
shaped so: ``kuzu_store``'s docstring): an entity upsert with its lookup keys, an episode's
write, a fact with its FactIndex row and searchable embedding."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from tidegraph.records.graph import EpisodeWrite
from tidegraph.store import errors
from tidegraph.store import kuzu_queries as q
from tidegraph.store.executor import Row
from tidegraph.store.kuzu_executor import KuzuDatabase
from tidegraph.store.rows import EntityState, fold_entity_rows, unique


def lookup_key_id(group_id: str, kind: str, value: str) -> str:
    """The EntityLookupKey id of a key (``kind`` "key") or a normalised name ("name")."""
    return "\x1f".join((group_id, kind, value))


def lookup_key_ids(group_id: str, key: str | None, names: list[str]) -> list[str]:
    """The id of every lookup row an entity with this key and these names belongs to."""
    ids = [lookup_key_id(group_id, "name", n) for n in unique(n for n in names if n)]
    return ([lookup_key_id(group_id, "key", key)] if key else []) + ids


def fact_index(db: KuzuDatabase, uuids: list[str]) -> dict[str, Row]:
    """The FactIndex rows of these facts (one primary-key lookup each: kuzu plans
    ``uuid IN [...]`` as a scan of the whole table)."""
    return {uuid: row for uuid in uuids for row in db.rows(q.FACT_INDEX_ROW, {"uuid": uuid})}


def write_entities(db: KuzuDatabase, group_id: str, rows: list[dict[str, Any]]) -> None:
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
            db.rows(q.CREATE_ENTITY_EMBEDDED, {**params, "name_embedding": row["name_embedding"]})
    if updates:
        db.rows(q.UPDATE_ENTITIES, {"rows": [{"uuid": u, **vars(s)} for u, s in updates.items()]})
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


def write_episode(
    db: KuzuDatabase, group_id: str, write: EpisodeWrite, params: dict[str, Any]
) -> bool:
    stored = db.rows(q.EPISODE_GROUP, {"uuid": write.episode.uuid})
    episode_group = stored[0]["group_id"] if stored else None
    if stored and errors.skips_write(
        group_id, write, episode_group, stored[0]["content_hash"], stored[0]["not_extracted"]
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
    index = fact_index(db, errors.written_fact_uuids(write))
    facts = {
        uuid: errors.StoredFact(row["group_id"], row["source_uuid"], row["target_uuid"])
        for uuid, row in index.items()
    }
    errors.check_write(group_id, write, episode_group, owners, facts)
    if params["entities"]:
        with db.transaction():
            write_entities(db, group_id, params["entities"])
    episode = params["episode"]
    with db.transaction():
        fields = {"group_id": group_id, **episode}
        if episode_group == group_id:  # stored without extraction: this is its extraction
            db.rows(
                q.MARK_EXTRACTED,
                {"uuid": episode["uuid"], "created_entities": episode["created_entities"]},
            )
        elif fields["content_embedding"] is None:
            del fields["content_embedding"]  # kuzu refuses parameters a query lacks
            db.rows(q.CREATE_EPISODE, fields)
        else:
            db.rows(q.CREATE_EPISODE_EMBEDDED, fields)
        for entity_uuid in unique(write.mentions):
            mention = {"episode_uuid": episode["uuid"], "entity_uuid": entity_uuid}
            db.rows(q.CREATE_MENTION, {"group_id": group_id, **mention})
        for row in params["facts"]:
            write_fact(db, group_id, row, index.get(row["uuid"]))
            facts[row["uuid"]] = errors.StoredFact(group_id, row["source_uuid"], row["target_uuid"])
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


def write_fact(db: KuzuDatabase, group_id: str, row: dict[str, Any], stored: Row | None) -> None:
    """Create or update one fact, its FactIndex row (``stored``: the row there is) and,
    when its embedding is new, its FactVector row."""
    params = {"group_id": group_id, **row}
    embedding = params.pop("fact_embedding")
    uuid = row["uuid"]
    vector_id = None
    if embedding is not None and (stored is None or stored["embedding"] != embedding):
        vector_id = new_vector(db, "FactVector", group_id, uuid, embedding)
    if stored is not None:
        del params["group_id"], params["created_at"]
        db.rows(q.UPDATE_FACT, params)
        db.rows(q.SET_FACT_TEXT, {"uuid": uuid, "fact": row["fact"]})
        if vector_id is not None:
            db.rows(
                q.SET_FACT_EMBEDDING,
                {"uuid": uuid, "embedding": embedding, "vector_id": vector_id},
            )
            drop_vector(db, "FactVector", stored["vector_id"])
        return
    db.rows(q.CREATE_FACT, params)
    fields = {name: row[name] for name in ("uuid", "source_uuid", "target_uuid", "fact")}
    fields["group_id"] = group_id
    if vector_id is None:
        db.rows(q.CREATE_FACT_INDEX_ROW, fields)
    else:
        db.rows(
            q.CREATE_FACT_INDEX_ROW_EMBEDDED,
            {**fields, "embedding": embedding, "vector_id": vector_id},
        )


def new_vector(
    db: KuzuDatabase, table: str, group_id: str, owner: str, embedding: list[float]
) -> str:
    """A new searchable copy of an embedding (``kuzu_queries.VECTOR_TABLES``): its id."""
    vector_id = new_vector_id(owner)
    params = {"id": vector_id, "group_id": group_id, "owner": owner, "embedding": embedding}
    db.rows(q.CREATE_VECTOR[table], params)
    return vector_id


def drop_vector(db: KuzuDatabase, table: str, vector_id: str | None) -> None:
    """Delete a replaced copy (after its successor was created: the index never empties)."""
    if vector_id is not None:
        db.rows(q.DELETE_VECTOR[table], {"id": vector_id})


def new_vector_id(owner: str) -> str:
    """The id of a new searchable copy of ``owner``'s embedding: never one used before (an
    HNSW row deleted and created again under its id is not found)."""
    return f"{owner}:{uuid4().hex}"
