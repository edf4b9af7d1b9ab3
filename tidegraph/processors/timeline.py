"""Fact dedupe and contradiction on the two timelines (docs/architecture.md "Two timelines"). Pure
logic, no I/O.

Given the facts an episode states (already stamped on T) and the stored facts that share an
endpoint with them, decide per new fact, in episode order:

- **closing record** (``closes``): every fact of subject+relation(+object) valid at t is
  closed at t, and the end is stored as a fact valid from t to t (valid at no time), so that a
  fact started before t and delivered after the closing record is born closed at t;
- **duplicate**: a stored fact the LLM named as duplicate gains the episode; nothing else
  changes. Without a judgement, a restatement (same endpoints and relation; for a fact
  without cardinality also the same normalised text) merges into the stored fact that is
  valid at the new fact's valid_at, or into one that starts later when nothing separates the
  two (no closing record of that subject, relation and object in between, no stated end of
  the new fact before it): its start then moves to the new one and it takes the earlier
  statement's text, exactly what event order would have given. For cardinality ``one`` only
  the same start counts: a value restated later starts a fact of its own (the earlier one
  ends there), so a late change between the two splits correctly. Known limit: a closing
  record of a ``many`` (or cardinality-free) fact that arrives after restatements on both
  sides of it were merged closes the merged fact at its time; the later restatements are
  not split off again (a fact does not keep each statement's time);
- **contradiction**: candidates are only facts sharing an endpoint and a compatible relation
  (cardinality ``one``: same subject and relation; LLM facts: what the LLM named among facts
  sharing an endpoint). A candidate that started at or before the new fact and is still
  valid then is closed at new.valid_at; one that starts later bounds the new fact, which is
  then stored already closed (a late arrival). A closing record's end bounds the facts of its
  own object (of every object when it names none), whatever their cardinality;
- ``expired_at`` (T') is set once: when a fact is first closed, or at creation for a fact
  born closed. ``invalid_at`` may only move earlier (a late fact tightens an interval); when
  it moves, the end it replaces is kept with the time it was learned (``prior_ends``), so
  that "as known at k" still answers with what was believed at k. ``valid_at`` may only move
  earlier (a late restatement) and is kept the same way (``prior_starts``).

A stored fact that ended before the new fact starts (``invalid_at`` < t) changes nothing:
closing it at t, or by a later value, is a no-op (an end only moves earlier); it is valid
at no time from t on, so it is neither restated nor continued; it does not start after t,
so it bounds nothing; and a recorded end before t is neither the end at t nor one between
t and a later start. So a unit's batch read leaves out the facts that ended before its
earliest new fact starts (``FactRecord.ended_before``): an entity's long history costs its
writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from tidegraph.records.graph import FactClosure, FactRecord, updated
from tidegraph.records.ids import normalize_name, stable_uuid
from tidegraph.records.stages import StampedFact


@dataclass(frozen=True)
class FactDecision:
    """The LLM's judgement of one new (cardinality-free) fact, as stored uuids."""

    duplicate_of: str | None = None
    contradicts: tuple[str, ...] = ()


@dataclass
class FactPlan:
    # Upserts by uuid (full state): new facts, and stored ones that gained an episode.
    facts: dict[str, FactRecord] = field(default_factory=dict)
    # Stored facts that only need their end set (no full rewrite of the record).
    closures: dict[str, FactClosure] = field(default_factory=dict)
    new: int = 0
    merged: int = 0
    closed: int = 0
    born_closed: int = 0
    # By index of a new fact (not a closing one): the uuid of the fact it became (new, or
    # the stored one it merged into).
    became: dict[int, str] = field(default_factory=dict)


def fact_uuid(group_id: str, episode_uuid: str, fact: StampedFact) -> str:
    return stable_uuid(
        "fact", group_id, episode_uuid, fact.source_uuid, fact.relation, fact.target_uuid or ""
    )


def valid_at_time(fact: FactRecord, t: datetime) -> bool:
    start_ok = fact.valid_at is None or fact.valid_at <= t
    return start_ok and (fact.invalid_at is None or t < fact.invalid_at)


