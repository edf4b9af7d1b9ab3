"""The write rules' table (``tidegraph.stores.write_rules``): each rule, a rule for every
field of every record a write carries, and the stores' statements built from the table (every
field a write may change assigned once, by its rule; nothing set on create assigned later).
What the stores do with them is the property test's (test_write_rules_property.py)."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime

import pytest

from tidegraph.records.graph import (
    CommunityRecord,
    EntityRecord,
    EpisodeRecord,
    FactClosure,
    FactRecord,
)
from tidegraph.stores.neo4j import write_queries
from tidegraph.stores.sqlite import write_sql
from tidegraph.stores.write_rules import (
    CLOSURE,
    COMMUNITY,
    ENTITY,
    EPISODE,
    FACT,
    RULES,
    Rule,
    Rules,
    applied,
    closed_fact,
    merged_entity,
    merged_episode,
    merged_fact,
    updated_fields,
)

T0 = datetime(2024, 1, 1, tzinfo=UTC)
T1 = datetime(2024, 2, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("rule", "stored", "written", "after"),
    [
        (Rule.KEY, "a", "b", "a"),
        (Rule.ON_CREATE, "a", "b", "a"),
        (Rule.ON_CREATE, None, "b", None),
        (Rule.TAKE_WRITTEN, "a", "b", "b"),
        (Rule.TAKE_WRITTEN, "a", None, None),
        (Rule.WRITTEN_OR_KEEP, "a", "b", "b"),
        (Rule.WRITTEN_OR_KEEP, "a", None, "a"),
        (Rule.WRITTEN_OR_KEEP, "a", "  ", "a"),
        (Rule.WRITTEN_OR_KEEP, [T0], [], [T0]),
        (Rule.FIRST_SET, "a", "b", "a"),
        (Rule.FIRST_SET, None, "b", "b"),
        (Rule.FIRST_SET, "", "b", ""),
        (Rule.UNION, ["a", "b"], ["c", "a", "c"], ["a", "b", "c"]),
        (Rule.UNION, None, ["a"], ["a"]),
    ],
)
def test_each_rule_on_a_stored_record(rule: Rule, stored: object, written: object, after: object):
    assert applied(rule, stored, written, created=False) == after


@pytest.mark.parametrize("rule", list(Rule))
def test_a_create_takes_the_written_value(rule: Rule):
    written: object = ["x", "x"] if rule is Rule.UNION else "x"
    expected: object = ["x"] if rule is Rule.UNION else "x"
    assert applied(rule, "stored", written, created=True) == expected


def test_a_create_without_a_value_stores_none():
    assert applied(Rule.WRITTEN_OR_KEEP, None, " ", created=True) is None


def _fields(kind: type) -> set[str]:
    if dataclasses.is_dataclass(kind):
        return {f.name for f in dataclasses.fields(kind)}
    return set(kind.model_fields)


@pytest.mark.parametrize(
    ("rules", "kind", "not_written", "not_held"),
    [
        # an entity's community is not written by an upsert (``write_communities``)
        (ENTITY, EntityRecord, {"community_uuid"}, set()),
        (FACT, FactRecord, set(), set()),
        (CLOSURE, FactClosure, set(), set()),
        # the entities an episode created are the write's (``EpisodeWrite.created``)
        (EPISODE, EpisodeRecord, set(), {"created_entities"}),
        # a community's members are replaced by an upsert, not merged; its group is the
        # store's
        (COMMUNITY, CommunityRecord, {"members"}, {"group_id"}),
    ],
)
def test_every_field_a_write_carries_has_a_rule(
    rules: Rules, kind: type, not_written: set[str], not_held: set[str]
):
    assert _fields(kind) - not_written <= set(rules)
    assert set(rules) - _fields(kind) == not_held


def test_field_names_are_plain_identifiers():
    """They are formatted into query text."""
    for rules in RULES.values():
        for name in rules:
            assert re.fullmatch(r"[a-z][a-z_]*", name), name


def _assignments(text: str, target: str) -> dict[str, list[str]]:
    """``target``-field -> the expressions assigned to it in ``text`` (one per assignment)."""
    found: dict[str, list[str]] = {}
    pattern = rf"(?m)(?:^|[ ,(]){re.escape(target)}(\w+) = (.+?)(?:,$|$)"
    for name, value in re.findall(pattern, text):
        found.setdefault(name, []).append(value.strip())
    return found


def _expected(rule: Rule, stored: str, written: str) -> str:
    return {
        Rule.TAKE_WRITTEN: written,
        Rule.WRITTEN_OR_KEEP: f"coalesce({written}, {stored})",
        Rule.FIRST_SET: f"coalesce({stored}, {written})",
    }.get(rule, "")


def _check_sql(text: str, rules: Rules, stored: str, written: str) -> None:
    set_part = text.split("SET", 1)[1].split("\nWHERE")[0].split("\nRETURNING")[0]
    assigned = _assignments(set_part, "")
    for name, rule in rules.items():
        if rule in (Rule.KEY, Rule.ON_CREATE):
            assert name not in assigned, f"{name} ({rule}) is assigned on a conflict"
        else:
            assert assigned.get(name) == [_expected(rule, stored + name, written + name)], name


def test_the_embedded_stores_upserts_follow_the_table():
    _check_sql(write_sql.MERGE_FACT, FACT, "fact.", "excluded.")
    _check_sql(write_sql.MERGE_EPISODE, EPISODE, "episode.", "excluded.")
    _check_sql(write_sql.CLOSE_FACT, CLOSURE, "", ":")
    _check_sql(write_sql.UPSERT_COMMUNITY, COMMUNITY, "community.", "excluded.")
    upserts = (
        (write_sql.MERGE_FACT, FACT),
        (write_sql.MERGE_EPISODE, EPISODE),
        (write_sql.UPSERT_COMMUNITY, COMMUNITY),
    )
    for statement, rules in upserts:
        columns = statement.split("(", 1)[1].split(")", 1)[0].split(", ")
        assert columns == list(rules)


def _check_cypher(text: str, var: str, rules: Rules) -> None:
    create_part, _, set_part = text.partition("\nSET ")
    created = _assignments(create_part, f"{var}.")
    assigned = _assignments(set_part, f"{var}.")
    for name, rule in rules.items():
        if rule is Rule.KEY:
            assert name not in created and name not in assigned
        elif rule is Rule.ON_CREATE:
            assert len(created.get(name, [])) == 1 and name not in assigned, name
        elif rule is Rule.UNION:
            [value] = assigned[name]
            assert value.startswith(f"coalesce({var}.{name}, []) + [item IN row.{name}"), name
        else:
            [value] = assigned[name]
            expected = _expected(rule, f"{var}.{name}", write_queries._written("row", "")(name))
            assert value == expected, (name, value)


def test_the_neo4j_statements_follow_the_table():
    _check_cypher(write_queries.upsert_entity_rows("$rows", "$group_id"), "e", ENTITY)
    _check_cypher(write_queries.merge_fact_rows("$rows", "$group_id"), "r", FACT)
    closures = write_queries.close_fact_rows("$rows", "$group_id").replace("WHERE", "\nWHERE")
    _check_cypher(closures, "r", CLOSURE)
    episode = write_queries._MERGE_EPISODE.replace("\n  ", "\n").replace("w.ep.", "row.")
    _check_cypher(episode, "ep", EPISODE)
    _check_cypher(write_queries.UPSERT_COMMUNITIES, "c", COMMUNITY)


def test_updated_fields_are_what_a_write_may_change():
    assert updated_fields(ENTITY) == ["labels", "aliases", "summary", "key"]


# ----------------------------------------------------------------------------- on records
def _entity(**fields: object) -> EntityRecord:
    return EntityRecord(**{"uuid": "e1", "group_id": "g", "name": "Acme", **fields})  # type: ignore[arg-type]


def test_an_entity_keeps_its_name_and_gains_labels_and_aliases():
    stored = merged_entity(None, _entity(labels=["Company", "Entity"], aliases=["acme"]), T0)
    assert stored.labels == ["Company"] and stored.created_at == T0 and stored.summary == ""
    after = merged_entity(
        stored,
        _entity(name="Other", labels=["Org"], aliases=["acme inc"], summary="A firm", key="k"),
        T1,
    )
    assert (after.name, after.created_at) == ("Acme", T0)
    assert after.labels == ["Company", "Org"] and after.aliases == ["acme", "acme inc"]
    assert (after.summary, after.key) == ("A firm", "k")
    again = merged_entity(after, _entity(summary=" ", key="k2"), T1)
    assert (again.summary, again.key) == ("A firm", "k")


def _fact(**fields: object) -> FactRecord:
    base = {"uuid": "f1", "group_id": "g", "source_uuid": "a", "target_uuid": "b"}
    return FactRecord(**{**base, "name": "WORKS_AT", "fact": "a works at b", **fields})  # type: ignore[arg-type]


def test_a_fact_takes_the_written_state_but_keeps_its_creation_and_first_expiry():
    stored = merged_fact(None, _fact(fact_embedding=[1.0], expired_at=T0, prior_ends=[T0]), T0)
    written = _fact(fact="a left b", created_at=T1, expired_at=T1, invalid_at=T1)
    after = merged_fact(stored, written, T1)
    assert (after.fact, after.invalid_at) == ("a left b", T1)
    assert (after.created_at, after.expired_at) == (T0, T0)
    assert after.fact_embedding == [1.0] and after.prior_ends == [T0]


def test_a_closure_sets_the_end_and_expires_once():
    stored = merged_fact(None, _fact(), T0)
    closed = closed_fact(
        stored, FactClosure("f1", T0, T0, prior_ends=(T1,), prior_ends_learned_at=(T1,))
    )
    assert (closed.invalid_at, closed.expired_at, closed.prior_ends) == (T0, T0, [T1])
    again = closed_fact(closed, FactClosure("f1", T1, T1))
    assert (again.invalid_at, again.expired_at, again.prior_ends) == (T1, T0, [T1])


def test_an_episode_marker_keeps_its_creation_time():
    episode = EpisodeRecord(
        uuid="ep", group_id="g", name="n", source="text", source_description="d",
        content="c", valid_at=T0, not_extracted="llm down",
    )  # fmt: skip
    stored = merged_episode(None, episode, T0)
    after = merged_episode(stored, episode.model_copy(update={"not_extracted": None}), T1)
    assert after.created_at == T0 and after.not_extracted is None
