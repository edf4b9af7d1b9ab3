"""What a forget leaves in Neo4j that a query can reach: nothing (docs/operations.md "What a
forget leaves behind").

The strings of ``tests/support/planted.py`` (a name, a phone number, a street in a contact
and three chat messages) go into a group through the Memory API on Neo4j; before the forget,
the scans below find them; after the contact is forgotten as a subject and the messages by
their ids, no string property of any node or relationship in the database holds one (the
graph, the tombstones, the change outbox), and no fulltext index finds one. The bytes Neo4j
may still hold in its store files, index segments and transaction logs are out of a query's
reach and not tested here: the page says what they are and how an operator purges them.
"""

from __future__ import annotations

import re
import uuid as uuidlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from neo4j import AsyncGraphDatabase

from tests.support.planted import forget_planted, needles, plant
from tidegraph.app.demo import MAPPING_FILE
from tidegraph.app.memory import Memory
from tidegraph.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
async def memory(neo4j_uri: str, tmp_path: Path) -> AsyncIterator[Memory]:
    settings = Settings(
        data_dir=tmp_path / "data",
        embedder="hashing",
        mappings=MAPPING_FILE,
        store="neo4j",
        neo4j_uri=neo4j_uri,
    )
    opened = await Memory.open(settings)
    try:
        yield opened
    finally:
        await opened.close()


async def reachable(neo4j_uri: str, wanted: set[str]) -> dict[str, set[str]]:
    """Which needles a query reaches: in any string property of a node or a relationship
    (embeddings aside), and through each fulltext index."""
    found: dict[str, set[str]] = {}
    driver = AsyncGraphDatabase.driver(neo4j_uri)
    try:
        for what, query in (
            ("nodes", "MATCH (n) RETURN [k IN keys(n) WHERE NOT k ENDS WITH 'embedding' | n[k]]"),
            (
                "relationships",
                "MATCH ()-[r]->() RETURN [k IN keys(r) WHERE NOT k ENDS WITH 'embedding' | r[k]]",
            ),
        ):
            records, _, _ = await driver.execute_query(query)
            text = repr([r[0] for r in records]).lower()
            found[what] = {n for n in wanted if n in text}
        indexes, _, _ = await driver.execute_query(
            "SHOW FULLTEXT INDEXES YIELD name, entityType RETURN name, entityType"
        )
        words = sorted(n for n in wanted if re.fullmatch(r"[a-z0-9]+", n))
        for name, kind in indexes:
            call = "queryNodes" if kind == "NODE" else "queryRelationships"
            hits: set[str] = set()
            for word in words:
                records, _, _ = await driver.execute_query(
                    f"CALL db.index.fulltext.{call}($index, $word) YIELD score RETURN count(*)",
                    index=name,
                    word=word,
                )
                if records[0][0]:
                    hits.add(word)
            found[f"index {name}"] = hits
    finally:
        await driver.close()
    return {where: hits for where, hits in found.items() if hits}


async def test_after_a_forget_no_query_reaches_what_it_erased(
    memory: Memory, neo4j_uri: str
) -> None:
    group = f"planted-{uuidlib.uuid4().hex[:12]}"
    wanted = needles()
    try:
        await plant(memory, group)
        before = await reachable(neo4j_uri, wanted)
        assert {"nodes", "relationships"} <= set(before), before  # the scans see them
        assert any(where.startswith("index") for where in before), before
        await forget_planted(memory, group)
        assert await reachable(neo4j_uri, wanted) == {}
    finally:
        await memory.store.forget.delete_group(group)
