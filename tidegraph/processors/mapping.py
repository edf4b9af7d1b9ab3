"""Declared mappings: JSON records -> entities and facts, exactly, with no LLM.

A mapping file (YAML) holds a list of rules. The first rule whose ``match`` fits a record
turns it into entities and facts::

    mappings:
      - name: plan_changed
        match: {type: account.plan_changed}      # every listed field equals the value
        entities:
          account: {name: "{account.name}", label: Account, key: "crm:account:{account.id}"}
          plan:    {name: "{plan}", label: Plan}
        facts:
          - relation: HAS_PLAN
            subject: account
            object: plan
            fact: "{account.name} is on the {plan} plan"
            valid_at: changed_at                  # a field path; default: reference_time
            cardinality: one                      # a new plan closes the previous one
      - name: contact_left
        match: {type: contact.left}
        entities: {...}
        facts:
          - {relation: WORKS_AT, subject: contact, object: company, closes: true,
             valid_at: left_at}

Templates use ``{dotted.path}`` into the record (``{{`` / ``}}`` for literal braces). A field
a rule needs but the record lacks is a :class:`MappingError` (the record goes to the dead
letters with that reason).

A rule with ``change_events: true`` maps row change events (Debezium's envelope: ``op``,
``before``, ``after``, ``source``): its templates also read ``row``, the row's state the
event leaves (``after``; ``before`` for a delete), and the operation decides what the facts do
(``apply_change_rule``): a snapshot read or insert states them, an update restates only the
facts whose value moved, a delete closes them, a truncate closes the table's; a value that
is the connector's unavailable placeholder (an unchanged TOASTed column) is never written.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tidegraph.records.episode import MAX_NAME_CHARS, Episode
from tidegraph.records.errors import BadTime, MappingError, RecordError, ValueTooLong
from tidegraph.records.ids import id_problem, to_label
from tidegraph.records.stages import EntityDraft, Extraction, FactDraft, TableClose

_TEMPLATE_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]+)\}")
# The numbers a time field may hold: what tidegraph/processors/temporal.py reads as epoch seconds
# (_EPOCH) or milliseconds (_EPOCH_MS).
_EPOCH_NUMBER = re.compile(r"^(\d{9,11}(\.\d+)?|\d{12,14})$")
# Limits of mapped values (longer ones are dead-lettered with reason value_too_long): an
# entity name and key as EntityDraft's, a summary, and a fact text as the LLM path keeps.
MAX_KEY_CHARS = 512
MAX_SUMMARY_CHARS = 4000
MAX_FACT_CHARS = 2000


class EntitySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str  # template
    label: str | list[str] | None = None
    key: str | None = None  # template of a stable external id (e.g. "crm:account:{id}")
    summary: str | None = None  # template

    @field_validator("label")
    @classmethod
    def _labels_safe(cls, v: str | list[str] | None) -> str | list[str] | None:
        for label in [v] if isinstance(v, str) else v or []:
            if to_label(label) != label:
                raise ValueError(f"label {label!r} must be letters, digits and underscores")
        return v


class FactSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    relation: str
    subject: str  # entity alias
    object: str | None = None  # entity alias; optional only for closing facts
    fact: str | None = None  # template; default "<subject> <relation> <object>"
    valid_at: str | None = None  # field path; default: the episode's reference_time
    invalid_at: str | None = None  # field path
    cardinality: Literal["one", "many"] = "many"
    closes: bool = False

    @model_validator(mode="after")
    def _object_needed(self) -> FactSpec:
        if self.object is None and not self.closes:
            raise ValueError(f"fact {self.relation}: 'object' is required unless closes: true")
        return self


class MappingRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    match: dict[str, Any] = Field(default_factory=dict)
    entities: dict[str, EntitySpec]
    facts: list[FactSpec] = Field(default_factory=list)
    # The records are row change events (op, before, after, source): see apply_change_rule.
    change_events: bool = False

    @model_validator(mode="after")
    def _aliases_exist(self) -> MappingRule:
        for fact in self.facts:
            for alias in (fact.subject, fact.object):
                if alias is not None and alias not in self.entities:
                    raise ValueError(
                        f"rule {self.name!r}: fact {fact.relation} names entity {alias!r}, "
                        f"which is not among its entities {sorted(self.entities)}"
                    )
        return self


class MappingSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mappings: list[MappingRule]

    @classmethod
    def load(cls, path: Path | str) -> MappingSet:
        data = yaml.safe_load(Path(path).read_text())
        try:
            return cls.model_validate(data)
        except Exception as exc:
            raise ValueError(f"mapping file {path} is invalid: {exc}") from exc

    def rule_for(self, record: dict[str, Any]) -> MappingRule | None:
        for rule in self.mappings:
            fields = with_row(record) if rule.change_events else record
            if all(_lookup(fields, path, None) == value for path, value in rule.match.items()):
                return rule
        return None

    def extract(self, episode: Episode) -> Extraction | None:
        """The mapped extraction of a json episode, or None when no rule matches."""
        if not isinstance(episode.content, dict):
            return None
        rule = self.rule_for(episode.content)
        if rule is None:
            return None
        if rule.change_events:
            return apply_change_rule(rule, episode)
        return apply_rule(rule, episode)


# ----------------------------------------------------------------------------- change events
# The operations of a row change event (Debezium's ``op``): snapshot read, create, update,
# delete, and truncate (only from a source declared ``truncate: close``). Messages never reach
# a mapping (the source skips them).
CHANGE_OPS = ("r", "c", "u", "d", "t")
# What Debezium's connectors send for a column whose value did not change and was not read
# (an unchanged TOASTed column): its default ``unavailable.value.placeholder``.
UNAVAILABLE_VALUE = "__debezium_unavailable_value"


def with_row(record: dict[str, Any]) -> dict[str, Any]:
    """A change event with ``row``: the row's state the event leaves (``after``; ``before``
    for a delete, whose ``after`` is null)."""
    if "row" in record or "op" not in record:
        return record
    row = record.get("before") if record.get("op") == "d" else record.get("after")
    return {**record, "row": row}


def apply_change_rule(rule: MappingRule, episode: Episode) -> Extraction:
    """The facts a row change event makes, declared once per table (docs/sources.md
    "Change events"):

    - ``r`` (snapshot) and ``c`` (insert): the row's facts as of the event's time;
    - ``u``: only the facts whose value moved (rendered from ``before`` and ``after``, they
      differ) are stated, at the change's time: a ``cardinality: one`` fact closes the
      previous value there, any other fact's previous value is closed there too; the others
      are untouched (without a full ``before``, REPLICA IDENTITY DEFAULT, every fact is
      restated: a restatement of a stored value merges into it);
    - ``d``: every fact of the row (rendered from ``before``) is closed at the delete's time;
      the entities and their history stay;
    - ``t`` (truncate): every open fact of the table's rows is closed at the truncate's time,
      as a delete of each row would (``table_closes``).

    A fact that would carry the unavailable placeholder (an unchanged TOASTed column) is left
    out, so the stored value stands."""
    record = episode.content
    assert isinstance(record, dict)
    op = record.get("op")
    if op not in CHANGE_OPS:
        raise MappingError(
            f"rule {rule.name!r}: op {op!r} is not a row change (one of {', '.join(CHANGE_OPS)})",
            reason="unknown_op",
        )
    if op == "t":
        return Extraction(episode=episode, mapped=True, table_closes=table_closes(rule, record))
    row = with_row(record)["row"]
    if not isinstance(row, dict):
        side = "before" if op == "d" else "after"
        raise MappingError(
            f"rule {rule.name!r}: a {op!r} event needs its {side!r} row; it is "
            f"{type(row).__name__}"
            + (" (set REPLICA IDENTITY FULL on the table)" if op == "d" else ""),
            reason="mapping_missing_field",
        )
    if op == "d":
        closing = rule.model_copy(
            update={
                "facts": [
                    f.model_copy(update={"closes": True, "valid_at": None, "invalid_at": None})
                    for f in rule.facts
                ]
            }
        )
        return _without_unavailable(apply_rule(closing, episode, with_row(record)))
    fields = with_row(record)
    rendered = apply_rule(rule, episode, fields)
    now = _without_unavailable(rendered)
    before = record.get("before")
    if op != "u" or not isinstance(before, dict):
        return now
    try:
        # The row before the update, rendered only where its templates read other values than
        # the row after it: the rest is what was just rendered.
        then = apply_rule(
            rule, episode, {**record, "row": before, "after": before}, same=(rendered, fields)
        )
    except RecordError:
        return now  # a partial before (REPLICA IDENTITY DEFAULT): restate every fact
    return _moved_only(now, then)


def table_closes(rule: MappingRule, record: dict[str, Any]) -> list[TableClose]:
    """What a truncate of the rule's table closes: per fact of the rule, the open facts of
    that relation whose subject is one of the table's rows, told by the fixed beginning of the
    subject's key template (``crm:account:{row.id}``: the keys starting ``crm:account:``)."""
    table = (record.get("source") or {}).get("table") or "the table"
    closes = []
    for spec in rule.facts:
        subject = rule.entities[spec.subject]
        prefix = key_prefix(subject.key) if subject.key else ""
        if not prefix:
            raise MappingError(
                f"rule {rule.name!r}: a truncate closes the facts of the table's rows, told "
                f"by their key's fixed beginning; entity {spec.subject!r} has "
                + (f"the key {subject.key!r}, which begins with a field" if subject.key
                   else "no key")
                + " (give it one like 'crm:account:{row.id}')",
                reason="truncate_unkeyed",
            )  # fmt: skip
        closes.append(
            TableClose(
                key_prefix=prefix,
                relation=spec.relation,
                cardinality=spec.cardinality,
                fact=f"{spec.relation} (ended: {table} truncated)",
            )
        )
    return closes


