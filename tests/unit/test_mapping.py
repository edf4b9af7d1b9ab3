"""Declared mappings: JSON records -> entities and facts with no LLM (docs/mappings.md "Declared
mappings")."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tidegraph.processors.extraction import ExtractionStep
from tidegraph.processors.mapping import MappingSet, render
from tidegraph.records.episode import Episode
from tidegraph.records.errors import MappingError, NoExtractorError, RecordError
from tidegraph.records.stages import Extraction

CRM_YAML = """
mappings:
  - name: plan_changed
    match: {type: account.plan_changed}
    entities:
      account: {name: "{account.name}", label: Account, key: "crm:account:{account.id}"}
      plan:    {name: "{plan}", label: Plan}
    facts:
      - relation: has plan
        subject: account
        object: plan
        fact: "{account.name} is on the {plan} plan"
        valid_at: changed_at
        cardinality: one
  - name: ticket_closed
    match: {type: ticket.status_changed, status: closed}
    entities:
      ticket: {name: "Ticket {ticket.id}", label: [Ticket, Support], key: "t:{ticket.id}",
               summary: "{ticket.subject}"}
      status: {name: closed, label: TicketStatus}
    facts:
      - {relation: HAS_STATUS, subject: ticket, object: status, valid_at: changed_at,
         cardinality: one}
  - name: ticket_any_status
    match: {type: ticket.status_changed}
    entities:
      ticket: {name: "Ticket {ticket.id}", key: "t:{ticket.id}"}
      status: {name: "{status}"}
    facts:
      - {relation: HAS_STATUS, subject: ticket, object: status, cardinality: one}
  - name: contact_left
    match: {type: contact.left}
    entities:
      contact: {name: "{contact.name}", label: Contact, key: "crm:contact:{contact.id}"}
      company: {name: "{company.name}", label: Account, key: "crm:account:{company.id}"}
    facts:
      - {relation: WORKS_AT, subject: contact, object: company, closes: true, valid_at: left_at}
  - name: contract
    match: {type: contract, meta.source: erp}
    entities:
      account: {name: "{account}"}
      product: {name: "{lines.0.product}"}
    facts:
      - {relation: BUYS, subject: account, object: product, valid_at: start, invalid_at: end}
  - name: contact_gone
    match: {type: contact.deleted}
    entities:
      contact: {name: "{name}", key: "c:{id}"}
    facts:
      - {relation: WORKS_AT, subject: contact, closes: true}
