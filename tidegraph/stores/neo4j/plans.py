"""Statements of the Neo4j store that keep their Cypher plan, and what the store plans them
with when it starts.

Neo4j (5.26, measured) caches a plan by the statement, the size class of each list and string
parameter (empty, 1, 2-10, 11-100, 101-1000, more) and whether the transaction has written
yet; it plans a statement again once the statistics it was planned with have moved (every few
seconds on a store that grows), and drops every cached plan when an index is created or
dropped. A plan of the write path's statements costs from tens of milliseconds to more than a
second of the server's CPU, so on a store that grows the write path spent most of Neo4j's CPU
planning, and a first forget after an ingest paid seconds of it.

A statement that keeps its plan (``kept_plan``) therefore:

- starts with ``KEEP_PLAN``: Neo4j uses the plan it cached whatever the statistics say since,
  and plans only when it has none;
- reads its parameters from one map, ``$p``, whose contents do not enter the cache key: one
  plan per statement (and per transaction written or not), whatever the sizes of its lists
  and strings. Callers pass the parameters as for any statement; the executor puts them in
  that map (``bound_params``);
- names the index of every lookup the statistics could steer (``USING INDEX``, or a
  uniqueness constraint's), so that a plan made on an empty store stays right on a large one;
- is planned when the store starts (``Neo4jStore._plan_ahead``): run for real on a group no one
  has (``PLANS_AHEAD_GROUP``) and records that do not exist (``stand_ins``), in a transaction
  that is rolled back when it writes.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from tidegraph.records.graph import EntityRecord, EpisodeRecord, FactRecord

KEEP_PLAN = "CYPHER replan=skip\n"
_PARAMETER = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")

# The group the store plans its statements on when it starts (no one's: nothing matches, and
# what writes is rolled back), and the uuid, name and text of what it plans them with.
PLANS_AHEAD_GROUP = "tidegraph plans ahead"
NO_RECORD = "no such record"


def kept_plan(statement: str) -> str:
    """``statement`` keeping its plan (above): ``KEEP_PLAN`` first, and each of its parameters
    ``$name`` read as ``$p.name``."""
    return KEEP_PLAN + _PARAMETER.sub(r"$p.\1", statement)


def bound_params(statement: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters ``statement`` is run with: a kept plan's in its one map ``$p``, any
    other's as they are (the executor's one place for this)."""
    return {"p": params} if statement.startswith(KEEP_PLAN) else params


def stand_ins(when: datetime) -> tuple[EntityRecord, FactRecord, EpisodeRecord]:
    """An entity, a fact and a message of ``PLANS_AHEAD_GROUP`` that no one has, for running
    the statements that take records when the store starts."""
    group_id, nothing = PLANS_AHEAD_GROUP, NO_RECORD
    entity = EntityRecord(uuid=nothing, group_id=group_id, name=nothing, created_at=when)
    fact = FactRecord(
        uuid=nothing,
        group_id=group_id,
        source_uuid=nothing,
        target_uuid=nothing,
        name="PLANS_AHEAD",
        fact=nothing,
        episodes=[nothing],
        valid_at=when,
        created_at=when,
    )
    episode = EpisodeRecord(
        uuid=nothing,
        group_id=group_id,
        name=nothing,
        source="message",
        source_description=nothing,
        content=nothing,
        valid_at=when,
    )
    return entity, fact, episode