def key_prefix(template: str) -> str:
    """A key template's fixed beginning, before its first field (``{{``/``}}`` read as
    braces)."""
    first = next((m for m in _TEMPLATE_FIELD.finditer(template) if m.group(1)), None)
    head = template if first is None else template[: first.start()]
    return head.replace("{{", "{").replace("}}", "}")


def _without_unavailable(extraction: Extraction) -> Extraction:
    """The extraction less every fact (and entity summary) that carries the unavailable
    placeholder, and less the entities no fact is left to need."""
    entities = extraction.entities
    hidden = {i for i, e in enumerate(entities) if _unavailable(e.name) or _unavailable(e.key)}
    facts = [
        f
        for f in extraction.facts
        if f.subject not in hidden and f.object not in hidden and not _unavailable(f.fact)
    ]
    if len(facts) == len(extraction.facts) and not hidden:
        summaries = [e for e in entities if _unavailable(e.summary)]
        if not summaries:
            return extraction
    return _keep(extraction, entities, facts, hidden)


def _keep(
    extraction: Extraction, entities: list[EntityDraft], facts: list[FactDraft], drop: set[int]
) -> Extraction:
    """``extraction`` with ``entities`` less those in ``drop`` and ``facts`` (indexing
    ``entities``, renumbered); summaries holding the unavailable placeholder are cleared."""
    kept = [i for i in range(len(entities)) if i not in drop]
    index = {old: new for new, old in enumerate(kept)}
    kept_entities = []
    for i in kept:
        entity = entities[i]
        if _unavailable(entity.summary):
            entity = entity.model_copy(update={"summary": ""})
        kept_entities.append(entity)
    moved = []
    for f in facts:
        subject, obj = index[f.subject], index.get(f.object, -1)
        if (subject, obj) != (f.subject, f.object):
            f = f.model_copy(update={"subject": subject, "object": obj})
        moved.append(f)
    return extraction.model_copy(update={"entities": kept_entities, "facts": moved})


