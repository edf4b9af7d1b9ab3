"""The records' direct copy and construction (``records.graph.updated``, ``constructed``) are
pydantic's ``model_copy`` with an update and ``model_construct``, and ``rows.copied`` shares no
list with the record it copies."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, PrivateAttr

from tidegraph.records.changes import Change
from tidegraph.records.graph import EntityRecord, FactRecord, constructed, updated
from tidegraph.stores.rows import copied

T = datetime(2026, 1, 1, tzinfo=UTC)


def _fact() -> FactRecord:
    return FactRecord(
        uuid="f",
        group_id="g",
        source_uuid="a",
        target_uuid="b",
        name="HAS_PLAN",
        fact="a has plan b",
        fact_embedding=[0.5, 0.25],
        episodes=["e1"],
        valid_at=T,
    )


def test_updated_is_model_copy_with_update() -> None:
    fact = _fact()
    for update in ({}, {"episodes": ["e1", "e2"]}, {"invalid_at": T, "expired_at": T}):
        mine, theirs = updated(fact, update), fact.model_copy(update=update)
        assert mine == theirs
        assert mine.model_fields_set == theirs.model_fields_set
        assert mine.model_dump() == theirs.model_dump()
        assert mine is not fact
    entity = EntityRecord(uuid="e", group_id="g", name="Acme", aliases=["acme"])
    assert updated(entity, {"summary": "s"}) == entity.model_copy(update={"summary": "s"})


def test_updated_leaves_the_record_as_it_was() -> None:
    fact = _fact()
    copy = updated(fact, {"fact": "other"})
    copy.invalid_at = T
    assert (fact.fact, fact.invalid_at) == ("a has plan b", None)
    assert "invalid_at" not in fact.model_fields_set


def test_updated_takes_pydantics_copy_for_private_attributes() -> None:
    class WithPrivate(BaseModel):
        x: int
        _seen: int = PrivateAttr(default=0)

    record = WithPrivate(x=1)
    record._seen = 3
    copy = updated(record, {"x": 2})
    assert (copy.x, copy._seen, record.x) == (2, 3, 1)


def test_copied_shares_no_list() -> None:
    fact = _fact()
    copy = copied(fact)
    assert copy == fact
    copy.episodes.append("e2")
    copy.fact_embedding.append(1.0)  # type: ignore[union-attr]
    assert fact.episodes == ["e1"] and fact.fact_embedding == [0.5, 0.25]
    assert copied(fact, fact_embedding=None).fact_embedding is None
    assert fact.fact_embedding == [0.5, 0.25]


def test_constructed_is_model_construct_for_every_field() -> None:
    values = {
        "change_id": "c",
        "group_id": "g",
        "seq": 0,
        "kind": "fact.created",
        "uuid": "f",
        "episode_id": None,
        "committed_at": T,
        "before": None,
        "after": {"fact": "x"},
    }
    reordered = dict(reversed(list(values.items())))
    mine, theirs = constructed(Change, reordered), Change.model_construct(**values)
    assert mine == theirs
    assert list(mine.__dict__) == list(theirs.__dict__)
    assert mine.model_fields_set == theirs.model_fields_set
    assert mine.model_dump_json() == theirs.model_dump_json()
    partial = {k: v for k, v in values.items() if k != "seq"}
    assert constructed(Change, partial).model_fields_set == set(partial)


def test_copied_copies_every_list_field() -> None:
    fact = _fact().model_copy(update={"prior_ends": [T], "prior_starts_learned_at": [T]})
    entity = EntityRecord(uuid="e", group_id="g", name="A", labels=["X"], name_embedding=[1.0])
    for record in (fact, entity):
        copy = copied(record)
        assert copy == record
        for name, value in record.__dict__.items():
            if isinstance(value, list):
                assert getattr(copy, name) is not value, name
