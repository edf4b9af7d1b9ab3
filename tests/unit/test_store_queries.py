"""The stores' query text, read as text (tidegraph/store/*_queries.py, asof_cypher.py): every
query is a parameterised string, reads are scoped by group, nothing is left to format, and the
two dialects answer the same operations (README "Architecture": all Cypher is parameterised;
names, labels and relation types are data, never query text)."""

from __future__ import annotations

import re
from types import ModuleType

import pytest

from tidegraph.records.asof import AsOf
from tidegraph.records.search import KINDS
from tidegraph.store import (
    common_queries,
    kuzu_queries,
    kuzu_search_queries,
    neo4j_queries,
    neo4j_search_queries,
)
from tidegraph.store.asof_cypher import ENTITY_GRAPH_RETURN, as_of_params, as_of_query

DIALECTS = {"neo4j": neo4j_queries, "kuzu": kuzu_queries}
SEARCH = {"neo4j": neo4j_search_queries, "kuzu": kuzu_search_queries}
MODULES = {
    **DIALECTS,
    "common": common_queries,
    "neo4j_search": neo4j_search_queries,
    "kuzu_search": kuzu_search_queries,
}
# What a dialect module holds besides operation queries: schema and index statements, index
# names, helper functions and the like.
NOT_OPERATIONS = re.compile(
    r"^(SCHEMA|SHOW_.*|AWAIT_INDEXES|.*_INDEX(ES)?|FULLTEXT_ANALYZER|LEGACY_.*|ADDED_COLUMNS|"
    r"DROPPED_INDEXES|INDEXES|FROM_SOURCE|FROM_TARGET|ANCHOR_HINTS|FACT_VIEW_RETURN|.*_FIELDS|"
    r"DROPPED|VECTOR_TABLES|FACT_TIMES|COMMUNITY_OF_E)$"
)
# Operations only one engine has (its quirks; see the stores' docstrings).
ONLY_NEO4J = {
    "ENTITY_GROUPS",
    "UPSERT_ENTITIES",
    "ENTITIES_BY_NAMES",
    "ENTITIES_BY_KEYS",
    "ENTITIES_BY_UUIDS",
    "RESOLUTION_LOOKUP",
    "FACT_CANDIDATES_PLAIN",
    "FACTS_BY_UUIDS",
    "WRITE_STATES",
    "WRITE_EPISODES",
    "EPISODES_PROCESSED",
    "UPSERT_COMMUNITIES",
    "ASSIGN_MEMBERS",  # the embedded store runs the shared statements one by one
    "READ_BATCHES",  # several groups' batch reads in one statement
    "COMMUNITIES_OF",  # the embedded store reads the entities
    "ENTITY_CANDIDATES",  # the embedded store searches draft by draft
}
ONLY_KUZU = {
    "EPISODE_GROUP",
    "CREATE_EPISODE",
    "CREATE_EPISODE_EMBEDDED",
    "MARK_EXTRACTED",
    "CREATE_MENTION",
    "ENTITY_STATE",
    "ENTITY_GROUP",
    "CREATE_ENTITY",
    "CREATE_ENTITY_EMBEDDED",
    "UPDATE_ENTITIES",
    "ENTITY_BY_UUID",
    "LOOKUP_BY_UUID",
    "LOOKUP_KEY",
    "ADD_LOOKUP_KEY",
    "ALL_ENTITY_NAMES",
    "CREATE_LOOKUP_KEYS",
    "COMMUNITIES",
    "FACT_INDEX_ROW",
    "CREATE_FACT_INDEX_ROW",
    "CREATE_FACT_INDEX_ROW_EMBEDDED",
    "SET_FACT_EMBEDDING",
    "SET_FACT_TEXT",
    "CREATE_VECTOR",
    "DELETE_VECTOR",
    "COMMUNITY_VECTOR_ID",
    "DROP_COMMUNITY_VECTORS",
    "BACKFILL",
    "CREATE_FACT",
    "UPDATE_FACT",
    "CLOSE_FACT",
    "FACTS_OF_SOURCE",
    "FACTS_FROM_SOURCES",
    "CREATE_COMMUNITY",
    "CREATE_COMMUNITY_EMBEDDED",
    "UPDATE_COMMUNITY",
    "UPDATE_COMMUNITY_EMBEDDED",
}
# Queries that may read across groups: by primary key (the caller checks the group of what
# it finds), or a store-wide migration or check.
UNSCOPED = {
    "ENTITY_GROUPS",
    "COMMUNITY_GROUPS",
    "EPISODE_GROUP",
    "ENTITY_STATE",
    "ENTITY_GROUP",
    "ENTITY_BY_UUID",
    "LOOKUP_BY_UUID",
    "LOOKUP_KEY",
    "ALL_ENTITY_NAMES",
    "PENDING_GROUPS",  # group ids only, for the operator (extract --pending, the sweep)
    "FACT_INDEX_ROW",
    "WRITE_STATES",
    "COMMUNITY_VECTOR_ID",
}
# Reads of the whole store: building kuzu's lookup table or search copies for a store made
# before them (once), and the operator's list of groups with episodes waiting for extraction
# (extract --pending, the worker's sweep).
WHOLE_STORE = {"ALL_ENTITY_NAMES", "BACKFILL", "PENDING_GROUPS"}
# Reads of several groups at once, each row of ``$asks`` carrying its own group: every MATCH
# is scoped by ``ask.group_id``.
PER_ASK_GROUP = {"READ_BATCHES"}
WRITES = re.compile(r"\b(CREATE|MERGE|SET|DELETE)\b")
LEFT_TO_FORMAT = re.compile(r"\{\{|\}\}|\{[a-z_]+\}")  # "{rows}", a doubled brace


