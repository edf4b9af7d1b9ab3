"""The Neo4j store's query text, read as text (tidegraph/store/*_queries.py, asof_cypher.py):
every query is a parameterised string, reads are scoped by group and nothing is left to format
(docs/architecture.md "Architecture": all Cypher is parameterised; names, labels and relation types
are data, never query text). The embedded store's SQL is checked by tracing what it runs
(tests/integration/test_store_contract.py)."""

from __future__ import annotations

import re
from types import ModuleType

import pytest

from tidegraph.records.asof import AsOf
from tidegraph.records.search import KINDS
from tidegraph.stores.neo4j import common_queries
from tidegraph.stores.neo4j import migration_queries as neo4j_migration_queries
from tidegraph.stores.neo4j import queries as neo4j_queries
from tidegraph.stores.neo4j import search_queries as neo4j_search_queries
from tidegraph.stores.neo4j.asof import ENTITY_GRAPH_RETURN, as_of_params, as_of_query
from tidegraph.stores.neo4j.plans import bound_params, kept_plan
from tidegraph.stores.sqlite import search as sqlite_search

MODULES = {
    "neo4j": neo4j_queries,
    "common": common_queries,
    "neo4j_search": neo4j_search_queries,
    "neo4j_migration": neo4j_migration_queries,
}
# What a dialect module holds besides operation queries: schema and index statements, index
# names, helper functions and the like.
NOT_OPERATIONS = re.compile(
    r"^(SCHEMA|SHOW_.*|AWAIT_INDEXES|.*_INDEX(ES)?|FULLTEXT_ANALYZER|LEGACY_.*|ADDED_COLUMNS|"
    r"DROPPED_INDEXES|INDEXES|FROM_SOURCE|FROM_TARGET|ANCHOR_HINTS|FACT_VIEW_RETURN|.*_FIELDS?|"
    r"DROPPED|VECTOR_TABLES|FACT_TIMES|COMMUNITY_OF_E|KEEP_PLAN)$"
)
# Queries that may read across groups: by primary key (the caller checks the group of what
# it finds), or a store-wide migration or check.
UNSCOPED = {
    "ENTITY_GROUPS",
    "COMMUNITY_GROUPS",
    "PENDING_GROUPS",  # group ids only, for the operator (extract --pending, the sweep)
    "WRITE_STATES",
}
# Reads of the whole store: the operator's list of groups with episodes waiting for
# extraction (extract --pending, the worker's sweep).
WHOLE_STORE = {"PENDING_GROUPS"}
# Reads of several groups at once, each row of ``$asks`` carrying its own group: every MATCH
# is scoped by ``ask.group_id``.
PER_ASK_GROUP = {"READ_BATCHES"}
WRITES = re.compile(r"\b(CREATE|MERGE|SET|DELETE)\b")
# The group parameter, as a statement takes it: ``$group_id``, or ``$p.group_id`` in a statement
# that keeps its plan (``plans.kept_plan``: its parameters in one map, ``plans.bound_params``).
GROUP_PARAMETER = re.compile(r"\$(p\.)?group_ids?\b")
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
    if name in UNSCOPED | WHOLE_STORE or (WRITES.search(text) and not GROUP_PARAMETER.search(text)):
        # by primary key, or a write of rows whose group the caller checked
        return
    if name in PER_ASK_GROUP:
        matches = len(re.findall(r"\bMATCH\b", text))
        scoped = len(re.findall(r"\b\w+\.group_id = ask\.group_id\b", text))
        assert matches and scoped >= matches, f"{where} has a MATCH without its ask's group"
        return
    assert GROUP_PARAMETER.search(text), f"{where} reads without a group: {text}"


def test_search_queries_cover_every_kind() -> None:
    assert set(neo4j_queries.ANCHOR_HINTS) == {"s", "t"}
    assert callable(neo4j_search_queries.fulltext_query)
    assert set(neo4j_search_queries.FULLTEXT) == set(neo4j_search_queries.VECTOR) == set(KINDS)
    assert all(len(pair) == 2 for pair in neo4j_search_queries.VECTOR.values())


@pytest.mark.parametrize("include_invalid", [False, True])
@pytest.mark.parametrize("entity_uuid", [None, "e1"])
def test_as_of_questions_take_exactly_their_parameters(
    include_invalid: bool, entity_uuid: str | None
) -> None:
    queries = neo4j_queries
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
    assert sqlite_search.fulltext_query("g", hostile) == (
        'group_id : "g" AND (text : ("acme" OR "detach" OR "delete"))'
    )
    assert sqlite_search.fulltext_query('g") OR ("x', "acme") == (
        'group_id : "g"") OR (""x" AND (text : ("acme"))'
    )
    # A group holding most of the rows is left to the join (the token is not matched).
    assert sqlite_search.fulltext_query("g", "acme", by_group=False) == 'text : ("acme")'
    assert neo4j_search_queries.fulltext_query("the and of") is None


def test_a_kept_plan_takes_its_parameters_in_one_map_and_others_as_given() -> None:
    kept = kept_plan("MATCH (e:Entity {group_id: $group_id}) WHERE e.uuid IN $uuids RETURN e")
    params = {"group_id": "acme", "uuids": ["u1", "u2"]}
    assert "$p.group_id" in kept and "$p.uuids" in kept and "$group_id" not in kept
    assert bound_params(kept, params) == {"p": params}
    plain = "MATCH (e:Entity {group_id: $group_id}) RETURN e"
    assert bound_params(plain, params) is params