def _moved_only(now: Extraction, then: Extraction) -> Extraction:
    """The facts of ``now`` (after an update) whose value moved since ``then`` (before it),
    and a closing fact for each previous value of a fact without ``cardinality: one``; the
    entities those facts need and those whose own values (name, labels, summary, key,
    attributes) moved, not the others: an update rewrites nothing it did not change."""

    def ident(x: Extraction, f: FactDraft) -> tuple[Any, ...]:
        subject = x.entities[f.subject]
        target = x.entities[f.object] if f.object >= 0 else None
        return (
            f.relation,
            subject.key or subject.name,
            (target.key or target.name) if target else None,
            f.fact,
        )

    before = {ident(then, f) for f in then.facts}
    facts = [f for f in now.facts if ident(now, f) not in before]
    entities = list(now.entities)
    after = {ident(now, f) for f in now.facts}
    for f in then.facts:
        if f.cardinality == "one" or f.closes or ident(then, f) in after:
            continue
        if _unavailable(f.fact) or f.object < 0:
            continue
        # A "many" value the update removed: close it at the change's time.
        entities.append(then.entities[f.subject])
        entities.append(then.entities[f.object])
        facts.append(
            f.model_copy(
                update={
                    "subject": len(entities) - 2,
                    "object": len(entities) - 1,
                    "closes": True,
                    "valid_at": None,
                    "invalid_at": None,
                }
            )
        )
    needed = {f.subject for f in facts} | {f.object for f in facts if f.object >= 0}
    taken = {id(e) for e in then.entities}  # the entities ``then`` took from ``now`` as they are
    unchanged = {
        i
        for i, e in enumerate(entities)
        if i not in needed and (id(e) in taken or e in then.entities)
    }
    return _keep(now, entities, facts, unchanged)


