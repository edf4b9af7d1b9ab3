"""Episode search on its conversation fields, the same rules for every store (docs/retrieval.md
"Conversation-aware episode search"; the fields: ``tidegraph.records.conversation``).

A query's words (``search_text.search_terms``) are split in two: those that are a word of one
of the group's speakers' names (``names``) and the others (``words``). A turn matches on its
``words`` in its body, its context or its date in words; ``names`` only add to the score of a
turn that matches, when it was said by that speaker. So a question about Caroline finds what
Caroline said about the subject first, and never a turn that shares nothing with the question
but her name ("Bye Caroline!"). A query of names only ("Caroline") is searched as words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tidegraph.stores.search_text import search_terms

# The fields' boosts in the Lucene query (Neo4j), against the body's 1. Lucene scores each
# field apart, with its own length: a speaker's name is a field of a word or two, a context
# one of three turns. (SQLite's FTS5 scores the row as one text, with column weights:
# sqlite/db.py BM25_WEIGHTS.) Measured on LoCoMo with BM25 alone (docs/retrieval.md
# "Retrieval figures").
LUCENE_SPEAKER_BOOST = 2.0
LUCENE_CONTEXT_BOOST = 0.5
LUCENE_WHEN_BOOST = 1.0

_LUCENE_SPECIAL = re.compile(r'([+\-!(){}\[\]^"~*?:\\/&|])')


@dataclass(frozen=True)
class EpisodeQuery:
    """A query's words as an episode search uses them (see the module docstring)."""

    words: list[str]
    names: list[str]


def episode_query(text: str, speaker_words: Iterable[str]) -> EpisodeQuery | None:
    """The query's ``words`` and ``names`` given the group's speakers' name words (None: the
    text has nothing searchable)."""
    terms = search_terms(text)
    if not terms:
        return None
    speakers = set(speaker_words)
    names = [t for t in terms if t in speakers]
    words = [t for t in terms if t not in speakers]
    if not words:  # a query about the speaker alone
        return EpisodeQuery(names, [])
    return EpisodeQuery(words, names)


def speaker_words(speaker: str) -> list[str]:
    """The words of a speaker's name as queries are split (``search_terms``)."""
    return search_terms(speaker)


def _escaped(terms: list[str]) -> str:
    return " ".join(_LUCENE_SPECIAL.sub(r"\\\1", t) for t in terms)


def lucene_episode_query(query: EpisodeQuery, fields: tuple[str, str, str, str, str]) -> str:
    """The Lucene query over the episode index's (body, speaker, context, when, ids) fields:
    one of the words required in body, context, when or the body's identifier words; names
    optional, on the speaker."""
    body, speaker, context, when, ids = fields
    words = _escaped(query.words)
    required = (
        f"+({body}:({words}) {context}:({words})^{LUCENE_CONTEXT_BOOST} "
        f"{when}:({words})^{LUCENE_WHEN_BOOST} {ids}:({words}))"
    )
    if not query.names:
        return required
    return f"{required} {speaker}:({_escaped(query.names)})^{LUCENE_SPEAKER_BOOST}"
