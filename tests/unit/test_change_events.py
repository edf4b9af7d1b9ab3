"""Row change events in the mapping layer (tidegraph/processors/mapping.py ``change_events``) and
declared sources turning records into episodes (tidegraph/processors/sources.py): pure logic."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.crm_tables import MAPPING
from tidegraph.app.memory import Memory
from tidegraph.pipelines.ingest import ingest
from tidegraph.processors.mapping import UNAVAILABLE_VALUE, MappingSet
from tidegraph.processors.sources import (
    Skipped,
    SourceFileError,
    SourceRecord,
    SourceSet,
    SourceSpec,
)
from tidegraph.records.episode import Episode
from tidegraph.records.errors import RecordError
from tidegraph.records.times import utcnow
from tidegraph.settings import Settings

MAPPINGS = MappingSet.model_validate(yaml.safe_load(MAPPING))
ACME = {"id": 1, "tenant": "north", "name": "Acme", "plan": "Pro", "owner": "Alice"}


def event(op: str, before: Any, after: Any, table: str = "accounts", ts: int = 1_700_000_000_000):
    return {"op": op, "before": before, "after": after,
            "source": {"table": table, "lsn": 42, "txId": 7, "ts_ms": ts}}  # fmt: skip


def facts_of(content: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    episode = Episode(id="e1", group_id="g", content=content, reference_time="2025-01-01T00:00Z")
    extraction = MAPPINGS.extract(episode)
    assert extraction is not None
    assert extraction.episode is episode  # the stored episode is the event as it came
    names = [e.name for e in extraction.entities]
    return [
        (names[f.subject], f.relation, names[f.object] if f.object >= 0 else "", f.closes)
        for f in extraction.facts
    ]


@pytest.mark.parametrize("op", ["r", "c"])
def test_a_snapshot_read_or_insert_states_the_rows_facts(op: str) -> None:
    assert facts_of(event(op, None, ACME)) == [
        ("Account 1", "HAS_PLAN", "Pro", False),
        ("Account 1", "OWNED_BY", "Alice", False),
    ]


def test_an_update_states_only_what_moved() -> None:
    moved = {**ACME, "owner": "Erin"}
    assert facts_of(event("u", ACME, moved)) == [("Account 1", "OWNED_BY", "Erin", False)]
    assert facts_of(event("u", ACME, dict(ACME))) == []  # a write of the same values


def test_an_update_tells_what_moved_by_the_text_its_values_render() -> None:
    # An update renders only the templates whose fields changed in value or type; equal
    # values of other types (1 and True) render differently and move, equal text does not.
    assert facts_of(event("u", {**ACME, "owner": 1}, {**ACME, "owner": True})) == [
        ("Account 1", "OWNED_BY", "True", False)
    ]
    assert facts_of(event("u", {**ACME, "owner": 7}, {**ACME, "owner": "7"})) == []


def entities_of(content: dict[str, Any], mapping: MappingSet = MAPPINGS) -> list[tuple[str, str]]:
    episode = Episode(id="e1", group_id="g", content=content, reference_time="2025-01-01T00:00Z")
    extraction = mapping.extract(episode)
    assert extraction is not None
    return [(e.name, e.summary) for e in extraction.entities]


def test_an_update_writes_only_the_entities_its_moved_facts_need() -> None:
    moved = {**ACME, "owner": "Erin"}
    assert entities_of(event("u", ACME, moved)) == [("Account 1", "Acme"), ("Erin", "")]
    assert entities_of(event("u", ACME, dict(ACME))) == []  # a write of the same values


def test_an_update_of_an_entitys_own_values_writes_that_entity() -> None:
    mapping = MappingSet.model_validate({"mappings": [{
        "name": "noted", "match": {"source.table": "t"}, "change_events": True,
        "entities": {"row": {"name": "Row {row.id}", "key": "k:{row.id}",
                             "summary": "{row.note}"},
                     "tag": {"name": "{row.tag}"}},
        "facts": [{"relation": "TAGGED", "subject": "row", "object": "tag"}],
    }]})  # fmt: skip
    then, now = {"id": 1, "tag": "red", "note": "old"}, {"id": 1, "tag": "red", "note": "new"}
    assert entities_of(event("u", then, now, table="t"), mapping) == [("Row 1", "new")]


def test_an_update_without_the_full_before_restates_every_fact() -> None:
    moved = {**ACME, "owner": "Erin"}
    assert len(facts_of(event("u", {"id": 1}, moved))) == 2
    assert len(facts_of(event("u", None, moved))) == 2


def test_a_delete_closes_the_rows_facts_with_their_objects() -> None:
    assert facts_of(event("d", ACME, None)) == [
        ("Account 1", "HAS_PLAN", "Pro", True),
        ("Account 1", "OWNED_BY", "Alice", True),
    ]


def test_a_delete_without_the_row_is_a_dead_letter_that_says_what_to_set() -> None:
    with pytest.raises(RecordError, match="REPLICA IDENTITY FULL") as failed:
        facts_of(event("d", None, None))
    assert failed.value.reason == "mapping_missing_field"


def test_the_unavailable_placeholder_never_overwrites_a_value() -> None:
    toasted = {**ACME, "owner": UNAVAILABLE_VALUE, "plan": "Enterprise"}
    assert facts_of(event("u", ACME, toasted)) == [("Account 1", "HAS_PLAN", "Enterprise", False)]


def test_an_unknown_op_is_a_dead_letter() -> None:
    with pytest.raises(RecordError) as failed:
        facts_of(event("x", None, ACME))
    assert failed.value.reason == "unknown_op"


def test_a_many_fact_whose_value_an_update_removed_is_closed() -> None:
    mapping = MappingSet.model_validate({"mappings": [{
        "name": "tagged", "match": {"source.table": "t"}, "change_events": True,
        "entities": {"row": {"name": "Row {row.id}", "key": "k:{row.id}"},
                     "tag": {"name": "{row.tag}"}},
        "facts": [{"relation": "TAGGED", "subject": "row", "object": "tag"}],
    }]})  # fmt: skip
    content = event("u", {"id": 1, "tag": "red"}, {"id": 1, "tag": "blue"}, table="t")
    episode = Episode(id="e", group_id="g", content=content, reference_time="2025-01-01T00:00Z")
    extraction = mapping.extract(episode)
    assert extraction is not None
    names = [e.name for e in extraction.entities]
    got = [(names[f.object], f.closes) for f in extraction.facts]
    assert got == [("blue", False), ("red", True)]


# ----------------------------------------------------------------------------- sources
def debezium_source(**extra: Any) -> SourceSpec:
    return SourceSpec.model_validate(
        {"name": "crm", "topics": ["crm.public.accounts"], "envelope": "debezium",
         "group": "{row.tenant}", **extra}
    )  # fmt: skip


def record(value: Any, key: Any = None, offset: int = 5, **kw: Any) -> SourceRecord:
    return SourceRecord(topic="crm.public.accounts", partition=0, offset=offset,
                        timestamp_ms=1_600_000_000_000, key=key if key is not None else {"id": 1},
                        value=value, headers=kw.get("headers", {}))  # fmt: skip


def test_a_change_event_becomes_an_episode_of_its_rows_tenant_at_its_database_time() -> None:
    episode = debezium_source().episode(record(event("c", None, ACME)))
    assert isinstance(episode, Episode)
    assert episode.group_id == "north"
    assert episode.reference_time.timestamp() == 1_700_000_000
    assert episode.content == event("c", None, ACME)
    assert episode.source == "json"


def test_the_same_change_read_again_is_the_same_episode_whatever_its_offset() -> None:
    source = debezium_source()
    first = source.episode(record(event("u", ACME, ACME), offset=5))
    again = source.episode(record(event("u", ACME, ACME), offset=9000))
    other_row = source.episode(record(event("u", ACME, ACME), key={"id": 2}))
    assert isinstance(first, Episode) and isinstance(again, Episode)
    assert isinstance(other_row, Episode)
    assert first.id == again.id != other_row.id


def test_schemas_of_the_json_converter_are_unwrapped() -> None:
    wrapped = {"schema": {"type": "struct"}, "payload": event("c", None, ACME)}
    key = {"schema": {"type": "struct"}, "payload": {"id": 1}}
    episode = debezium_source().episode(record(wrapped, key=key))
    assert isinstance(episode, Episode) and episode.content == event("c", None, ACME)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, "tombstone"),
        ({"ts_ms": 1}, "heartbeat"),
        ({"ddl": "CREATE TABLE x ()", "tableChanges": []}, "schema_change"),
        ({"status": "BEGIN", "id": "1"}, "transaction"),
        ({"op": "t", "before": None, "after": None, "source": {}}, "truncate"),
        ({"op": "m", "source": {}}, "message"),
    ],
)
def test_records_that_are_no_row_change_are_skipped(value: Any, kind: str) -> None:
    assert debezium_source().episode(record(value)) == Skipped(kind)


def test_plain_json_sources_take_a_constant_group_and_their_position_as_id() -> None:
    source = SourceSpec.model_validate(
        {"name": "tickets", "topics": ["tickets"], "group": "support",
         "reference_time": "at"}
    )  # fmt: skip
    episode = source.episode(
        SourceRecord("tickets", 2, 17, None, "T-1", {"at": "2025-03-01T10:00:00Z", "x": 1}, {})
    )
    assert isinstance(episode, Episode)
    assert (episode.group_id, episode.id) == ("support", "tickets:2:17")
    assert episode.reference_time.isoformat() == "2025-03-01T10:00:00+00:00"


def test_a_group_from_a_header_or_the_key() -> None:
    by_header = debezium_source(group="{headers.tenant}")
    episode = by_header.episode(record(event("c", None, ACME), headers={"tenant": "t9"}))
    assert isinstance(episode, Episode) and episode.group_id == "t9"
    by_key = debezium_source(group="acct-{key.id}")
    episode = by_key.episode(record(event("c", None, ACME)))
    assert isinstance(episode, Episode) and episode.group_id == "acct-1"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"before": None, "after": {}}, "missing_field"),
        ({"op": "z", "after": {}}, "unknown_op"),
        ([1, 2], "not_an_object"),
        (event("c", None, {"id": 1}), "mapping_missing_field"),  # no tenant for the group
        (event("c", None, {**ACME, "tenant": " north"}), "invalid_group_id"),
    ],
)
def test_records_that_do_not_fit_say_why(value: Any, reason: str) -> None:
    with pytest.raises(RecordError) as failed:
        debezium_source().episode(record(value))
    assert failed.value.reason == reason


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("sources: [{name: a, group: g}]", "give either topics or pattern"),
        ("sources: [{name: a, topics: [t], group: '{x'}]", "unpaired brace"),
        ("sources: [{name: a, topics: [t], group: g, format: avro}]", "needs a registry"),
        ("sources: [{name: a, pattern: '(', group: g}]", "not a regular expression"),
        ("sources: [{name: a, topics: [t], group: g, colour: red}]", "colour"),
        ("sources: []", "declares no source"),
        ("sources: [", "not YAML"),
    ],
)
def test_a_bad_sources_file_fails_in_one_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "sources.yaml"
    path.write_text(text)
    with pytest.raises(SourceFileError) as failed:
        SourceSet.load(path)
    message = str(failed.value)
    assert says in message and "\n" not in message and str(path) in message


def test_the_topics_a_file_reads_are_checked_against_the_clusters() -> None:
    from tidegraph.pipelines.streaming.sources import source_topics

    sources = SourceSet.model_validate(
        {"sources": [
            {"name": "crm", "pattern": r"crm\.public\..*", "group": "g"},
            {"name": "notes", "topics": ["notes"], "group": "g"},
        ]}
    )  # fmt: skip
    existing = ["crm.public.accounts", "crm.public.tickets", "crm.other", "notes", "x"]
    assert source_topics(sources, existing) == [
        "crm.public.accounts", "crm.public.tickets", "notes"
    ]  # fmt: skip
    assert sources.for_topic("crm.public.tickets").name == "crm"  # type: ignore[union-attr]
    with pytest.raises(SourceFileError, match="topic 'notes' does not exist"):
        source_topics(sources, ["crm.public.accounts"])
    with pytest.raises(SourceFileError, match="matches no topic"):
        source_topics(sources, ["notes"])


def test_a_registry_password_may_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tidegraph.processors.sources import RegistrySpec

    monkeypatch.setenv("REG_PASSWORD", "s3cret")
    spec = RegistrySpec(url="http://r:8081", username="u", password="${REG_PASSWORD}")
    assert spec.password == "s3cret"
    monkeypatch.delenv("REG_PASSWORD")
    with pytest.raises(ValueError, match="REG_PASSWORD"):
        RegistrySpec(url="http://r:8081", username="u", password="${REG_PASSWORD}")


# ----------------------------------------------------------------------------- truncates
def test_a_truncate_closes_the_tables_facts_by_its_rows_keys() -> None:
    episode = Episode(id="t1", group_id="g", content=event("t", None, None),
                      reference_time="2025-01-01T00:00Z")  # fmt: skip
    extraction = MAPPINGS.extract(episode)
    assert extraction is not None and extraction.entities == [] and extraction.facts == []
    closes = [(c.key_prefix, c.relation, c.cardinality) for c in extraction.table_closes]
    assert closes == [("crm:account:", "HAS_PLAN", "one"), ("crm:account:", "OWNED_BY", "one")]


@pytest.mark.parametrize("key", [None, "{row.id}"])
def test_a_truncate_of_a_table_whose_rows_have_no_fixed_key_says_what_to_give(
    key: str | None,
) -> None:
    row = {"name": "Row {row.id}", **({"key": key} if key else {})}
    mapping = MappingSet.model_validate({"mappings": [{
        "name": "rows", "match": {"source.table": "t"}, "change_events": True,
        "entities": {"row": row, "tag": {"name": "{row.tag}"}},
        "facts": [{"relation": "TAGGED", "subject": "row", "object": "tag"}],
    }]})  # fmt: skip
    episode = Episode(id="t1", group_id="g", content=event("t", None, None, table="t"),
                      reference_time="2025-01-01T00:00Z")  # fmt: skip
    with pytest.raises(RecordError, match="crm:account:") as failed:
        mapping.extract(episode)
    assert failed.value.reason == "truncate_unkeyed"


def test_a_source_that_closes_on_truncate_makes_it_an_episode_at_its_position() -> None:
    truncate = event("t", None, None)
    source = debezium_source(group="north", truncate="close")
    first = source.episode(record(truncate, key=None, offset=5))
    again = source.episode(record(truncate, key=None, offset=77))
    assert isinstance(first, Episode) and isinstance(again, Episode)
    assert first.id == again.id and first.group_id == "north"
    assert first.reference_time.timestamp() == 1_700_000_000
    assert debezium_source(group="north").episode(record(truncate)) == Skipped("truncate")


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"group": "{row.tenant}"}, "a group without {row...}"),
        ({"group": "{key.id}"}, "a group without {key...}"),
        ({"group": "g", "envelope": "none"}, "envelope: debezium"),
    ],
)
def test_closing_on_truncate_needs_a_group_a_truncate_carries(
    extra: dict[str, str], says: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        debezium_source(truncate="close", **extra)
    debezium_source(truncate="close", group="crm-{source.db}")  # a field a truncate has


@pytest.mark.parametrize("together", [False, True], ids=["one_by_one", "one_run"])
async def test_a_truncate_closes_every_open_fact_of_the_table_on_both_timelines(
    tmp_path: Path, together: bool
) -> None:
    """``one_run``: the changes go through the group runner at once, so the truncate is
    written in one unit with the inserts before it (their entities not yet in the store)."""
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(MAPPING)
    settings = Settings(data_dir=tmp_path / "data", embedder="hashing", mappings=mapping)
    source = debezium_source(group="north", truncate="close")
    globex = {**ACME, "id": 2, "name": "Globex", "plan": "Free", "owner": "Bob"}
    bob = {"id": 7, "tenant": "north", "name": "Bob", "account_id": 2}
    t0 = 1_700_000_000_000
    changes = [
        record(event("c", None, ACME, ts=t0), offset=0),
        record(event("c", None, globex, ts=t0 + 1000), key={"id": 2}, offset=1),
        record(event("c", None, bob, table="contacts", ts=t0 + 1500), key={"id": 7}, offset=2),
        record(event("d", globex, None, ts=t0 + 2000), key={"id": 2}, offset=3),
        record(event("t", None, None, ts=t0 + 3000), key=None, offset=4),
        record(event("c", None, {**ACME, "plan": "Team"}, ts=t0 + 4000), offset=5),
    ]
    async with await Memory.open(settings) as memory:
        episodes = [source.episode(change) for change in changes]
        assert all(isinstance(e, Episode) for e in episodes)
        if together:
            report = await ingest(memory.runtime.runner(), episodes)  # type: ignore[arg-type]
            assert report.failures == [] and report.episodes == len(changes)
        else:
            for episode in episodes:
                await memory.add(episode)  # type: ignore[arg-type]
        learned = utcnow()
        # Read again (a redelivery, a restarted connector): nothing more.
        for change in changes:
            episode = source.episode(replace(change, offset=change.offset + 100))
            assert isinstance(episode, Episode)
            await memory.add(episode)

        def at(ms: int) -> datetime:
            return datetime.fromtimestamp(ms / 1000, UTC)

        async def valid(ms: int, known_at: datetime | None = None) -> set[tuple[str, str, str]]:
            facts = await memory.facts("north", valid_at=at(ms), known_at=known_at)
            return {(f.subject, f.relation, f.object) for f in facts}

        contact = ("Bob", "WORKS_AT", "Account 2")  # another table's fact: untouched
        assert await valid(t0 + 2500) == {
            ("Account 1", "HAS_PLAN", "Pro"), ("Account 1", "OWNED_BY", "Alice"), contact
        }  # fmt: skip
        assert await valid(t0 + 3500) == {contact}
        assert await valid(t0 + 4500) == {
            ("Account 1", "HAS_PLAN", "Team"), ("Account 1", "OWNED_BY", "Alice"), contact
        }  # fmt: skip
        # Known before the truncate was read, the rows were still there.
        stored = await memory.facts("north", include_invalid=True)
        first = min(datetime.fromisoformat(str(f.created_at)) for f in stored)
        assert await valid(t0 + 3500, known_at=first) != {contact}
        assert await valid(t0 + 3500, known_at=learned) == {contact}
        # The entities and their history stay; the truncate is one episode, read once.
        history = await memory.facts("north", include_invalid=True)
        plans = sorted((f.object, f.valid_at, f.invalid_at) for f in history
                       if f.relation == "HAS_PLAN" and f.valid_at != f.invalid_at)  # fmt: skip

        def iso(ms: int) -> str:
            return at(ms).strftime("%Y-%m-%dT%H:%M:%SZ")

        assert plans == [("Free", iso(t0 + 1000), iso(t0 + 2000)),
                         ("Pro", iso(t0), iso(t0 + 3000)),
                         ("Team", iso(t0 + 4000), None)]  # fmt: skip
        assert (await memory.store.browse.counts("north"))["episodes"] == len(changes)