def plan_facts(
    *,
    group_id: str,
    episode_uuid: str,
    stamped: list[StampedFact],
    existing: list[FactRecord],
    now: datetime,
    embeddings: dict[int, list[float]] | None = None,
    decisions: dict[int, FactDecision] | None = None,
) -> FactPlan:
    """Decide every new fact of one episode against the stored facts (see module doc)."""
    embeddings = embeddings or {}
    decisions = decisions or {}
    # Copies of the facts this can change (the caller's records stay as they were): those
    # of a new fact's subject and relation, and those a judgement names. Only their episode
    # lists are mutated in place, so the embeddings are shared rather than deep-copied.
    pairs = {(new.source_uuid, new.relation) for new in stamped}
    named = {u for d in decisions.values() for u in (d.duplicate_of, *d.contradicts) if u}
    state = {
        f.uuid: (
            updated(f, {"episodes": list(f.episodes)})
            if (f.source_uuid, f.name) in pairs or f.uuid in named
            else f
        )
        for f in existing
    }
    stored = set(state)
    plan = FactPlan()
    touched: set[str] = set()
    # The facts of each subject and relation, in ``state``'s order.
    by_pair: dict[tuple[str, str], list[FactRecord]] = {}
    for f in state.values():
        by_pair.setdefault((f.source_uuid, f.name), []).append(f)

    def put(record: FactRecord) -> None:
        if record.uuid in state:  # replaced in place: the order is the dict's
            state[record.uuid] = record
            by_pair.clear()
            for f in state.values():
                by_pair.setdefault((f.source_uuid, f.name), []).append(f)
            return
        state[record.uuid] = record
        by_pair.setdefault((record.source_uuid, record.name), []).append(record)

    def close(target: FactRecord, at: datetime, *, counted: bool = True) -> None:
        if target.invalid_at is not None and target.invalid_at <= at:
            return
        target.move_end(at, now)
        plan.closed += counted
        if target.uuid in stored:
            plan.closures[target.uuid] = FactClosure.of(target)

    for i, new in enumerate(stamped):
        t = new.valid_at
        same_pair = list(by_pair.get((new.source_uuid, new.relation), ()))
        if new.closes:
            for f in same_pair:
                if (new.target_uuid is None or f.target_uuid == new.target_uuid) and valid_at_time(
                    f, t
                ):
                    close(f, t)
            # The end itself is kept, as a fact valid from t to t (never valid at any time):
            # a fact of this subject and relation that arrives later but started before t is
            # then bounded by it (born closed at t) instead of staying open for good.
            target = new.target_uuid or new.source_uuid
            marker = next((f for f in same_pair if _is_end(f, target, t)), None)
            if marker is None:
                marker = FactRecord(
                    uuid=fact_uuid(group_id, episode_uuid, new),
                    group_id=group_id,
                    source_uuid=new.source_uuid,
                    target_uuid=target,
                    name=new.relation,
                    fact=new.fact,
                    episodes=[episode_uuid],
                    valid_at=t,
                    invalid_at=t,
                    created_at=now,
                    expired_at=now,
                    cardinality=new.cardinality,
                )
                put(marker)
                touched.add(marker.uuid)
            elif episode_uuid not in marker.episodes:
                marker.episodes.append(episode_uuid)
                touched.add(marker.uuid)
            continue

        decision = decisions.get(i, FactDecision())
        judged = _judged_duplicate(new, decision, state)
        restated = None if judged is not None else restatement_of(new, same_pair)
        if restated is not None and _takes_earlier_start(restated, new, embeddings.get(i), now):
            touched.add(restated.uuid)
        duplicate = judged or restated
        if duplicate is not None:
            plan.became[i] = duplicate.uuid
            if episode_uuid not in duplicate.episodes:
                duplicate.episodes.append(episode_uuid)
                touched.add(duplicate.uuid)
                plan.merged += 1
            continue

        uuid = fact_uuid(group_id, episode_uuid, new)
        if uuid in state:
            # The episode states the same subject-relation-object twice (other time or text).
            uuid = stable_uuid(uuid, str(i))
        record = FactRecord(
            uuid=uuid,
            group_id=group_id,
            source_uuid=new.source_uuid,
            target_uuid=new.target_uuid or new.source_uuid,
            name=new.relation,
            fact=new.fact,
            fact_embedding=embeddings.get(i),
            episodes=[episode_uuid],
            valid_at=t,
            invalid_at=new.invalid_at,
            created_at=now,
            expired_at=now if new.invalid_at is not None else None,
            cardinality=new.cardinality,
        )
        # The recorded ends (closing records) of this very fact bound it whatever its
        # cardinality; those of another object never do.
        rivals = [f for f in same_pair if _ends(f, record)]
        if new.cardinality == "one":
            rivals += [f for f in same_pair if not _is_marker(f)]
        elif new.cardinality is None:
            endpoints = {new.source_uuid, new.target_uuid}
            rivals += [
                state[u]
                for u in decision.contradicts
                if u in state and {state[u].source_uuid, state[u].target_uuid} & endpoints
            ]
        for rival in rivals:
            if rival.valid_at is not None and rival.valid_at > t:
                # A stored fact starts later: this one arrived late and is born closed.
                if record.invalid_at is None or rival.valid_at < record.invalid_at:
                    record.invalid_at = rival.valid_at
                    record.expired_at = now
            elif rival.target_uuid != record.target_uuid or new.cardinality != "one":
                close(rival, t)
            elif rival.invalid_at is None or rival.invalid_at > t:
                # The same value, restated later (see _find_duplicate): the new fact takes over
                # (not counted as an invalidation: the value did not change).
                close(rival, t, counted=False)
        if record.invalid_at is not None:
            plan.born_closed += 1
        plan.new += 1
        plan.became[i] = record.uuid
        put(record)
        touched.add(record.uuid)

    for uuid in sorted(touched):
        plan.facts[uuid] = state[uuid]
    return plan