def _unavailable(value: str | None) -> bool:
    return value is not None and UNAVAILABLE_VALUE in value


_MISSING = object()


def _lookup(record: Any, path: str, default: Any = _MISSING) -> Any:
    value = record
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            if default is _MISSING:
                raise MappingError(f"field {path!r} is missing", reason="mapping_missing_field")
            return default
    return value


def render(template: str, record: dict[str, Any], *, key: bool = False) -> str:
    """Fill ``{dotted.path}`` fields of a template from the record. A ``key`` template's
    values are ``key_text`` and may not be blank (a key ``crm:account:{id}`` with an empty id
    would merge every such record into one entity)."""
    out = []
    for text, field in _compiled(template):
        if field is None:
            out.append(text)
            continue
        value = _lookup(record, field)
        if value is None or isinstance(value, dict | list):
            raise MappingError(f"field {text!r} must be a non-null scalar")
        value_text = key_text(value) if key else str(value)
        if key and not value_text:
            raise MappingError(f"field {text!r} is empty")
        out.append(value_text)
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def _compiled(template: str) -> tuple[tuple[str, str | None], ...]:
    """A template as its parts, read once: (text, None) for literal text (``{{``/``}}`` as
    braces), (the field as written, its path) for a field."""
    parts: list[tuple[str, str | None]] = []
    at = 0
    for match in _TEMPLATE_FIELD.finditer(template):
        if match.start() > at:
            parts.append((template[at : match.start()], None))
        if match.group(1) is None:
            parts.append((match.group(0)[0], None))
        else:
            parts.append((match.group(1), match.group(1).strip()))
        at = match.end()
    if at < len(template):
        parts.append((template[at:], None))
    return tuple(parts)


