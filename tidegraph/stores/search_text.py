"""Search text: how plain user text becomes a fulltext query, the same words for every store.

Words: text is split at digits, ASCII punctuation and whitespace, lower-cased and stripped of
English stop words. Identifiers (docs/retrieval.md "Identifiers"): a token that mixes letters
and digits or joins numbers with separators (``NW-1002``, ``1-732025285``, ``INV/2025/0042``,
``v2.3.1``), a phone number written with its ``+``, or an e-mail address, is searched whole
(its letters and digits without separators, ``nw1002``) and by the parts of it that hold a
digit (``1002``); the stores index those words beside a record's text
(``identifier_words``). A plain number of at least ``MIN_NUMBER_DIGITS`` digits in a query is
searched as such a part ("1002"); shorter ones ("3 users") are not searched. A query's words
and identifier words, cut to ``MAX_SEARCH_WORDS``, are ``search_terms``; Neo4j gets them as a
Lucene query of escaped terms (``lucene_query``), the embedded store as quoted FTS5 strings
(``sqlite_search.fulltext_query``)."""

from __future__ import annotations

import functools
import re

# Search text is cut to this many words (Lucene refuses queries of more than 1024 clauses).
MAX_SEARCH_WORDS = 64
# Where search text is split (digits, ASCII punctuation and control characters never match),
# the same for every store: a NUL or another control byte is a separator, never part of a
# word (SQLite's FTS5 refused a query holding one).
_SEARCH_SEPARATORS = re.compile(
    r"""[0-9!@#$%^&*()_+={}\[\]:;<>,.?~\\/|'"`\-\s\x00-\x1f\x7f-\x9f]+"""
)
_LUCENE_SPECIAL = re.compile(r'([+\-!(){}\[\]^"~*?:\\/&|])')
# English stop words, dropped from every search (a superset of Lucene's English stop set, the
# list the first embedded store's fulltext index used): a search matches on the words that
# carry meaning, the same ones on every store.
SEARCH_STOP_WORDS = frozenset(
    """
a able about above according accordingly across actually after afterwards again against
all allow allows almost alone along already also although always am among amongst an and
another any anybody anyhow anyone anything anyway anyways anywhere apart appear appreciate
appropriate are around as aside associated at available away awfully b be became because
become becomes becoming been before beforehand behind being believe below beside besides
best better between beyond both brief but by c came can cannot cant cause causes certain
certainly changes clearly co com come comes concerning consequently consider considering
contain containing contains corresponding could course currently d definitely described
despite did different do does doing done down downwards during e each edu eg eight either
else elsewhere enough entirely especially et etc even ever every everybody everyone
everything everywhere ex exactly example except f far few fifth first five followed
following follows for former formerly forth four from further furthermore g get gets
getting given gives go goes going gone got gotten greetings h had happens hardly has have
having he hello help hence her here hereafter hereby herein hereupon hers herself hi him
himself his hither hopefully how howbeit however i ie if ignored immediate in inasmuch inc
indeed indicate indicated indicates inner insofar instead into inward is it its itself j
just k keep keeps kept know known knows l last lately later latter latterly least less
lest like liked little look looking looks ltd m mainly many may maybe me mean meanwhile
merely might more moreover most mostly much must my myself n name namely nd near nearly
necessary need needs neither never nevertheless new next nine no nobody non none noone nor
normally not nothing novel now nowhere o obviously of off often oh ok okay old on once one
ones only onto or other others otherwise ought our ours ourselves out outside over overall
own p particular particularly per perhaps placed please plus possible presumably probably
provides q que quite qv r rather rd re really reasonably regarding regardless regards
relatively respectively right s said same saw say saying says second secondly see seeing
seem seemed seeming seems seen self selves sensible sent serious seriously seven several
shall she should since six so some somebody somehow someone something sometime sometimes
somewhat somewhere soon sorry specified specify specifying still sub such sup sure t take
taken tell tends th than thank thanks thanx that thats the their theirs them themselves
then thence there thereafter thereby therefore therein theres thereupon these they think
third this thorough thoroughly those though three through throughout thru thus to together
too took toward towards tried tries truly try trying twice two u un under unfortunately
unless unlikely until unto up upon us use used useful uses using usually uucp v value
various very via viz vs w want wants was way we welcome well went were what whatever when
whence whenever where whereafter whereas whereby wherein whereupon wherever whether which
while whither who whoever whole whom whose why will willing wish with within without
wonder would x y yes yet you your yours yourself yourselves z zero
""".split()
)


# A number of fewer digits in a query is a count or a day ("3 users", "on the 12th"), not a
# part of an identifier: it is not searched.
MIN_NUMBER_DIGITS = 3
# A token that may be an identifier: letters, digits and the separators ids are written with.
_TOKEN = re.compile(r"[^\W_]+(?:[-/._@#+][^\W_]+)*")
# A phone number as written with its country code: +44 20 7946 0958, +1 (555) 010-9999.
_PHONE = re.compile(r"\+\d[\d ().\-]{5,}\d")
_EMAIL = re.compile(r"^[^\W_][\w.+\-]*@[^\W_][\w\-]*(?:\.[\w\-]+)+$")
_ALNUM_RUN = re.compile(r"[^\W_]+")
_DIGIT_RUN = re.compile(r"\d+")
# A number with a suffix of one or two letters: an ordinal, a time or a unit, not an id.
_COUNTED = re.compile(r"^\d+[^\W\d_]{1,2}$")