def _is_end(fact: FactRecord, target: str, at: datetime | None) -> bool:
    """A recorded end (a closing record's fact, valid from ``at`` to ``at``) of ``target``."""
    return fact.target_uuid == target and fact.valid_at == at == fact.invalid_at


def _is_marker(fact: FactRecord) -> bool:
    """A recorded end of any object (valid at no time)."""
    return fact.valid_at is not None and fact.valid_at == fact.invalid_at


def _ends(marker: FactRecord, fact: FactRecord) -> bool:
    """``marker`` is a recorded end of ``fact``'s subject, relation and object (a closing
    record without object is stored with the subject as its object: it ends every object).
    Both are of the same subject and relation."""
    return _is_marker(marker) and marker.target_uuid in (fact.target_uuid, fact.source_uuid)


def _judged_duplicate(
    new: StampedFact, decision: FactDecision, state: dict[str, FactRecord]
) -> FactRecord | None:
    """The stored fact the LLM named as duplicate, when it shares an endpoint."""
    if decision.duplicate_of and decision.duplicate_of in state:
        candidate = state[decision.duplicate_of]
        if {candidate.source_uuid, candidate.target_uuid} & {new.source_uuid, new.target_uuid}:
            return candidate
    return None


def restatement_of(new: StampedFact, same_pair: list[FactRecord]) -> FactRecord | None:
    """The fact of ``same_pair`` (same subject and relation) that ``new`` restates, by rule
    (no LLM): same object and, for a fact without cardinality, the same normalised text.

    For cardinality ``one`` only the same start counts: a value restated later starts a
    fact of its own (the earlier one ends there). Were it merged into the earlier one, a late
    change arriving between the two would close the value for good (a ticket reopened, then
    its closing delivered late, would stay closed).

    Otherwise a fact valid at the new start, or one that starts later with nothing between
    the two (``_continued_by``): in event order the later statement would have found the
    earlier one valid and merged into it, so the delivery order does not matter."""
    target = new.target_uuid or new.source_uuid
    same = [f for f in same_pair if f.target_uuid == target and not _is_marker(f)]
    for f in sorted(same, key=lambda f: (f.valid_at is None, f.valid_at, f.uuid)):
        if new.cardinality == "one":
            if f.valid_at == new.valid_at and valid_at_time(f, new.valid_at):
                return f
            continue
        if new.cardinality is None and normalize_name(f.fact) != normalize_name(new.fact):
            continue
        if valid_at_time(f, new.valid_at) or _continued_by(new, f, same_pair):
            return f
    return None


def _continued_by(new: StampedFact, fact: FactRecord, same_pair: list[FactRecord]) -> bool:
    """``fact`` starts after ``new`` and nothing separates them: no recorded end of the fact
    (a closing record) in [new.valid_at, fact.valid_at), and no stated end of ``new`` at or
    before fact.valid_at."""
    start = fact.valid_at
    if start is None or start <= new.valid_at:
        return False
    if new.invalid_at is not None and new.invalid_at <= start:
        return False
    return not any(
        _ends(m, fact) and new.valid_at <= m.valid_at < start  # type: ignore[operator]
        for m in same_pair
    )


def _takes_earlier_start(
    fact: FactRecord, new: StampedFact, embedding: list[float] | None, now: datetime
) -> bool:
    """A restatement that starts earlier (delivered late) moves ``fact``'s start there (kept
    in its start history) and gives it the earliest statement's text, as in event order.
    True when ``fact`` changed."""
    if fact.valid_at is None or new.valid_at >= fact.valid_at:
        return False
    fact.move_start(new.valid_at, now)
    fact.fact = new.fact
    if embedding is not None:
        fact.fact_embedding = embedding
    return True