def key_text(value: str | int | float | bool) -> str:
    """A value as it stands in a key (docs/mappings.md "Keys"): an id is taken exactly as the
    producer sent it, never made equal to another by reading it. An integer by its exact
    digits (never through a float), another number by its shortest form (7.0 stays 7.0: not
    the integer 7), a string as written, a boolean as true/false; a string padded with
    whitespace or holding control characters is refused (``id_problem``, the rule of the
    envelope's ids), never trimmed into another id. So 7 and "7" name one entity (a template
    writes both as 7); 7.0, "07" and 7 three."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        try:
            return str(value)
        except ValueError:  # more digits than Python writes (4,300)
            raise ValueTooLong("a key field is an integer of more than 4,300 digits") from None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MappingError(f"a key field is the number {value}, not a value")
        return repr(value)
    text = str(value)
    problem = id_problem(text)
    if problem is not None:
        raise MappingError(
            f"a key field {text[:80]!r} {problem}; an id is kept exactly as sent, so send it "
            "without them"
        )
    return text


def apply_rule(
    rule: MappingRule,
    episode: Episode,
    record: dict[str, Any] | None = None,
    *,
    same: tuple[Extraction, dict[str, Any]] | None = None,
) -> Extraction:
    """The rule's entities and facts from ``record`` (default: the episode's content).
    ``same``: the rule's extraction of another record and that record; an entity or fact
    whose templates read the same values in both (``_reads_same``) is taken from it as it
    is, since rendering it again gives it exactly."""
    if record is None:
        assert isinstance(episode.content, dict)
        record = episode.content
    aliases = list(rule.entities)
    entities = []
    kept: set[int] = set()  # the entities taken from ``same``
    for index, alias in enumerate(aliases):
        spec = rule.entities[alias]
        if same is not None and _reads_same(record, same[1], (spec.name, spec.key, spec.summary)):
            entities.append(same[0].entities[index])
            kept.add(index)
            continue
        name = render(spec.name, record).strip()
        if not name:
            raise MappingError(f"rule {rule.name!r}: entity {alias!r} has an empty name")
        labels = [spec.label] if isinstance(spec.label, str) else list(spec.label or [])
        key = render(spec.key, record, key=True) if spec.key else None
        summary = render(spec.summary, record) if spec.summary else ""
        for part, value, limit in (
            ("name", name, MAX_NAME_CHARS),
            ("key", key, MAX_KEY_CHARS),
            ("summary", summary, MAX_SUMMARY_CHARS),
        ):
            if value is not None and len(value) > limit:
                _too_long(f"rule {rule.name!r}: entity {alias!r} {part}", value, limit)
        entities.append(EntityDraft(name=name, labels=labels, key=key, summary=summary))
    facts = []
    for index, fact_spec in enumerate(rule.facts):
        subject = aliases.index(fact_spec.subject)
        obj = aliases.index(fact_spec.object) if fact_spec.object is not None else -1
        if (
            same is not None
            and subject in kept
            and (obj < 0 or obj in kept)
            and _reads_same(
                record, same[1], (fact_spec.fact,), (fact_spec.valid_at, fact_spec.invalid_at)
            )
        ):
            facts.append(same[0].facts[index])
            continue
        if fact_spec.fact:
            text = render(fact_spec.fact, record)
        else:
            target = f" {entities[obj].name}" if obj >= 0 else ""
            text = f"{entities[subject].name} {fact_spec.relation}{target}"
            text += " (ended)" if fact_spec.closes else ""
        if len(text) > MAX_FACT_CHARS:
            _too_long(f"rule {rule.name!r}: fact {fact_spec.relation} text", text, MAX_FACT_CHARS)
        facts.append(
            FactDraft(
                subject=subject,
                object=obj,
                relation=fact_spec.relation,
                fact=text,
                valid_at=_time_field(record, fact_spec.valid_at),
                invalid_at=_time_field(record, fact_spec.invalid_at),
                cardinality=fact_spec.cardinality,
                closes=fact_spec.closes,
            )
        )
    return Extraction(episode=episode, entities=entities, facts=facts, mapped=True)


def _reads_same(
    record: dict[str, Any],
    other: dict[str, Any],
    templates: tuple[str | None, ...],
    paths: tuple[str | None, ...] = (),
) -> bool:
    """Whether every field the ``templates`` and field ``paths`` read holds the same value,
    of the same type, in both records (a field missing from either is not the same)."""
    for template in templates:
        if template is not None and not _same_fields(_fields_of(template), record, other):
            return False
    return _same_fields(tuple(p for p in paths if p is not None), record, other)


def _same_fields(paths: tuple[str, ...], record: dict[str, Any], other: dict[str, Any]) -> bool:
    for path in paths:
        value = _lookup(record, path, _MISSING)
        was = _lookup(other, path, _MISSING)
        if value is _MISSING or type(value) is not type(was) or value != was:
            return False
    return True


@functools.lru_cache(maxsize=4096)
def _fields_of(template: str) -> tuple[str, ...]:
    """The field paths a template reads."""
    return tuple(path for _, path in _compiled(template) if path is not None)


def _too_long(what: str, value: str, limit: int) -> NoReturn:
    raise ValueTooLong(f"{what} is {len(value)} characters; the limit is {limit}")


def _time_field(record: dict[str, Any], path: str | None) -> str | None:
    if path is None:
        return None
    value = _lookup(record, path, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise BadTime(f"time field {path!r} must be a string or a number")
    if isinstance(value, str):
        return value
    # A number is a Unix time, never a phrase: read as text, 12.5 would be 5 December and
    # 3.14 31 January 03:14 (tidegraph/processors/temporal.py reads epoch seconds and milliseconds).
    text = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    if not _EPOCH_NUMBER.match(text):
        raise BadTime(
            f"time field {path!r} is the number {value!r}: a numeric time is epoch seconds "
            "(9 to 11 digits) or milliseconds (12 to 14 digits)"
        )
    return text