def operations(module: ModuleType) -> dict[str, str | tuple[str, ...] | dict[str, str]]:
    """The module's queries by name (uppercase constants that are query text)."""
    found = {}
    for name, value in vars(module).items():
        if not name.isupper() or name.startswith("_") or NOT_OPERATIONS.match(name):
            continue
        if isinstance(value, str | tuple | dict) or value is None:
            found[name] = value
    return found


def texts(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in texts(v)]
    assert isinstance(value, tuple), value
    return [t for v in value for t in texts(v)]


ALL = [
    (f"{module_name}.{name}", name, text)
    for module_name, module in MODULES.items()
    for name, value in operations(module).items()
    for text in texts(value)
]


@pytest.mark.parametrize(("where", "name", "text"), ALL, ids=[w for w, _, _ in ALL])
def test_every_query_is_parameterised_text(where: str, name: str, text: str) -> None:
    assert isinstance(text, str) and text.strip()
    assert "$" in text or name in WHOLE_STORE, f"{where} takes no parameter"
    assert not LEFT_TO_FORMAT.search(text), f"{where} has a placeholder left: {text}"
    assert ";" not in text, f"{where} is several statements"


@pytest.mark.parametrize(("where", "name", "text"), ALL, ids=[w for w, _, _ in ALL])
def test_reads_are_scoped_by_group(where: str, name: str, text: str) -> None:
    if name in UNSCOPED | WHOLE_STORE or (WRITES.search(text) and "$group_id" not in text):
        # by primary key, or a write of rows whose group the caller checked
        return
    if name in PER_ASK_GROUP:
        matches = len(re.findall(r"\bMATCH\b", text))
        scoped = len(re.findall(r"\b\w+\.group_id = ask\.group_id\b", text))
        assert matches and scoped >= matches, f"{where} has a MATCH without its ask's group"
        return
    assert re.search(r"\$group_ids?\b", text), f"{where} reads without a group: {text}"


def test_both_dialects_answer_the_shared_operations() -> None:
    neo4j = set(operations(neo4j_queries)) - ONLY_NEO4J
    kuzu = set(operations(kuzu_queries)) - ONLY_KUZU
    assert neo4j == kuzu
    assert ONLY_NEO4J <= set(operations(neo4j_queries))
    assert ONLY_KUZU <= set(operations(kuzu_queries))
    for module in DIALECTS.values():
        assert set(module.ANCHOR_HINTS) == {"s", "t"}
    assert set(operations(neo4j_search_queries)) == set(operations(kuzu_search_queries))
    for module in SEARCH.values():
        assert callable(module.fulltext_query)
        assert set(module.FULLTEXT) == set(module.VECTOR) == set(KINDS)
        assert all(len(pair) == 2 for pair in module.VECTOR.values())


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize("include_invalid", [False, True])
@pytest.mark.parametrize("entity_uuid", [None, "e1"])
def test_as_of_questions_take_exactly_their_parameters(
    dialect: str, include_invalid: bool, entity_uuid: str | None
) -> None:
    queries = DIALECTS[dialect]
    asof = AsOf.resolve(None, None, include_invalid, entity_uuid)
    params = as_of_params("g", asof)
    for tail in (queries.FACT_VIEW_RETURN, ENTITY_GRAPH_RETURN):
        text = as_of_query(asof, tail, queries.ANCHOR_HINTS)
        assert set(re.findall(r"\$(\w+)", text)) == set(params)
        assert "r.group_id = $group_id" in text
        assert text.count("UNION ALL") == (entity_uuid is not None)


def test_search_text_never_reaches_the_query_unescaped() -> None:
    hostile = 'acme") DETACH DELETE n // OR x:y'
    lucene = neo4j_search_queries.fulltext_query(hostile)
    assert lucene is not None and '"' not in lucene.replace('\\"', "")
    assert ":" not in lucene.replace("\\:", "")
    assert kuzu_search_queries.fulltext_query(hostile) == "acme detach delete"
    assert neo4j_search_queries.fulltext_query("the and of") is None
