"""Fact dedupe and contradiction on the two timelines (design §3). Pure logic, no I/O.

Given the facts an episode states (already stamped on T) and the stored facts that share an
endpoint with them, decide per new fact, in episode order:

- **closing record** (``closes``): every fact of subject+relation(+object) valid at t is
  closed at t, and the end is stored as a fact valid from t to t (valid at no time), so that a
  fact started before t and delivered after the closing record is born closed at t;
- **duplicate**: a stored fact with the same endpoints and relation that is valid at the new
  fact's valid_at (or that the LLM named as duplicate) gains the episode; nothing else changes.
  For cardinality ``one`` only the same start counts: a value restated later starts a fact
  of its own (the earlier one ends there), so a late change between the two splits correctly;
- **contradiction**: candidates are only facts sharing an endpoint and a compatible relation
  (cardinality ``one``: same subject and relation; LLM facts: what the LLM named among facts
  sharing an endpoint). A candidate that started at or before the new fact and is still
  valid then is closed at new.valid_at; one that starts later bounds the new fact, which is
  then stored already closed (a late arrival);
- ``expired_at`` (T') is set once: when a fact is first closed, or at creation for a fact
  born closed. ``invalid_at`` may only move earlier (a late fact tightens an interval); when
  it moves, the end it replaces is kept with the time it was learned (``prior_ends``), so
  that "as known at k" still answers with what was believed at k.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from processors.models import FactRecord, normalize_name, stable_uuid
from processors.temporal import StampedFact
from tidegraph.store.base import FactClosure


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
    # Copies (the caller's records stay as they were); only the episode lists are mutated,
    # so the embeddings are shared rather than deep-copied.
    state = {f.uuid: f.model_copy(update={"episodes": list(f.episodes)}) for f in existing}
    stored = set(state)
    plan = FactPlan()
    touched: set[str] = set()
    embeddings = embeddings or {}
    decisions = decisions or {}

    def close(target: FactRecord, at: datetime, *, counted: bool = True) -> None:
        if target.invalid_at is not None and target.invalid_at <= at:
            return
        target.move_end(at, now)
        plan.closed += counted
        if target.uuid in stored:
            plan.closures[target.uuid] = FactClosure.of(target)

    for i, new in enumerate(stamped):
        t = new.valid_at
        same_pair = [
            f for f in state.values() if f.source_uuid == new.source_uuid and f.name == new.relation
        ]
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
                    cardinality=new.cardinality,  # type: ignore[arg-type]
                )
                state[marker.uuid] = marker
                touched.add(marker.uuid)
            elif episode_uuid not in marker.episodes:
                marker.episodes.append(episode_uuid)
                touched.add(marker.uuid)
            continue

        decision = decisions.get(i, FactDecision())
        duplicate = _find_duplicate(new, same_pair, decision, state)
        if duplicate is not None:
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
            cardinality=new.cardinality,  # type: ignore[arg-type]
        )
        if new.cardinality == "one":
            rivals = same_pair
        elif new.cardinality == "many":
            # Only the recorded ends of this very fact (closing records) can bound it.
            rivals = [f for f in same_pair if _is_end(f, record.target_uuid, f.valid_at)]
        else:
            endpoints = {new.source_uuid, new.target_uuid}
            rivals = [
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
        state[record.uuid] = record
        touched.add(record.uuid)

    for uuid in sorted(touched):
        plan.facts[uuid] = state[uuid]
    return plan


def _is_end(fact: FactRecord, target: str, at: datetime | None) -> bool:
    """A recorded end (a closing record's fact, valid from ``at`` to ``at``) of ``target``."""
    return fact.target_uuid == target and fact.valid_at == at == fact.invalid_at


def _find_duplicate(
    new: StampedFact,
    same_pair: list[FactRecord],
    decision: FactDecision,
    state: dict[str, FactRecord],
) -> FactRecord | None:
    if decision.duplicate_of and decision.duplicate_of in state:
        candidate = state[decision.duplicate_of]
        if {candidate.source_uuid, candidate.target_uuid} & {new.source_uuid, new.target_uuid}:
            return candidate
    for f in sorted(same_pair, key=lambda f: (f.valid_at is None, f.valid_at, f.uuid)):
        if f.target_uuid != (new.target_uuid or new.source_uuid) or not valid_at_time(
            f, new.valid_at
        ):
            continue
        if new.cardinality == "one":
            # Only the same change restated (same start) is a duplicate. A later restatement
            # of the value starts a fact of its own: were it merged into the earlier one, a
            # late change arriving between the two would close the value for good (a ticket
            # reopened, then its closing delivered late, would stay closed).
            if f.valid_at == new.valid_at:
                return f
            continue
        if new.cardinality is not None or normalize_name(f.fact) == normalize_name(new.fact):
            return f
    return None