"""

REF = datetime(2024, 6, 1, 12, tzinfo=UTC)


@pytest.fixture(scope="module")
def mappings(tmp_path_factory: pytest.TempPathFactory) -> MappingSet:
    path = tmp_path_factory.mktemp("mapping") / "crm.yaml"
    path.write_text(CRM_YAML)
    return MappingSet.load(path)


def episode(content: dict[str, Any] | str, source: str = "json") -> Episode:
    return Episode(id="rec-1", group_id="g", source=source, content=content, reference_time=REF)  # type: ignore[arg-type]


PLAN_CHANGED = {
    "type": "account.plan_changed",
    "account": {"id": 42, "name": "Acme Corp"},
    "plan": "Pro",
    "changed_at": "2024-03-01T00:00:00Z",
}


def test_a_rule_maps_entities_and_facts(mappings: MappingSet) -> None:
    extraction = mappings.extract(episode(PLAN_CHANGED))
    assert extraction is not None and extraction.mapped and extraction.llm_calls == 0
    account, plan = extraction.entities
    assert (account.name, account.labels, account.key) == (
        "Acme Corp",
        ["Account"],
        "crm:account:42",
    )
    assert (plan.name, plan.labels, plan.key) == ("Pro", ["Plan"], None)
    (fact,) = extraction.facts
    assert (fact.subject, fact.object, fact.relation) == (0, 1, "HAS_PLAN")  # normalised
    assert fact.fact == "Acme Corp is on the Pro plan"
    assert fact.valid_at == "2024-03-01T00:00:00Z" and fact.invalid_at is None
    assert fact.cardinality == "one" and not fact.closes


def test_the_first_matching_rule_wins(mappings: MappingSet) -> None:
    closed = {"type": "ticket.status_changed", "status": "closed", "ticket": {"id": 7,
              "subject": "Printer jams"}, "changed_at": 1717000000}  # fmt: skip
    extraction = mappings.extract(episode(closed))
    assert extraction is not None
    assert extraction.entities[0].labels == ["Ticket", "Support"]
    assert extraction.entities[0].summary == "Printer jams"
    assert extraction.facts[0].valid_at == "1717000000"  # epochs pass through as text
    reopened = {**closed, "status": "open"}
    extraction = mappings.extract(episode(reopened))
    assert extraction is not None
    assert [e.name for e in extraction.entities] == ["Ticket 7", "open"]
    assert extraction.facts[0].valid_at is None  # no field declared: the reference time


def test_match_on_nested_paths_and_list_indexes(mappings: MappingSet) -> None:
    record = {
        "type": "contract",
        "meta": {"source": "erp"},
        "account": "Acme",
        "lines": [{"product": "Widgets"}],
        "start": "2024-01-01",
        "end": "2024-12-31",
    }
    extraction = mappings.extract(episode(record))
    assert extraction is not None
    assert [e.name for e in extraction.entities] == ["Acme", "Widgets"]
    (fact,) = extraction.facts
    assert fact.fact == "Acme BUYS Widgets"  # the default fact text
    assert (fact.valid_at, fact.invalid_at) == ("2024-01-01", "2024-12-31")
    assert fact.cardinality == "many"  # the default
    assert mappings.extract(episode({**record, "meta": {"source": "crm"}})) is None


@pytest.mark.parametrize(
    "content",
    [{"type": "unknown.event"}, {"no_type": True}, {"type": "contract"}],
)
def test_records_no_rule_matches(mappings: MappingSet, content: dict[str, Any]) -> None:
    assert mappings.extract(episode(content)) is None


def test_text_content_is_never_mapped(mappings: MappingSet) -> None:
    assert mappings.extract(episode("account.plan_changed", source="text")) is None


@pytest.mark.parametrize(
    ("change", "message", "reason"),
    [
        (lambda r: r.pop("plan"), "'plan' is missing", "mapping_missing_field"),
        (lambda r: r["account"].pop("name"), "'account.name' is missing", "mapping_missing_field"),
        (lambda r: r.update(plan=None), "'plan' must be a non-null scalar", "mapping_bad_value"),
        (lambda r: r.update(plan={"n": 1}), "'plan' must be a non-null", "mapping_bad_value"),
        (lambda r: r.update(plan="   "), "empty name", "mapping_bad_value"),
        (lambda r: r["account"].update(id=""), "'account.id' is empty", "mapping_bad_value"),
        (lambda r: r.update(changed_at={"at": 1}), "must be a string or a number", "bad_time"),
        (lambda r: r.update(plan="P" * 513), "name is 513 characters", "value_too_long"),
        (lambda r: r["account"].update(id="9" * 600), "key is 612 characters", "value_too_long"),
    ],
)  # fmt: skip
def test_a_record_a_rule_cannot_map_fails_with_its_reason(
    mappings: MappingSet, change: Any, message: str, reason: str
) -> None:
    record = {**PLAN_CHANGED, "account": dict(PLAN_CHANGED["account"])}  # type: ignore[arg-type]
    change(record)
    with pytest.raises(RecordError, match=message) as caught:
        mappings.extract(episode(record))
    assert caught.value.reason == reason


def test_a_missing_or_null_time_field_falls_back_to_the_reference_time(
    mappings: MappingSet,
) -> None:
    for record in ({k: v for k, v in PLAN_CHANGED.items() if k != "changed_at"},
                   {**PLAN_CHANGED, "changed_at": None}):  # fmt: skip
        extraction = mappings.extract(episode(record))
        assert extraction is not None and extraction.facts[0].valid_at is None


def test_closing_records(mappings: MappingSet) -> None:
    left = {"type": "contact.left", "contact": {"id": 1, "name": "Bob"},
            "company": {"id": 42, "name": "Acme Corp"}, "left_at": "2024-05-01"}  # fmt: skip
    extraction = mappings.extract(episode(left))
    assert extraction is not None
    (fact,) = extraction.facts
    assert fact.closes and (fact.subject, fact.object) == (0, 1)
    assert fact.valid_at == "2024-05-01"
    gone = mappings.extract(episode({"type": "contact.deleted", "name": "Bob", "id": 1}))
    assert gone is not None
    (fact,) = gone.facts
    assert fact.closes and fact.object == -1 and fact.fact == "Bob WORKS_AT (ended)"


def test_templates() -> None:
    record = {"a": {"b": "x"}, "n": 3, "f": 1.5, "t": True, "items": ["p", "q"]}
    assert render("{a.b}-{n}-{f}-{t}-{items.1}", record) == "x-3-1.5-True-q"
    assert render("{{literal}} {a.b}", record) == "{literal} x"
    assert render("{ a.b }", record) == "x"
    assert render("no fields", record) == "no fields"
    with pytest.raises(MappingError, match="'items.5' is missing"):
        render("{items.5}", record)


@pytest.mark.parametrize(
    ("yaml_text", "problem"),
    [
        ("mappings:\n  - {name: r, entities: {a: {name: x}}, facts: [{relation: R, subject: a, "
         "object: b}]}", "names entity 'b'"),
        ("mappings:\n  - {name: r, entities: {a: {name: x}}, facts: [{relation: R, subject: a}]}",
         "'object' is required unless closes"),
        ("mappings:\n  - {name: r, entities: {a: {name: x, label: 'Bad Label`'}}}",
         "letters, digits and underscores"),
        ("mappings:\n  - {name: r, entities: {a: {name: x, colour: red}}}", "colour"),
        ("mappings:\n  - {name: r, entities: {a: {name: x}}, facts: [{relation: R, subject: a, "
         "object: a, cardinality: two}]}", "cardinality"),
        ("rules: []", "mappings"),
    ],
)  # fmt: skip
def test_invalid_mapping_files_are_refused(tmp_path: Path, yaml_text: str, problem: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValueError, match=problem) as info:
        MappingSet.load(path)
    assert str(path) in str(info.value)


async def test_mapped_records_skip_the_llm(mappings: MappingSet) -> None:
    class NoLLM:
        async def structured(self, **kwargs: Any) -> Any:
            raise AssertionError("a mapped record reached the LLM")

    extractor = ExtractionStep(mappings=mappings, llm=NoLLM())
    extraction = await extractor.run(episode(PLAN_CHANGED))
    assert extraction.mapped and extraction.llm_calls == 0
    with pytest.raises(NoExtractorError, match="no declared mapping matches"):
        await ExtractionStep(mappings=mappings, llm=None).run(episode({"type": "other"}))
    unextracted = await ExtractionStep(mappings=mappings, llm=None).run(
        episode("hello", source="text")
    )
    assert isinstance(unextracted, Extraction) and unextracted.not_extracted == "no_llm"


def test_a_key_takes_an_id_exactly_as_sent():
    """docs/mappings.md "Keys": integers by their digits (never through a float), other numbers
    by their shortest form (7.0 is not 7), strings as written; a padded string is refused,
    never trimmed into another id (issue 48)."""
    from tidegraph.processors.mapping import key_text

    assert key_text(2**64) == "18446744073709551616"
    assert key_text(2**64 + 1) == "18446744073709551617"
    assert key_text(7) == key_text("7") == "7"  # a template writes both as 7
    assert len({key_text(v) for v in (7, 7.0, "07", 7.5)}) == 4
    assert key_text(7.0) == "7.0" and key_text(-3) == "-3" and key_text(True) == "true"
    for padded in ("7 ", " 7", "7\t", "7\x00"):
        with pytest.raises(MappingError, match="kept exactly as sent"):
            key_text(padded)
