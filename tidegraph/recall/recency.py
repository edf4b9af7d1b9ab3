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
  it without saying it (``_restating``): they carry a value that no other statement about
  the subject carries. What a value is does not depend on its case or its shape: the slots
  of the templates among the episodes found (``slots``: the words that differ between
  statements alike, "marking <name> as _" holding "trial" and "churned"), and a value is
  what the statements of what is asked fill a slot with, or what fills a slot with such a
  value. The statements that carry the values found are searched for too (``value_words``,
  the search's ``lexicon``), so that the templates the subject's statements use are seen
  with other values. A turn that names one of the conversation's speakers restates nothing
  of theirs (it speaks to them). Only the best ``RESTATEMENT_DEPTH`` episodes are
  reordered, and one found further down when it is newer than all of them (or when none of
  them is a statement of what is asked); the other hits keep their order after them. A
  question that names no subject keeps the rule of shared words: the episodes that contain
  the most of the query's words first, a later one that contains every query word an
  earlier one contains before it. Episodes said after a valid-at are not searched, so the
  newest is the newest said by then.
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
# The words of values searched for at most (``value_words``).
VALUE_WORDS = 32
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


# A token of a name or a number; tokens of one name are apart by spaces or commas only; a
# sentence ends at a full stop, a question or exclamation mark or a semicolon.
_TOKEN = re.compile(r"[^\W_]+")
_WITHIN_NAME = re.compile(r"[\s,]*")
_SENTENCE_END = re.compile(r"[.!?;]")


@functools.lru_cache(maxsize=WORDS_CACHED)
def _sentences(text: str) -> tuple[tuple[str | tuple[str, ...], ...], ...]:
    """``text`` as sentences of symbols: a word in lower case, or a name as the tuple of its
    tokens: a run of words written with a capital and numbers ("Tom Becker", "88 Mill Lane,
    Bristol", "Pro"). A sentence's first word starts a name only when the next word continues
    it (a capitalised first word alone is any word)."""
    tokens = list(_TOKEN.finditer(text))
    first = {m.start(1) for m in _SENTENCE_WORD.finditer(text) if m.group(1)}
    sentences: list[list[str | tuple[str, ...]]] = [[]]
    previous_end = -1
    for n, token in enumerate(tokens):
        if previous_end >= 0 and _SENTENCE_END.search(text, previous_end, token.start()):
            sentences.append([])
        word = token.group()
        named = word[0].isupper() or word.isdigit()
        if named and token.start() in first and not word.isdigit():
            following = tokens[n + 1] if n + 1 < len(tokens) else None
            named = following is not None and following.group()[0].isupper()
        sentence = sentences[-1]
        gap = text[previous_end : token.start()] if previous_end >= 0 else ""
        if named and sentence and isinstance(sentence[-1], tuple) and _WITHIN_NAME.fullmatch(gap):
            sentence[-1] = (*sentence[-1], word)
        else:
            sentence.append((word,) if named else word.lower())
        previous_end = token.end()
    return tuple(tuple(sentence) for sentence in sentences if sentence)


# A frame: the symbols on each side of a word up to the nearest word that carries meaning
# (a search term that is no name), or to the sentence's start ("^") or end ("$"); a name
# stands for any name.
Frame = tuple[tuple[str, ...], tuple[str, ...]]
_NAME = "<name>"
_START, _END = "^", "$"


def _plain(symbol: str | tuple[str, ...]) -> str:
    return _NAME if isinstance(symbol, tuple) else symbol


def _meaning(symbol: str | tuple[str, ...]) -> bool:
    """Whether a symbol is a word that carries meaning (no name, no stop word, no number)."""
    return isinstance(symbol, str) and symbol.isalpha() and _term(symbol) is not None


def _filler(symbol: str | tuple[str, ...]) -> frozenset[str]:
    """The search terms a symbol fills a slot with: a word's, or a name's words (none for a
    stop word or a number)."""
    if isinstance(symbol, tuple):
        return frozenset(t for w in symbol if not w.isdigit() and (t := _term(w)))
    return frozenset({term}) if _meaning(symbol) and (term := _term(symbol)) else frozenset()


# How many words of meaning a frame holds, on both sides together (fewer only at a sentence's
# start and end): a single word beside a slot is shared by templates of other things ("^ _
# status" holds "account" in "account status update" and a name in "Acme status is ...").
FRAME_WORDS = 2


def _side(symbols: Sequence[str | tuple[str, ...]], words: int, edge: str) -> list[str]:
    """The symbols of one side of a slot, nearest first, up to its ``words``-th word of
    meaning, or to ``edge`` (the sentence's start or end)."""
    side: list[str] = []
    for symbol in symbols:
        side.append(_plain(symbol))
        words -= _meaning(symbol)
        if not words:
            return side
    return [*side, edge]


def _names(texts: Sequence[str]) -> frozenset[tuple[str, ...]]:
    """The names written with capitals among ``texts``, as their words in lower case."""
    return frozenset(
        tuple(w.lower() for w in symbol)
        for text in texts
        for sentence in _sentences(text)
        for symbol in sentence
        if isinstance(symbol, tuple) and not any(w.isdigit() for w in symbol)
    )


def _named_as(text: str, names: frozenset[tuple[str, ...]]) -> frozenset[tuple[str, ...]]:
    """The ``names`` that ``text`` writes in lower case."""
    if not names:
        return names
    lowered = f" {' '.join(_WORD.findall(text.lower()))} "
    return frozenset(n for n in names if f" {' '.join(n)} " in lowered)


def _with_names(
    sentence: tuple[str | tuple[str, ...], ...], names: frozenset[tuple[str, ...]]
) -> tuple[str | tuple[str, ...], ...]:
    """``sentence`` with the runs of words that spell one of ``names`` as that name."""
    out: list[str | tuple[str, ...]] = []
    n = 0
    while n < len(sentence):
        for name in sorted(names, key=len, reverse=True):
            if tuple(sentence[n : n + len(name)]) == name:
                out.append(name)
                n += len(name)
                break
        else:
            out.append(sentence[n])
            n += 1
    return tuple(out)


@functools.lru_cache(maxsize=WORDS_CACHED)
def _framed(
    text: str, names: frozenset[tuple[str, ...]] = frozenset()
) -> tuple[tuple[Frame, frozenset[str]], ...]:
    """Each word of ``text`` that carries meaning and each name, with its frame and what it
    fills it with (``_filler``). A frame: the symbols on each side up to the nearest word of
    meaning, further on one side when the other ends the sentence, until it holds
    ``FRAME_WORDS`` words of meaning; only frames that hold one (a frame of names and stop
    words alone, "<name> to <name>", is no template)."""
    found: list[tuple[Frame, frozenset[str]]] = []
    for sentence in (_with_names(s, names) for s in _sentences(text)):
        for n, symbol in enumerate(sentence):
            filler = _filler(symbol)
            if not filler:
                continue
            before, after = sentence[:n][::-1], sentence[n + 1 :]
            left = _side(before, 1, _START)
            right = _side(after, 1, _END)
            if left[-1] == _START:
                right = _side(after, FRAME_WORDS, _END)
            elif right[-1] == _END:
                left = _side(before, FRAME_WORDS, _START)
            if not any(map(_meaning, left + right)):
                continue
            found.append(((tuple(left[::-1]), tuple(right)), filler))
    return tuple(found)


Slot = frozenset[frozenset[str]]


def slots(
    texts: Sequence[str],
    subject: frozenset[str] = frozenset(),
    named: frozenset[tuple[str, ...]] = frozenset(),
) -> dict[Frame, Slot]:
    """The slots of the templates among ``texts``: what each frame holds (the words on each
    side of a word or a name up to one that carries meaning, names standing for any name;
    see ``_framed``), for the frames that hold more than one ("<name> status is now _":
    trial, active, churned). The words of a template ("we set the status of", "please
    update the address") are the same whatever fills its slots, so they fill none. The slot
    ``subject`` fills is none of a value; a name of ``named`` (``_names``: written with
    capitals among the texts) is a name where a text writes it in lower case too ("the rep
    for Acme is dana reyes going forward")."""
    held: dict[Frame, set[frozenset[str]]] = {}
    for text in dict.fromkeys(texts):
        for frame, filler in _framed(text, _named_as(text, named)):
            held.setdefault(frame, set()).add(filler)
    return {
        frame: frozenset(fillers)
        for frame, fillers in held.items()
        if len(fillers) > 1 and not (subject and any(subject <= f for f in fillers))
    }


def _slotted(
    text: str, held: dict[Frame, Slot], named: frozenset[tuple[str, ...]] = frozenset()
) -> frozenset[str]:
    """The words ``text`` fills a slot of ``held`` with (``named``: as in ``slots``)."""
    framed = _framed(text, _named_as(text, named))
    return frozenset(w for frame, filler in framed if frame in held for w in filler)


def _speaker(hit: Hit) -> str:
    record = hit.record
    if isinstance(record, EpisodeRecord):
        return split_speaker(record.source, record.content)[0]
    return ""


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


def value_words(
    hits: Sequence[Hit], query: str, ignore: str = "", stating: Sequence[Hit] = ()
) -> str:
    """The values the statements of what ``query`` asks of its subject carry, as search text
    for the statements that carry them too (``supersede``'s ``lexicon``): the names and the
    words that fill a slot (``slots``) of the statements among ``hits`` and ``stating`` that
    say the most of what is asked, less the query's words, at most ``VALUE_WORDS``; "" when
    the query names no subject or nothing says what it asks."""
    terms = {_stem(t) for t in search_terms(query)}
    names = subject_words(query, ignore) & terms
    asked = terms - names
    if not names or not asked:
        return ""
    texts = [_body(h) for h in [*hits, *stating] if isinstance(h.record, EpisodeRecord)]
    most = max((len(asked & _words(t)) for t in texts), default=0)
    if not most:
        return ""
    named = _names(texts)
    held = slots(texts, names, named)
    found: dict[str, None] = {}
    for text in texts:
        if len(asked & _words(text)) == most:
            carried = _words(text) & (_capitalised(text)[0] | _slotted(text, held, named))
            found.update(dict.fromkeys(sorted(carried - terms)))
    return " ".join(list(found)[:VALUE_WORDS])


def supersede(
    hits: Sequence[Hit],
    query: str,
    depth: int = RESTATEMENT_DEPTH,
    ignore: str = "",
    stating: Sequence[Hit] = (),
    lexicon: Sequence[Hit] = (),
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
    # question; any subject's statements that say the most of it, among the hits and the
    # statements of it found (said at any time known: "account" alone is not what "account
    # owner" asks), carry the values it takes.
    group = {i for i in about if len(asked & words[i]) == most}
    stating_words = [_words(h.text) for h in stating]
    most_said = max([most, *(len(asked & w) for w in stating_words)])
    stated = [_body(hits[i]) for i in episodes if len(asked & words[i]) == most_said]
    stated += [
        _body(h) for h, w in zip(stating, stating_words, strict=True) if len(asked & w) == most_said
    ]
    # The slots of the templates among everything found, and among the statements that
    # carry the values found for them (``lexicon``); what the statements of what is asked
    # fill them with are its values.
    pool = [_body(h) for h in [*(hits[i] for i in episodes), *stating, *lexicon]]
    named = _names(pool)
    found_slots = slots(pool, names, named)
    values = frozenset().union(*(_slotted(t, found_slots, named) for t in stated)) - terms
    # Restating without saying it, a statement names the subject in what it says: one that
    # a speaker of that name said is about the speaker's many things.
    naming = [i for i in about if names <= _words(_body(hits[i]))]
    # A turn that names one of the conversation's speakers mostly speaks to them ("Cool,
    # John!"): what it says is no statement of the speaker's attributes.
    if names <= frozenset().union(*(_words(_speaker(hits[i])) for i in episodes)):
        naming = []
    group |= _restating(hits, naming, group, terms, values, found_slots)
    # The best ``depth`` hits are reordered; one found further down comes up only when it is
    # later than all of them (a newer restatement the ranking thought less of).
    newest = max((at[i] for i in group if i < depth), default=None)
    kept = [i for i in group if i < depth or newest is None or at[i] > newest]
    kept.sort(key=lambda i: (at[i], hits[i].uuid), reverse=True)
    chosen = set(kept)
    return [hits[i] for i in kept] + [h for i, h in enumerate(hits) if i not in chosen]


def _restating(
    hits: Sequence[Hit],
    about: list[int],
    group: set[int],
    terms: set[str],
    values: frozenset[str],
    found_slots: dict[Frame, Slot],
) -> set[int]:
    """The statements that name the subject (``about``) that restate what is asked without
    saying it: each carries a value that no other statement about the subject outside the
    group carries. A value fills a slot of ``found_slots`` (in any case: "trial", "Pro",
    "Tom Becker") and is said by the statements of what is asked (``values``), by a joined
    statement, or fills a slot with one of those ("suspended", where "marking <name> as _"
    holds "churned"). One at a time, a joined statement's words counting as said, until none
    joins."""
    bodies = {i: _body(hits[i]) for i in set(about) | group}
    said = {i: _words(body) - terms for i, body in bodies.items()}
    fillers = frozenset(w for slot in found_slots.values() for f in slot for w in f)
    carried = {i: fillers & said[i] for i in bodies}
    joined = set(group)
    known = set(values).union(*(carried[i] for i in joined))
    # How many statements about the subject outside the group say each word: a word is
    # carried by another when its count is more than the statement's own.
    outside = Counter(w for i in about if i not in joined for w in said[i])
    while True:
        # What fills a slot with a value is a value.
        while grown := _in_slots_with(known, found_slots) - known - terms:
            known |= grown
        found = next(
            (
                i
                for i in about
                if i not in joined and any(outside[w] == 1 for w in carried[i] & known)
            ),
            None,
        )
        if found is None:
            return joined - group
        joined.add(found)
        known |= carried[found]
        outside.subtract(said[found])


def _in_slots_with(known: set[str], found_slots: dict[Frame, Slot]) -> set[str]:
    """The words of what fills a slot that something of ``known`` fills."""
    return {
        w for slot in found_slots.values() if any(f <= known for f in slot) for f in slot for w in f
    }


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