def _token_ids(token: str) -> tuple[str, ...]:
    """The identifier words of one token (``_TOKEN``): none unless it is an identifier; else
    its letters and digits without separators, then its parts that hold a digit: each run
    between separators that mixes letters and digits, and each run of at least
    ``MIN_NUMBER_DIGITS`` digits (alone or within such a run). Remembered for a short token
    (``_remembered_token_ids``)."""
    if len(token) <= _REMEMBERED_TOKEN_CHARS:
        return _remembered_token_ids(token)
    return _identifier_parts(token)


# A feed's texts repeat the same tokens (a record's field names and values, a conversation's
# words), and every write asks a text's tokens one by one: remembered, ``identifier_words`` of a
# generated CRM record (140 characters, 18 tokens) takes 6.5 µs instead of 18. Only short
# tokens, so that what is kept stays small whatever a feed sends.
_REMEMBERED_TOKEN_CHARS = 40


def _identifier_parts(token: str) -> tuple[str, ...]:
    """``_token_ids`` worked out."""
    if token.isdecimal() or ("@" not in token and _DIGIT_RUN.search(token) is None):
        return ()  # a plain number, or a word (most tokens): what the checks below say
    runs = _ALNUM_RUN.findall(token.lower())
    digits = sum(len(d) for d in _DIGIT_RUN.findall(token))
    mixed = digits and any(not ch.isdigit() for run in runs for ch in run)
    if _EMAIL.match(token):
        pass  # an e-mail address is an identifier with or without digits
    elif not digits or (len(runs) == 1 and not mixed):
        return ()  # a word, or a plain number
    elif not mixed and digits < 4:
        return ()  # "3.5", "1-2": a number, a range
    elif len(runs) == 1 and _COUNTED.match(runs[0]):
        return ()  # "2nd", "10am", "4k": an ordinal, a time, a unit
    parts: list[str] = []
    for run in runs:
        if run.isdigit():
            parts += [run] if len(run) >= MIN_NUMBER_DIGITS else []
        elif any(ch.isdigit() for ch in run):
            parts.append(run)
            parts += [d for d in _DIGIT_RUN.findall(run) if len(d) >= MIN_NUMBER_DIGITS]
    return ("".join(runs), *parts)


_remembered_token_ids = functools.lru_cache(maxsize=1 << 14)(_identifier_parts)


def identifier_words(text: str) -> list[str]:
    """The identifier words of a text (see the module docstring), each once, in order: what
    the stores index beside a record's text, and what a query's identifiers are searched as."""
    found: list[str] = []
    for phone in _PHONE.findall(text):
        found.append("".join(_DIGIT_RUN.findall(phone)))
        found += [d for d in _DIGIT_RUN.findall(phone) if len(d) >= MIN_NUMBER_DIGITS]
    for token in _TOKEN.findall(text):
        found += _token_ids(token)
    return list(dict.fromkeys(found))


def identifiers(text: str) -> set[str]:
    """The identifiers a text names, whole (``nw1002``): what a search ranks first when a
    query names one of them (``tidegraph.recall.search``)."""
    named = {"".join(_DIGIT_RUN.findall(phone)) for phone in _PHONE.findall(text)}
    for token in _TOKEN.findall(text):
        words = _token_ids(token)
        if words:
            named.add(words[0])
    return named


def indexed_text(*texts: str | None) -> str:
    """A record's text as the fulltext indexes hold it: its texts, then their identifier
    words (``identifier_words``)."""
    text = " ".join(t for t in texts if t)
    ids = identifier_words(text)
    return f"{text} {' '.join(ids)}" if ids else text


def _query_numbers(text: str) -> list[str]:
    """The plain numbers of at least ``MIN_NUMBER_DIGITS`` digits of a query (searched as the
    parts of identifiers)."""
    return [
        token
        for token in _TOKEN.findall(text)
        if token.isdigit() and len(token) >= MIN_NUMBER_DIGITS
    ]


def search_terms(text: str) -> list[str]:
    """The words a fulltext search looks for, split and filtered identically for both stores:
    lower-cased, cut at ``_SEARCH_SEPARATORS`` (so ASCII punctuation never matches), stop
    words dropped; then its identifier words and numbers (the module docstring); duplicates
    removed, at most ``MAX_SEARCH_WORDS``."""
    words = (w for w in _SEARCH_SEPARATORS.split(text.lower()) if w)
    kept = [w for w in words if w not in SEARCH_STOP_WORDS]
    if any(ch.isdigit() or ch == "@" for ch in text):
        kept += identifier_words(text) + _query_numbers(text)
    return list(dict.fromkeys(kept))[:MAX_SEARCH_WORDS]


def lucene_query(text: str) -> str | None:
    """The search as a Lucene query of plain terms (OR-ed): every character that Lucene's
    syntax gives a meaning to is backslash-escaped; all terms are lower case, so AND, OR,
    NOT and TO are words, not operators."""
    terms = search_terms(text)
    if not terms:
        return None
    return " ".join(_LUCENE_SPECIAL.sub(r"\\\1", term) for term in terms)


def text_words(text: str) -> set[str]:
    """The words of a stored text, split like a search (``search_terms``) but uncapped, with
    its identifier words: what an exact in-memory search compares a query's terms with."""
    words = {word for part in text.split() for word in search_terms(part)}
    return words | set(identifier_words(text))
