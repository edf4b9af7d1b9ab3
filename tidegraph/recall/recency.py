"""Recency where a question is about now (docs/retrieval.md "Now and as of").

A feed restates things as they change ("Acme moved to the Pro plan", then months later "we
upgraded Acme to the Enterprise plan"): asked "which plan is Acme on?", the latest statement
is the answer, however well an older one matches the words. Two rules, both LLM-free:

- ``asks_current(query)``: the question is about the present state: it says so ("now",
  "currently", "latest", ...), or it is in the present tense ("is", "are", "does", "has",
  ...) without a word of the past ("did", "was", "used to", ...). A question with a valid-at
  (given, or named by its time words) asks about the state then.
- ``supersede(hits, query)``: the ranked episodes that contain the most of the query's words
  come first (a statement of what is asked, not another attribute of the same subject), and
  among them a later one that contains every query word an earlier one contains restates it:
  it takes the earlier one's place, and the earlier one follows it. So the newest statement
  of what the question asks comes first (the newest said by the valid-at, since episodes said
  later are not searched then). The other hits keep their order after them. Only the best
  ``RESTATEMENT_DEPTH`` episodes are reordered.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tidegraph.records.graph import EpisodeRecord
from tidegraph.records.search import Hit
from tidegraph.stores.search_text import search_terms, text_words

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


def supersede(hits: Sequence[Hit], query: str, depth: int = RESTATEMENT_DEPTH) -> list[Hit]:
    """Hits reordered so that a later restatement comes before what it restates (see the
    module docstring): among the first ``depth``, and a later restatement of one of them
    found further down; the others keep their order. Scores are kept (the fusion's)."""
    terms = {_stem(t) for t in search_terms(query)}
    if not terms:
        return list(hits)

    def covers(hit: Hit) -> frozenset[str]:
        return frozenset(terms & {_stem(w) for w in text_words(hit.text)})

    said = {
        i: (h.record.valid_at, covers(h))
        for i, h in enumerate(hits)
        if isinstance(h.record, EpisodeRecord)
    }
    first = range(min(depth, len(hits)))
    most = max((len(said[i][1]) for i in first if i in said), default=0)
    if not most:
        return list(hits)
    # What says the most of the question comes first; among it, a restatement before what it
    # restates, also one found further down. Everything else keeps its order after it.
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
        at, words = said[top]
        later = [i for i in left if said[i][0] > at and words <= said[i][1]]
        if later:
            top = max(later, key=lambda i: (said[i][0], hits[i].uuid))
        ordered.append(hits[top])
        left.remove(top)
    chosen = set(best)
    return ordered + [h for i, h in enumerate(hits) if i not in chosen]
