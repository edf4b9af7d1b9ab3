"""What the memory's lifecycle calls answer (``Memory.forget``, ``episodes``, ``episode``,
``groups``, ``changes``): plain records with their JSON, one spelling for the CLI, HTTP and
MCP, and the opaque cursors that page through episodes and follow the change stream.

A cursor is what the previous page answered, given back unchanged: an episode cursor is the
last entry's (time, uuid); a change cursor is the group's last ``seq`` seen (a number, so that
a consumer can also store it as one). A cursor that was not made here is refused with
``BadCursor`` (a 400), never half-read.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Literal

import orjson

from tidegraph.records.changes import Change
from tidegraph.records.graph import EntityRecord, EpisodeEntry, FactRecord
from tidegraph.records.times import utc, within_range

EpisodeStatus = Literal["written", "not_extracted", "forgotten", "dead_lettered"]
EPISODE_STATUSES: tuple[str, ...] = ("written", "not_extracted", "forgotten", "dead_lettered")
MAX_PAGE = 1000
_CURSOR_PREFIX = "ep1."


class BadCursor(ValueError):
    """A cursor this memory did not give out (or for another group)."""


def episode_cursor(group_id: str, entry: EpisodeEntry) -> str:
    """The cursor after ``entry`` in its group's listing."""
    at = entry.forgotten_at if entry.status == "forgotten" else entry.valid_at
    data = orjson.dumps([group_id, at.isoformat() if at else None, entry.uuid])
    return _CURSOR_PREFIX + base64.urlsafe_b64encode(data).decode().rstrip("=")


def read_episode_cursor(cursor: str, group_id: str) -> tuple[datetime, str]:
    """(time, uuid) of a cursor ``episode_cursor`` gave for ``group_id``."""
    if not cursor.startswith(_CURSOR_PREFIX) or len(cursor) > 2048:
        raise BadCursor("cursor: not a cursor of this listing (give back next_cursor unchanged)")
    text = cursor[len(_CURSOR_PREFIX) :]
    try:
        data = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        group, at, uuid = data
        if not (isinstance(group, str) and isinstance(at, str) and isinstance(uuid, str)):
            raise ValueError("fields")
        moment = within_range(datetime.fromisoformat(at))  # a forged one may be out of range
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise BadCursor(
            "cursor: not a cursor of this listing (give back next_cursor unchanged)"
        ) from None
    if group != group_id:
        raise BadCursor("cursor: it pages another group's listing")
    return moment, uuid


@dataclass(frozen=True)
class EpisodeView:
    """One episode as a listing shows it (a tombstone: uuid and when it was forgotten; a
    dead letter: the producer id and why it failed)."""

    uuid: str
    episode_id: str
    status: EpisodeStatus
    name: str = ""
    source: str = ""
    reference_time: str | None = None
    created_at: str | None = None
    forgotten_at: str | None = None
    not_extracted: str | None = None
    reason: str | None = None  # a dead letter's reason (and stage, message)
    stage: str | None = None
    message: str | None = None
    content: str | None = None  # with ``content=True`` only

    @classmethod
    def of(cls, entry: EpisodeEntry, *, content: bool = False) -> EpisodeView:
        return cls(
            uuid=entry.uuid,
            episode_id=entry.producer_id,
            status=entry.status,
            name=entry.name,
            source=entry.source,
            reference_time=_iso(entry.valid_at) if entry.status != "forgotten" else None,
            created_at=_iso(entry.created_at),
            forgotten_at=_iso(entry.forgotten_at),
            not_extracted=entry.not_extracted,
            content=entry.content if content and entry.status != "forgotten" else None,
        )

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}


@dataclass(frozen=True)
class EpisodePage:
    group_id: str
    status: str | None
    episodes: list[EpisodeView]
    next_cursor: str | None  # None: this was the last page
    source: str = "store"  # where dead letters were read from

    def as_json(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "status": self.status,
            "episodes": [e.as_json() for e in self.episodes],
            "next_cursor": self.next_cursor,
            "source": self.source,
        }


@dataclass(frozen=True)
class EpisodeDetailView:
    """One episode and what it produced: the entities it mentions and the facts it supports
    (currently valid or not)."""

    episode: EpisodeView
    entities: list[EntityRecord] = field(default_factory=list)
    facts: list[FactRecord] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            **self.episode.as_json(),
            "entities": [
                {"uuid": e.uuid, "name": e.name, "labels": e.labels, "key": e.key}
                for e in self.entities
            ],
            "facts": [
                {
                    "uuid": f.uuid,
                    "relation": f.name,
                    "fact": f.fact,
                    "valid_at": _iso(f.valid_at),
                    "invalid_at": _iso(f.invalid_at),
                    "created_at": _iso(f.created_at),
                    "expired_at": _iso(f.expired_at),
                    "supported_by": len(f.episodes),
                }
                for f in self.facts
            ],
        }


@dataclass(frozen=True)
class GroupView:
    """A group the caller may read, and what it holds."""

    group_id: str
    episodes: int = 0
    entities: int = 0
    facts: int = 0
    changes: int = 0  # the change stream's last seq (its cursor's end)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ChangePage:
    """A group's changes after a cursor, in commit order; ``cursor`` is the last seq given
    (pass it back as ``after``)."""

    group_id: str
    changes: list[Change]
    cursor: int

    def as_json(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "changes": [c.model_dump(mode="json") for c in self.changes],
            "cursor": self.cursor,
        }


@dataclass(frozen=True)
class ForgetResult:
    """What a forget did: ``forgotten`` (in this process), ``dry_run`` (what would go,
    nothing written), ``queued`` (a forget record on the input topic: the worker that owns the
    group runs it in the group's order)."""

    group_id: str
    status: Literal["forgotten", "dry_run", "queued"]
    episodes: list[str] = field(default_factory=list)
    forgotten: int = 0
    facts_removed: int = 0
    facts_changed: int = 0
    entities_removed: int = 0
    entities_changed: int = 0
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _iso(value: datetime | None) -> str | None:
    return utc(value).isoformat() if value is not None else None
