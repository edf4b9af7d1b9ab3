"""What is searchable of an episode (docs/retrieval.md "Conversation-aware episode
search"): the stored content stays exactly what was sent; the stores index these fields
beside it, and the pipelines embed ``embed_text``.

A ``message`` episode's content is read as ``Speaker: what was said`` (the convention of chat
feeds); its fields are:

- ``body``: what was said, without the speaker's name;
- ``speaker``: the name before the colon, searched apart (a query word that names one of the
  group's speakers matches the speaker, never the words of a turn: "Bye Caroline!" is no
  answer to a question about Caroline);
- ``when``: the date it was said in words ("Monday 8 May 2023"), so a question naming a
  month, a weekday or a year finds it;
- ``context``: the bodies of the turns it answers: the ``CONTEXT_TURNS`` messages said before
  it in the same thread (the group's messages with the same ``source_description``) within
  ``CONTEXT_WITHIN``, oldest first, so that "about three years now" is found by the question
  "how long have you had the dogs?" that it answers.

Every other episode (text, json) is searched by its whole content, with its date in words.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from tidegraph.records.times import utc

# Longest episode text embedded for episode search (characters; the embedders cut by tokens).
EPISODE_EMBED_CHARS = 2000
# A reply answers what was said just before it: the turns indexed as a message's context are
# at most this many, said at most this long before it (a channel where many subjects are
# discussed over a day interleaves them: what was said an hour earlier is seldom what a
# message answers).
CONTEXT_TURNS = 3
CONTEXT_WITHIN = timedelta(minutes=15)

# "Name: text": a name of at most 64 characters and 5 words, starting with a letter, without
# a colon or a line break, then ": " (a colon followed by a space: "https://x" is no speaker).
_SPEAKER = re.compile(r"^\s*([^\W\d_][^:\n]{0,63}?)\s*:\s+(?=\S)")
_MAX_NAME_WORDS = 5


@dataclass(frozen=True)
class SearchFields:
    """What the fulltext index holds of one episode (see the module docstring)."""

    body: str
    speaker: str
    when: str
    context: str = ""


def split_speaker(source: str, content: str) -> tuple[str, str]:
    """(speaker, what was said) of a message episode ``Speaker: text``; ("", content) for any
    other episode, or a message without a speaker."""
    if source != "message":
        return "", content
    match = _SPEAKER.match(content)
    if match is None or len(match.group(1).split()) > _MAX_NAME_WORDS:
        return "", content
    return match.group(1), content[match.end() :]


def date_words(at: datetime) -> str:
    """The day in words, in UTC: ``Monday 8 May 2023``."""
    return _day_words(utc(at).date())


@functools.lru_cache(maxsize=4096)  # every episode's index asks its day: a feed's few days
def _day_words(day: date) -> str:
    return f"{day:%A} {day.day} {day:%B} {day.year}"


def search_fields(
    source: str, content: str, valid_at: datetime, preceding: list[str] | None = None
) -> SearchFields:
    """The indexed fields of an episode; ``preceding``: the bodies of the turns it answers,
    oldest first (``thread_context``)."""
    speaker, body = split_speaker(source, content)
    return SearchFields(body, speaker, date_words(valid_at), " ".join(preceding or []))


def thread_context(bodies_newest_first: list[str]) -> list[str]:
    """The context of a turn from the bodies of the messages before it in its thread and
    bound (newest first, as a store reads them): at most ``CONTEXT_TURNS``, oldest first."""
    return list(reversed(bodies_newest_first[:CONTEXT_TURNS]))


def embed_text(source: str, content: str, valid_at: datetime) -> str:
    """What is embedded for episode search: a message as ``Speaker (Monday 8 May 2023): text``
    (who and when say much of what a turn is about), any other episode as ``(date) content``;
    at most ``EPISODE_EMBED_CHARS``."""
    speaker, body = split_speaker(source, content)
    when = date_words(valid_at)
    text = f"{speaker} ({when}): {body}" if speaker else f"({when}) {content}"
    return text[:EPISODE_EMBED_CHARS]
