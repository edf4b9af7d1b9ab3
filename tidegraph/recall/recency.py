"""Recency where a question is about now (docs/retrieval.md "Now and as of").

A feed restates things as they change ("Acme moved to the Pro plan", then months later "we
upgraded Acme to the Enterprise plan"): asked "which plan is Acme on?", the latest statement
is the answer, however well an older one matches the words. Two rules, both LLM-free:

- ``asks_current(query)``: the question is about the present state: it says so ("now",
  "currently", "latest", ...), or it is in the present tense ("is", "are", "does", "has",
  ...) without a word of the past ("did", "was", "used to", ...). A question with a valid-at
  (given, or named by its time words) asks about the state then.
- ``supersede(hits, query)``: the statements of what is asked come first, newest first. The
  subject is what the question writes with capitals inside a sentence (``subject_words``),
  what is asked its other words (``asked_words``); the statements of it are those about the
  subject that say the most of what is asked, and those that name the subject and restate
  it without saying it: they carry a value (a name) that statements of what is asked carry,
  whatever their subject, or a name of the shape of the values the subject's statements of
  it carry, and that no other statement about the subject carries (``_restating``). Only
  the best ``RESTATEMENT_DEPTH`` episodes are reordered, and one found further down when it
  is newer than all of them; the other hits keep their order after them. A question that
  names no subject keeps the rule of shared words: the episodes that contain the most of the
  query's words first, a later one that contains every query word an earlier one contains
  before it. Episodes said after a valid-at are not searched, so the newest is the newest
  said by then.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from tidegraph.records.conversation import split_speaker
from tidegraph.records.graph import EpisodeRecord
from tidegraph.records.search import Hit
from tidegraph.stores.search_text import SEARCH_STOP_WORDS, identifier_words, search_terms

# Restatements are looked for among the best this many episodes: one found lower says the
# question's words in a way the ranking thinks much less of (and the first results, which
# the context shows, are reordered, never filled from further down).
RESTATEMENT_DEPTH = 10

# Words that ask about the present state, and words of the past that say it does not.
NOW_WORDS = frozenset(
    "now currently current latest today still anymore presently nowadays present".split()
)
PRESENT_WORDS = frozenset("is are am isn aren does do doesn don has have hasn haven".split())
PAST_WORDS = frozenset(
    "did didn was wasn were weren had hadn used ago previously formerly originally "
    "before earlier first initially once past".split()
)


_WORD = re.compile(r"[^\W_]+")


def asks_current(query: str) -> bool:
    """Whether ``query`` asks about the present state (see the module docstring)."""
    words = set(_WORD.findall(query.lower()))
    if words & NOW_WORDS:
        return True
    if words & PAST_WORDS:
        return False
    return bool(words & PRESENT_WORDS)


def _stem(word: str) -> str:
    """A plural's singular, enough to compare which query words two texts contain."""
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


# A word as the comparisons here read it: letters only (the search splits at digits too).
_LETTERS = re.compile(r"[^\W\d_]+")


def _term(word: str) -> str | None:
    """A word as a search term, stemmed; None for a stop word."""
    word = word.lower()
    return None if word in SEARCH_STOP_WORDS else _stem(word)


_DIGIT = re.compile(r"\d")
# Texts whose words are kept (an episode's are compared with several others in one search,
# and the best episodes come back in the next searches).
WORDS_CACHED = 4096


@functools.lru_cache(maxsize=WORDS_CACHED)
def _words(text: str) -> frozenset[str]:
    """The search terms of ``text``, stemmed, with its identifiers' words
    (``search_text.identifier_words``: a query that names ``NW-1002`` is about it)."""
    words = {t for w in _LETTERS.findall(text) if (t := _term(w))}
    if _DIGIT.search(text):
        words.update(identifier_words(text))
    return frozenset(words)


# A word written with a capital inside a sentence: a name (the first word of a sentence is
# capitalised whatever it is).
_SENTENCE_WORD = re.compile(r"(?:^|(?<=[.!?]\s))\s*([^\W\d_]+)|([^\W\d_]+)")


def subject_words(query: str, ignore: str = "") -> frozenset[str]:
    """The words of ``query`` that name what it is about: those written with a capital
    inside a sentence ("Which plan is Acme Corp on?": acme, corp), less the words of
    ``ignore`` (the time phrase: "in March 2024" names a time, not a subject)."""
    return _capitalised(query)[0] - _words(ignore)


