"""Resolution's name lookups on Neo4j seek their names and aliases through indexes: what a
unit's read costs does not grow with its tenant, and an alias a forget takes away no longer
finds the entity (``queries.named_branches``, ``write_queries.set_alias_key``)."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

import pytest

from tests.support.stores import upsert_entities
from tidegraph.records.graph import EntityRecord
from tidegraph.records.ids import normalize_name, stable_uuid
from tidegraph.records.times import utc
from tidegraph.stores.neo4j import lifecycle_queries as lq
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j.plans import bound_params
from tidegraph.stores.neo4j.store import Neo4jStore
from tidegraph.stores.rows import entity_row, now_utc, with_epoch_times

pytestmark = pytest.mark.integration

DIM = 384  # the shared test Neo4j's (tests.integration.test_store_contract)


def _entity(group: str, name: str, aliases: list[str]) -> EntityRecord:
    return EntityRecord(
        uuid=stable_uuid("entity", group, name),
        group_id=group,
        name=name,
        key=f"crm:{normalize_name(name)}",
        aliases=aliases,
        created_at=utc(now_utc()),
    )


def _db_hits(plan: dict[str, Any]) -> int:
    return int(plan.get("dbHits", 0)) + sum(_db_hits(c) for c in plan.get("children", []))


async def _profiled_read(store: Neo4jStore, group: str, keys: list[str], names: list[str]) -> Any:
    """The unit read of ``read_batch`` for one group, profiled: (db hits, uuids found)."""
    ask = {"i": 0, "group_id": group, "keys": keys, "names": names}
    params = {"asks": [{**ask, "relations": ["WORKS_AT"], "episodes": []}]}
    async with store.ex._driver.session() as session:
        result = await session.run(
            "PROFILE " + q.READ_BATCHES, bound_params(q.READ_BATCHES, params)
        )
        [row] = [record async for record in result]
        summary = await result.consume()
    found = sorted((f["e"]["uuid"], tuple(f["hows"])) for f in row["found"])
    return _db_hits(summary.profile), found


async def test_a_units_read_costs_the_same_in_a_tenant_ten_times_larger(neo4j_uri: str) -> None:
    store = Neo4jStore(neo4j_uri)
    group, other = (f"names-{uuidlib.uuid4().hex[:10]}" for _ in range(2))
    try:
        await store.setup(DIM)
        asked = [
            _entity(group, "Acme Corp", ["acme inc"]),
            _entity(group, "Globex", []),
            _entity(group, "Initech", ["initrode"]),
        ]
        # the other tenant has the same names: never found from this one
        await upsert_entities(store, other, [_entity(other, e.name, e.aliases) for e in asked])
        await upsert_entities(store, group, asked)
        await upsert_entities(
            store, group, [_entity(group, f"Filler {i}", ["f"]) for i in range(20)]
        )
        keys = ["crm:globex"]
        names = ["acme inc", "globex", "initech", "nobody"]
        small, found = await _profiled_read(store, group, keys, names)
        acme, globex, initech = (e.uuid for e in asked)
        assert found == sorted([(acme, ("name",)), (globex, ("key", "name")), (initech, ("name",))])

        filler = [_entity(group, f"Filler {i}", [f"filler alias {i}", "f"]) for i in range(400)]
        await upsert_entities(store, group, filler)
        large, found_large = await _profiled_read(store, group, keys, names)
        assert found_large == found
        assert large == small, "the name lookup reads more of a larger tenant"
    finally:
        for g in (group, other):
            await store.forget.delete_group(g)
        await store.close()


async def test_an_alias_taken_away_no_longer_finds_the_entity(neo4j_uri: str) -> None:
    """An entity's aliases replaced (a forget's rebuild writes entities in full): the lookup
    answers from what is stored now, through the alias key rewritten with them."""
    store = Neo4jStore(neo4j_uri)
    group = f"names-{uuidlib.uuid4().hex[:10]}"
    try:
        await store.setup(DIM)
        acme = _entity(group, "Acme Corp", ["acme inc", "the acme company"])
        await upsert_entities(store, group, [acme])
        assert [e.uuid for e in await store.entities_by_names(group, ["acme inc"])] == [acme.uuid]

        kept = acme.model_copy(update={"aliases": ["the acme company"]})
        row = with_epoch_times(entity_row(group, kept, DIM, now_utc()))

        async def overwrite(tx: Any) -> None:
            await tx.rows(lq.OVERWRITE_ENTITIES, {"group_id": group, "rows": [row]})

        await store.ex.transaction(overwrite)
        assert await store.entities_by_names(group, ["acme inc"]) == []
        found = await store.entities_by_names(group, ["the acme company", "acme corp"])
        assert [e.uuid for e in found] == [acme.uuid]
        assert found[0].aliases == ["the acme company"]
    finally:
        await store.forget.delete_group(group)
        await store.close()


async def test_setup_keys_the_aliases_of_entities_stored_before_the_key(neo4j_uri: str) -> None:
    """A store written by a version without the alias key: setup keys its aliased entities,
    and a lookup by alias finds them."""
    store = Neo4jStore(neo4j_uri)
    group = f"names-{uuidlib.uuid4().hex[:10]}"
    try:
        await store.setup(DIM)
        acme = _entity(group, "Acme Corp", ["acme inc"])
        await upsert_entities(store, group, [acme])
        await store.ex.execute(
            "MATCH (e:Entity) WHERE e.group_id = $group REMOVE e.alias_key", {"group": group}
        )
        assert await store.entities_by_names(group, ["acme inc"]) == []
        await store.setup(DIM)
        assert [e.uuid for e in await store.entities_by_names(group, ["acme inc"])] == [acme.uuid]
    finally:
        await store.forget.delete_group(group)
        await store.close()
