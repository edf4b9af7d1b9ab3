"""Search text: how plain user text becomes a fulltext query, the same words for every store.

Text is split at digits, ASCII punctuation and whitespace, lower-cased, stripped of English
stop words and cut to ``MAX_SEARCH_WORDS``; Neo4j gets those words as a Lucene query of
escaped terms (``lucene_query``), the embedded store as quoted FTS5 strings
(``sqlite_search.fulltext_query``)."""

from __future__ import annotations

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


def search_terms(text: str) -> list[str]:
    """The words a fulltext search looks for, split and filtered identically for both stores:
    lower-cased, cut at ``_SEARCH_SEPARATORS`` (so digits and ASCII punctuation never match),
    stop words dropped, duplicates removed, at most ``MAX_SEARCH_WORDS``."""
    words = (w for w in _SEARCH_SEPARATORS.split(text.lower()) if w)
    kept = (w for w in words if w not in SEARCH_STOP_WORDS)
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
    """The words of a stored text, split like a search (``search_terms``) but uncapped: what
    an exact in-memory search compares a query's terms with."""
    return {word for part in text.split() for word in search_terms(part)}