@functools.lru_cache(maxsize=WORDS_CACHED)
def _capitalised(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """The words written with a capital inside a sentence of ``text``, and its sentences'
    first words written with one (capitalised whatever they are)."""
    inside: set[str] = set()
    first: set[str] = set()
    for match in _SENTENCE_WORD.finditer(text):
        word = match.group(2) or match.group(1)
        if word[0].isupper() and (term := _term(word)):
            (inside if match.group(2) else first).add(term)
    return frozenset(inside), frozenset(first)


# A token of a name or a number; tokens of one name are apart by spaces or commas only.
_TOKEN = re.compile(r"[^\W_]+")
_WITHIN_NAME = re.compile(r"[\s,]*")


@functools.lru_cache(maxsize=WORDS_CACHED)
def _name_runs(text: str) -> tuple[tuple[tuple[int, bool], frozenset[str]], ...]:
    """The names of ``text`` with their shape: each run of words written with a capital and
    numbers ("Tom Becker", "88 Mill Lane, Bristol", "Pro"), as (how many words, whether it
    holds a number) and its words. A sentence's first word starts a run only when the next
    word continues it (a capitalised first word alone is any word)."""
    tokens = list(_TOKEN.finditer(text))
    first = {m.start(1) for m in _SENTENCE_WORD.finditer(text) if m.group(1)}
    runs: list[list[str]] = []
    previous_end = -1
    for n, token in enumerate(tokens):
        word = token.group()
        named = word[0].isupper() or word.isdigit()
        if named and token.start() in first and not word.isdigit():
            following = tokens[n + 1] if n + 1 < len(tokens) else None
            named = following is not None and following.group()[0].isupper()
        if not named:
            previous_end = -1
            continue
        gap = text[previous_end : token.start()] if previous_end >= 0 else None
        if gap is not None and _WITHIN_NAME.fullmatch(gap):
            runs[-1].append(word)
        else:
            runs.append([word])
        previous_end = token.end()
    return tuple(
        (
            (sum(not w.isdigit() for w in run), any(w.isdigit() for w in run)),
            frozenset(t for w in run if not w.isdigit() and (t := _term(w))),
        )
        for run in runs
    )


def _body(hit: Hit) -> str:
    record = hit.record
    if isinstance(record, EpisodeRecord):
        return split_speaker(record.source, record.content)[1]
    return hit.text


def asked_words(query: str, ignore: str = "") -> str:
    """What ``query`` asks of the subject it names, as search text: its words less the
    subject's (``subject_words``) and the time phrase's; "" when it names no subject or asks
    nothing else of it."""
    names = subject_words(query, ignore)
    if not names:
        return ""
    skipped = set(search_terms(ignore))
    rest = [t for t in search_terms(query) if _stem(t) not in names and t not in skipped]
    return " ".join(rest)


def supersede(
    hits: Sequence[Hit],
    query: str,
    depth: int = RESTATEMENT_DEPTH,
    ignore: str = "",
    stating: Sequence[Hit] = (),
) -> list[Hit]:
    """Hits reordered so that the newest statement of what is asked comes first (see the
    module docstring): ``ignore`` is the query's time phrase, ``stating`` the episodes a
    search for ``asked_words`` found (any subject's statements of what is asked). Scores are
    kept (the fusion's)."""
    terms = {_stem(t) for t in search_terms(query)}
    if not terms:
        return list(hits)
    names = subject_words(query, ignore) & terms
    asked = terms - names
    at = {i: h.record.valid_at for i, h in enumerate(hits) if isinstance(h.record, EpisodeRecord)}
    episodes = list(at)
    words = {i: _words(hits[i].text) for i in episodes}
    about = [i for i in episodes if names and names <= words[i]]
    most = max((len(asked & words[i]) for i in episodes), default=0) if about else 0
    if not most:
        return _by_shared_words(hits, terms, words, at, depth)
    # What is asked: the statements about the subject that say the most of the rest of the
    # question; any subject's statements that say as much carry the values it takes.
    group = {i for i in about if len(asked & words[i]) == most}
    stated = [_body(hits[i]) for i in episodes if len(asked & words[i]) == most]
    stated += [_body(h) for h in stating if len(asked & _words(h.text)) == most]
    values = frozenset().union(*map(_words, stated)) - terms
    value_names = frozenset().union(*(_capitalised(text)[0] for text in stated))
    # Restating without saying it, a statement names the subject in what it says: one that
    # a speaker of that name said is about the speaker's many things.
    naming = [i for i in about if names <= _words(_body(hits[i]))]
    group |= _restating(hits, naming, group, terms, values, value_names, names)
    # The best ``depth`` hits are reordered; one found further down comes up only when it is
    # later than all of them (a newer restatement the ranking thought less of).
    newest = max((at[i] for i in group if i < depth), default=None)
    kept = [i for i in group if i < depth or (newest is not None and at[i] > newest)]
    kept.sort(key=lambda i: (at[i], hits[i].uuid), reverse=True)
    chosen = set(kept)
    return [hits[i] for i in kept] + [h for i, h in enumerate(hits) if i not in chosen]


def _restating(
    hits: Sequence[Hit],
    about: list[int],
    group: set[int],
    terms: set[str],
    values: frozenset[str],
    value_names: frozenset[str],
    names: frozenset[str],
) -> set[int]:
    """The statements that name the subject (``about``) that restate what is asked without
    saying it: each carries a name that no other statement about the subject outside the
    group carries, and that is a value of what is asked: among ``values`` (a word written
    with a capital inside a sentence, or a sentence's first word that ``value_names`` knows
    as one), or of the shape of a name the group's statements carry besides the subject's
    (``_name_runs``: "Tom Becker" where the group says "Dana Reyes", "44 Elm Avenue, Austin"
    where it says "5 Canal Street, Ghent"); one at a time, a joined statement's words counting
    as values (its names' shapes do not: the group's own statements say what is asked),
    until none joins."""
    bodies = {i: _body(hits[i]) for i in set(about) | group}
    said = {i: _words(body) - terms for i, body in bodies.items()}
    carried: dict[int, frozenset[str]] = {}
    for i in about:
        inside, first = _capitalised(bodies[i])
        carried[i] = (inside | (first & value_names)) & said[i]
    runs = {i: [r for r in _name_runs(body) if not r[1] & names] for i, body in bodies.items()}
    joined = set(group)
    known = set(values).union(*(said[i] for i in joined))
    shapes = {shape for i in joined for shape, _ in runs[i]}
    # How many statements about the subject outside the group say each word: a word is
    # carried by another when its count is more than the statement's own.
    outside = Counter(w for i in about if i not in joined for w in said[i])
    while True:
        found = next(
            (
                i
                for i in about
                if i not in joined
                and (
                    any(outside[w] == 1 for w in carried[i] & known)
                    or any(
                        run and shape in shapes and all(outside[w] == 1 for w in run)
                        for shape, run in runs[i]
                    )
                )
            ),
            None,
        )
        if found is None:
            return joined - group
        joined.add(found)
        known |= said[found]
        outside.subtract(said[found])


def _by_shared_words(
    hits: Sequence[Hit],
    terms: set[str],
    words: dict[int, frozenset[str]],
    at: dict[int, datetime],
    depth: int,
) -> list[Hit]:
    """Without a subject to group by: the episodes (``words``, said ``at``) that contain the
    most of the query's words first, a later one that contains every query word an earlier
    one contains before it; among the first ``depth`` hits, and a later one from further
    down."""
    said = {i: (at[i], frozenset(terms & w)) for i, w in words.items()}
    first = range(min(depth, len(hits)))
    most = max((len(said[i][1]) for i in first if i in said), default=0)
    if not most:
        return list(hits)
    tier = [i for i in first if i in said and len(said[i][1]) == most]
    newest = max(said[i][0] for i in tier)
    best = tier + [
        i
        for i in range(len(first), len(hits))
        if i in said and said[i][0] > newest and any(said[t][1] <= said[i][1] for t in tier)
    ]
    ordered: list[Hit] = []
    left = list(best)
    while left:
        top = left[0]
        when, covered = said[top]
        later = [i for i in left if said[i][0] > when and covered <= said[i][1]]
        if later:
            top = max(later, key=lambda i: (said[i][0], hits[i].uuid))
        ordered.append(hits[top])
        left.remove(top)
    chosen = set(best)
    return ordered + [h for i, h in enumerate(hits) if i not in chosen]
