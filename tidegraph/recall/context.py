"""The context builder: ``SearchResults`` -> the text an agent reads, within a budget
(docs/retrieval.md "Memory retrieval").

Template (sections without lines are left out; times UTC, a date alone at midnight)::

    MEMORY (valid at 2024-06-01 12:30 UTC, as known at 2024-06-01 12:30 UTC)

    FACTS (when each was true):
    - Alice Smith works at Globex (valid 2024-04-10 – present)
    - Alice Smith works at Acme Corp (valid 2024-01-01 – 2024-04-10, ended)
    - Bob joined the board (valid unknown – present)

    ENTITIES:
    - Alice Smith: software engineer
    - Globex

    COMMUNITIES:
    - Acme people: Alice Smith and Acme Corp, in Paris

    EPISODES:
    - 2024-04-30 msg-e3: Bob had green tea with Alice and talked about her new job.

A fact's dates are those believed at the search's known-at (an end learned later is not
shown); "ended" marks a fact whose end is not after the known-at moment. With
``include_invalid`` the first line reads ``MEMORY (any validity, as known at ...)``. Empty
results give ``NO MEMORY FOUND (valid at ..., as known at ...)``.

Budget: ``max_chars`` characters, and at most ``max_tokens * 4`` (about four characters a
token). Lines are taken by rank across the sections, the best fact, entity, community and
episode first, then the second of each, and so on; a section stops at its first line that
does not fit (so each section is its best lines, in rank order, and shorter lines of other
sections still fill the rest). No line is cut, except an episode excerpt: it is at most
``episode_chars`` characters, and the last one shortened to fit (ending in "…").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from tidegraph.recall.search import SearchResults
from tidegraph.records.asof import AsOf, start_known_at
from tidegraph.records.graph import EpisodeRecord, FactRecord
from tidegraph.records.search import Hit, Kind
from tidegraph.records.times import utc

DEFAULT_MAX_CHARS = 4000
DEFAULT_EPISODE_CHARS = 300
MIN_BUDGET = 120  # the first line and a little more
MIN_EXCERPT = 40  # an episode shortened below this is left out
CHARS_PER_TOKEN = 4
ELLIPSIS = "…"

SECTIONS: tuple[tuple[Kind, str], ...] = (
    ("fact", "FACTS (when each was true):"),
    ("entity", "ENTITIES:"),
    ("community", "COMMUNITIES:"),
    ("episode", "EPISODES:"),
)
_SPACE = re.compile(r"\s+")


@dataclass
class _Section:
    title: str
    lines: list[str] = field(default_factory=list)
    closed: bool = False


def build_context(
    results: SearchResults,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_tokens: int | None = None,
    episodes: bool = True,
    episode_chars: int = DEFAULT_EPISODE_CHARS,
) -> str:
    """The agent's context for ``results`` (see the module docstring for the template and
    the budget)."""
    budget = max_chars if max_tokens is None else min(max_chars, max_tokens * CHARS_PER_TOKEN)
    if budget < MIN_BUDGET:
        raise ValueError(
            f"a context budget of {budget} characters is too small: give at least {MIN_BUDGET} "
            f"(max_chars) or {MIN_BUDGET // CHARS_PER_TOKEN} tokens (max_tokens)"
        )
    if episode_chars < MIN_EXCERPT:
        raise ValueError(f"episode_chars must be at least {MIN_EXCERPT}, got {episode_chars}")
    asof = results.scope.asof
    if len(results) == 0:
        return f"NO MEMORY FOUND ({_moment(asof)})"
    header = f"MEMORY ({_moment(asof)})"
    used = len(header)
    sections = {kind: _Section(title) for kind, title in SECTIONS}
    if not episodes:
        sections["episode"].closed = True
    depth = max(len(results.of(kind)) for kind, _ in SECTIONS)
    for rank in range(depth):
        for kind, _ in SECTIONS:
            section, hits = sections[kind], results.of(kind)
            if section.closed or rank >= len(hits):
                continue
            opening = 0 if section.lines else len(section.title) + 2  # blank line, title
            room = budget - used - opening - 1  # the line's own newline
            if kind == "episode":
                line = _episode_line(hits[rank], episode_chars, room)
            else:
                line = _line(hits[rank], asof)
            if line is None or len(line) > room:
                section.closed = True
                continue
            section.lines.append(line)
            used += opening + len(line) + 1
    parts = [header]
    for kind, _ in SECTIONS:
        section = sections[kind]
        if section.lines:
            parts += ["", section.title, *section.lines]
    return "\n".join(parts)


def _moment(asof: AsOf) -> str:
    known = f"as known at {_when(asof.known_at)}"
    if asof.include_invalid:
        return f"any validity, {known}"
    return f"valid at {_when(asof.valid_at)}, {known}"


def _when(at: datetime) -> str:
    """A date, or a date and time with its zone (the first line)."""
    day = _day(at)
    return day if len(day) == 10 else f"{day} UTC"


def _day(at: datetime) -> str:
    """``2024-06-01`` at midnight UTC, else ``2024-06-01 12:30``."""
    at = utc(at)
    if (at.hour, at.minute, at.second, at.microsecond) == (0, 0, 0, 0):
        return at.strftime("%Y-%m-%d")
    return at.strftime("%Y-%m-%d %H:%M")


def _one_line(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def _line(hit: Hit, asof: AsOf) -> str:
    record = hit.record
    if isinstance(record, FactRecord):
        start = start_known_at(record, asof.known_at)
        end, _ = asof.known_end(record)
        since = _day(start) if start is not None else "unknown"
        until = _day(end) if end is not None else "present"
        ended = ", ended" if end is not None and end <= asof.known_at else ""
        return f"- {_one_line(record.fact)} (valid {since} – {until}{ended})"
    name = _one_line(getattr(record, "name", ""))
    summary = _one_line(getattr(record, "summary", ""))
    return f"- {name}: {summary}" if summary else f"- {name}"


def _episode_line(hit: Hit, excerpt_chars: int, room: int) -> str | None:
    """``- <date> <name>: <excerpt>``: the excerpt at most ``excerpt_chars``, and cut further
    so that the line fits in ``room`` characters (None when less than MIN_EXCERPT of it
    would)."""
    record = hit.record
    assert isinstance(record, EpisodeRecord)
    lead = f"- {_day(record.valid_at)} {_one_line(record.name)}: "
    excerpt = _cut(_one_line(record.content), excerpt_chars)
    space = room - len(lead)
    if len(excerpt) <= space:
        return lead + excerpt
    if space < MIN_EXCERPT:
        return None
    return lead + _cut(excerpt, space)


def _cut(text: str, chars: int) -> str:
    """``text`` in at most ``chars`` characters, ending in an ellipsis when shortened."""
    if len(text) <= chars:
        return text
    return text[: chars - len(ELLIPSIS)].rstrip() + ELLIPSIS
