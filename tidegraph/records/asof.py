"""The as-of rules (docs/architecture.md "Two timelines"): which facts are valid at T as believed at
K.

A fact is believed at K once created by then (``created_at <= K``); its end counts only once
learned by then (``expired_at <= K``), and when the end or the start moved later (a late fact,
``FactRecord.move_end`` / ``move_start``), the one believed at K is the one its history says.
The stores' Cypher filter (``tidegraph.stores.neo4j.asof.as_of_match``) lets through a
superset of these facts; ``AsOf.believed`` decides each."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tidegraph.records.graph import FactRecord
from tidegraph.records.times import utc, utcnow


@dataclass(frozen=True)
class AsOf:
    """A resolved ``query_facts`` question: valid at ``valid_at`` (T), as believed at
    ``known_at`` (T'); ``include_invalid`` keeps facts whatever their validity."""

    valid_at: datetime
    known_at: datetime
    include_invalid: bool
    entity_uuid: str | None

    @classmethod
    def resolve(
        cls,
        valid_at: datetime | None,
        known_at: datetime | None,
        include_invalid: bool,
        entity_uuid: str | None,
    ) -> AsOf:
        now = utcnow()
        return cls(
            valid_at=utc(valid_at) if valid_at else now,
            known_at=utc(known_at) if known_at else now,
            include_invalid=include_invalid,
            entity_uuid=entity_uuid,
        )

    def known_end(self, fact: FactRecord) -> tuple[datetime | None, datetime | None]:
        """(invalid_at, expired_at) as believed at ``known_at``: both unknown (None) until
        ``expired_at <= known_at``; then the end believed at that time (an end that moved
        later, when a late fact tightened it, is answered as it was then)."""
        end = end_known_at(fact, self.known_at)
        return (end, fact.expired_at) if end is not None else (None, None)

    def believed(self, fact: FactRecord) -> bool:
        """The exact as-of test (``as_of_match`` lets through a superset when an end or a
        start moved)."""
        if fact.created_at is None or fact.created_at > self.known_at:
            return False
        if self.include_invalid:
            return True
        end = end_known_at(fact, self.known_at)
        start = start_known_at(fact, self.known_at)
        started = start is None or start <= self.valid_at
        return started and (end is None or self.valid_at < end)


def end_known_at(fact: FactRecord, known_at: datetime) -> datetime | None:
    """``invalid_at`` as tidegraph believed it at ``known_at`` (None: no end known yet)."""
    if fact.expired_at is None or fact.expired_at > known_at:
        return None
    if (fact.end_learned_at or fact.expired_at) <= known_at:
        return fact.invalid_at
    believed = [
        end
        for end, learned in zip(fact.prior_ends, fact.prior_ends_learned_at, strict=True)
        if learned <= known_at
    ]
    return believed[-1] if believed else None


def start_known_at(fact: FactRecord, known_at: datetime) -> datetime | None:
    """``valid_at`` as tidegraph believed it at ``known_at`` (for a fact created by then;
    None: an open start)."""
    if fact.start_learned_at is None or fact.start_learned_at <= known_at:
        return fact.valid_at
    believed = [
        start
        for start, learned in zip(fact.prior_starts, fact.prior_starts_learned_at, strict=True)
        if learned <= known_at
    ]
    if believed:
        return believed[-1]
    return fact.prior_starts[0] if fact.prior_starts else fact.valid_at
