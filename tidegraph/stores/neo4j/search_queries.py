"""The Neo4j store's search queries (``tidegraph.stores.neo4j.search``): fulltext and vector
candidates of each kind, and the reads that turn them into hits. Parameterised like
``queries``; index names are our constants.

Fulltext: Lucene indexes with the English analyzer, queried with ``search_text.lucene_query``.
Vector: HNSW indexes (cosine); the index's top candidates are rescored exactly on the stored
vectors, scored ``(1 + cos) / 2``, with an exact scan of the groups when they are small or
the candidates hold too few of them (``Neo4jSearch._nearest``).
"""

from __future__ import annotations

import re
from datetime import datetime

from tidegraph.records import times
from tidegraph.records.asof import AsOf
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.rows import ENTITY_FIELDS, FACT_FIELDS
from tidegraph.stores.search_text import lucene_query

# (procedure, index, embedding property) of each kind's vector index.
_VECTOR = {
    "entity": ("queryNodes", q.ENTITY_VECTOR_INDEX, "name_embedding"),
    "fact": ("queryRelationships", q.FACT_VECTOR_INDEX, "fact_embedding"),
    "episode": ("queryNodes", q.EPISODE_VECTOR_INDEX, "content_embedding"),
    "community": ("queryNodes", q.COMMUNITY_VECTOR_INDEX, "name_embedding"),
}
_LABEL = {"entity": "Entity", "fact": "RELATES_TO", "episode": "Episodic", "community": "Community"}
_MATCH = {
    "entity": "(x:Entity)",
    "fact": "()-[x:RELATES_TO]->()",
    "episode": "(x:Episodic)",
    "community": "(x:Community)",
}
_FULLTEXT = {
    "entity": ("queryNodes", q.ENTITY_FULLTEXT_INDEX),
    "fact": ("queryRelationships", q.FACT_FULLTEXT_INDEX),
    "episode": ("queryNodes", q.EPISODE_FULLTEXT_INDEX),
    "community": ("queryNodes", q.COMMUNITY_FULLTEXT_INDEX),
}


def fulltext_query(text: str) -> str | None:
    """Search text as the fulltext indexes take it (None: nothing searchable)."""
    return lucene_query(text)


def time_range(field: str, until: datetime, inclusive: bool = True) -> str:
    """A Lucene query of the facts whose ``field`` (one of ``q.FACT_TIME_FIELDS``) holds a
    time before ``until`` in whole seconds (or at it, ``inclusive``): the whole steps of each
    level of ``times.TIME_WORD_LEVELS`` before the step ``until`` is in, then the seconds of that
    last step (a few hundred words at most, where one word per second read tens of
    thousands on a long history)."""
    digits = times.time_digits(until)
    ranges = []
    below = 0  # where the level's range starts: the start of the coarser level's step
    for n, (letter, kept) in enumerate(times.TIME_WORD_LEVELS):
        step = int(digits[:kept])
        last = n == len(times.TIME_WORD_LEVELS) - 1
        if last and inclusive:
            ranges.append(f"{field}:[{letter}{below:0{kept}d} TO {letter}{step:0{kept}d}]")
        elif step > below:
            ranges.append(f"{field}:[{letter}{below:0{kept}d} TO {letter}{step:0{kept}d}}}")
        if not last:
            below = step * 10 ** (times.TIME_WORD_LEVELS[n + 1][1] - kept)
    if not ranges:  # before the earliest time: a range of no word
        letter, kept = times.TIME_WORD_LEVELS[-1]
        ranges.append(f"{field}:[{letter}{0:0{kept}d} TO {letter}{0:0{kept}d}}}")
    return "(" + " ".join(ranges) + ")"


def fact_fulltext_query(words: str, asof: AsOf) -> str:
    """The Lucene query of ``words`` over the fact index, of only the facts that
    ``seen_by_scope`` may let through: stored by $known_at and, unless the scope takes every
    validity, started by $valid_at and not ended by then as known at $known_at, required of
    the facts' validity words (``q.FACT_TIME_FIELDS``, whole seconds). Each bound is widened
    to whole seconds, so the index passes a superset and the statement's filter decides; its
    clauses score nothing (``^0``), so the facts keep the scores of ``words`` alone. Without
    them, a question as of a past time on a long history read, best first and oldest first
    among equal scores, the facts closed before that time until it found those valid then."""
    return " ".join([f"+({words})", *_fact_scope_clauses(asof)])


def _fact_scope_clauses(asof: AsOf) -> list[str]:
    """The required clauses of ``fact_fulltext_query`` on the facts' validity words."""
    created, valid, invalid, ended = q.FACT_TIME_FIELDS
    clauses = [f"+{time_range(created, asof.known_at)}^0"]
    if not asof.include_invalid:
        clauses += [
            f"+{time_range(valid, asof.valid_at)}^0",
            f"-(+{time_range(ended, asof.known_at, inclusive=False)} "
            f"+{time_range(invalid, asof.valid_at, inclusive=False)})",
        ]
    return clauses


# An entity uuid as the fact index holds it among a fact's end words
# (``q.set_fact_end_words``): one token of letters and digits.
_END_WORD = re.compile(r"e[0-9a-z]+")
# The most entities whose facts one walk read asks the index for (the words of a Lucene
# query are clauses, and a query holds at most 1,024); more are read from their nodes.
MAX_INDEXED_ENDS = 200


def end_word(uuid: str) -> str | None:
    """The word of the entity ``uuid`` among facts' end words, None when it would not be one
    token (a uuid not of the usual shape): such an entity's facts are read from its node."""
    word = "e" + uuid.replace("-", "")
    return word if _END_WORD.fullmatch(word) else None


def walk_fulltext_query(uuids: list[str], asof: AsOf) -> str | None:
    """The Lucene query of the facts touching the entities ``uuids`` that ``seen_by_scope``
    may let through (``FACTS_NEAR_INDEXED``), None when the index cannot be asked for them
    (``end_word``, ``MAX_INDEXED_ENDS``)."""
    words = [end_word(uuid) for uuid in uuids]
    if not words or len(words) > MAX_INDEXED_ENDS or None in words:
        return None
    ends = " ".join(w for w in words if w is not None)
    return " ".join([f"+{q.FACT_ENDS_FIELD}:({ends})", *_fact_scope_clauses(asof)])


def episode_fulltext_query(words: str, asof: AsOf) -> str:
    """The Lucene query ``words`` over the episode index, of only the episodes that
    ``seen_by_scope`` may let through: stored by $known_at and said by $valid_at, required of
    the episodes' validity words (``q.EPISODE_TIME_FIELDS``, whole seconds; the statement's
    filter decides). The clauses score nothing, as the facts' (``fact_fulltext_query``).
    Without them, a question's common words matched every episode of a long history, and the
    index answered all of them before the statement filtered."""
    created, said = q.EPISODE_TIME_FIELDS
    return (
        f"+({words}) +{time_range(created, asof.known_at)}^0 +{time_range(said, asof.valid_at)}^0"
    )


def _yielded(call: str) -> str:
    """What a ``queryNodes`` / ``queryRelationships`` procedure yields."""
    return "relationship" if call == "queryRelationships" else "node"


def seen_by_scope(kind: str, x: str = "x") -> str:
    """Whether the search's scope sees the record ``x`` of ``kind``, as a Cypher predicate
    over $known_at, $valid_at and $include_invalid: a fact believed at $known_at and valid at
    $valid_at (the superset of ``asof.as_of_match``: a fact whose end or start moved later is
    let through, and ``AsOf.believed`` decides it), an episode stored by $known_at that
    happened by $valid_at, an entity or a community stored by $known_at. Candidates are
    filtered by it in the statement that finds them, so that a question as of a past time
    on a long history reads only what was valid then, never the group's whole history."""
    if kind == "fact":
        return (
            f"{x}.created_at <= $known_at AND ($include_invalid OR ("
            f"coalesce({x}.valid_at <= $valid_at, true) AND coalesce(CASE WHEN "
            f"coalesce({x}.end_learned_at, {x}.expired_at) <= $known_at "
            f"THEN $valid_at < {x}.invalid_at END, true)))"
        )
    if kind == "episode":
        return f"coalesce({x}.created_at <= $known_at, true) AND {x}.valid_at <= $valid_at"
    return f"coalesce({x}.created_at <= $known_at, true)"


def _fulltext_best(call: str, index: str, kind: str) -> str:
    """The best $limit of the group's matches that the scope sees, as ``uuid`` and
    ``score``. The index answers its matches best first, and they are read only until
    $limit are found (a query of common words matches most of a long history: ordering
    every match read them all); equal scores are ordered by uuid among those read."""
    return f"""
CALL db.index.fulltext.{call}('{index}', $query) YIELD {_yielded(call)} AS x, score
WITH x, score WHERE x.group_id = $group_id AND {seen_by_scope(kind)}
LIMIT $limit
WITH x.uuid AS uuid, score
ORDER BY score DESC, uuid
"""


def _fulltext(call: str, index: str, kind: str) -> str:
    return _fulltext_best(call, index, kind) + "RETURN uuid, score\n"


def _of_groups(kind: str | None) -> str:
    """The groups' records, and of them those the scope sees when searching ``kind``."""
    groups = "x.group_id IN $group_ids"
    return groups if kind is None else f"{groups} AND {seen_by_scope(kind)}"


def _candidates(
    call: str, index: str, prop: str, records: str | None = None, kind: str | None = None
) -> str:
    """The index's top $k neighbours in one row: ``found``, how many the index gave (fewer
    than $k: it has no more), ``of_groups``, how many of them are the groups' records, and
    ``hits``, those of the groups as [uuid, score] pairs (``records``: a column read from
    them, ``_hit_maps``; ``kind``: only those the search's scope sees, ``seen_by_scope``)."""
    return f"""
CALL db.index.vector.{call}('{index}', $k, $embedding) YIELD {_yielded(call)} AS x
WITH collect(x) AS xs
WITH size(xs) AS found, size([x IN xs WHERE x.group_id IN $group_ids]) AS of_groups,
     [x IN xs WHERE {_of_groups(kind)}
      | [x.uuid, vector.similarity.cosine(x.{prop}, $embedding)]] AS hits
RETURN found, of_groups, hits{"" if records is None else ", " + records + " AS records"}
"""


def _scan(of: str, prop: str, kind: str | None = None) -> str:
    """The exact scan of the groups' records of the kind ``of`` (``kind``: of those the
    search's scope sees), read from the group index: on the scope's times the planner chose a
    time index, every group's records (1.2 s against 0.12 s for a 6,000-fact group among
    70,000 facts)."""
    return f"""
MATCH {_MATCH[of]}
USING INDEX x:{_LABEL[of]}(group_id)
WHERE {_of_groups(kind)} AND x.{prop} IS NOT NULL
WITH x, vector.similarity.cosine(x.{prop}, $embedding) AS score
ORDER BY score DESC, x.uuid
LIMIT $limit
RETURN x.uuid AS uuid, score
"""


def _small_scan(match: str, prop: str, records: str | None = None, kind: str | None = None) -> str:
    """The exact scan when the groups hold fewer than $scan_below records of the kind, in one
    round trip: one row, ``small`` and, when small, ``hits`` ([uuid, score] pairs of those
    with an embedding, best first), else ``held``, how many records of the kind the groups
    hold (from the group index); ``records``: a column read from the hits (``_hit_maps``);
    ``kind``: hits only of those the search's scope sees (``seen_by_scope``). The check reads
    at most $scan_below records from the group index, whatever share of them has an
    embedding (counting only embedded ones read every record of a group that has few: 66,681
    db hits a search for none, on the 33,340 unembedded episodes of a mapped feed)."""
    return f"""
CALL () {{
  MATCH {match}
  WHERE x.group_id IN $group_ids
  RETURN x LIMIT $scan_below
}}
WITH collect(x) AS xs
CALL (xs) {{
  WITH xs WHERE size(xs) < $scan_below
  UNWIND xs AS x
  WITH x WHERE x.{prop} IS NOT NULL AND {"true" if kind is None else seen_by_scope(kind)}
  WITH x, vector.similarity.cosine(x.{prop}, $embedding) AS score
  ORDER BY score DESC, x.uuid
  LIMIT $limit
  RETURN collect([x.uuid, score]) AS hits
}}
WITH size(xs) < $scan_below AS small, hits,
     CASE WHEN size(xs) >= $scan_below
     THEN COUNT {{ MATCH {match} WHERE x.group_id IN $group_ids }} END AS held
RETURN small, hits, held{"" if records is None else ", " + records + " AS records"}
"""


# The best $limit of the group's matches: (uuid, score).
FULLTEXT = {kind: _fulltext(*how, kind) for kind, how in _FULLTEXT.items()}
# (candidates of the global index: one row, found and hits; exact scan: uuid, score)
VECTOR = {
    kind: (_candidates(call, index, prop), _scan(kind, prop))
    for kind, (call, index, prop) in _VECTOR.items()
}
# A small group is scanned exactly before any index query (``Neo4jSearch._nearest``).
SMALL_SCAN: dict[str, str | None] = {
    kind: _small_scan(_MATCH[kind], prop) for kind, (_, _, prop) in _VECTOR.items()
}

# The walk's facts: what it walks on (the ends) and what decides whether the scope believes
# one (its times and their history), not its sentence, episodes or embedding: a walk reads a
# few hundred and keeps a few (``Neo4jSearch.expand_facts`` reads those as hits). Of each
# entity, the $per_entity seen facts first by uuid (``Neo4jSearch._believed_touching``): an
# entity that thousands of facts point to (a status every ticket took) answers what the walk
# can keep of it, not its history.
_WALK_LIGHT = (
    """r {.uuid, .group_id, .name, fact: '', .prior_ends, .prior_ends_learned_at,
          .end_learned_at, .prior_starts, .prior_starts_learned_at, .start_learned_at, """
    + q.FACT_TIMES
    + """} AS r"""
)


def _facts_near(returned: str) -> str:
    """The walk's read from the entities' nodes, ``returned`` (a RETURN clause or the clauses
    that end with one) of each fact ``r`` with its ends ``s`` and ``t``."""
    return (
        """
UNWIND $uuids AS uuid
MATCH (e:Entity {uuid: uuid})
USING INDEX e:Entity(uuid)
WHERE e.group_id = $group_id
CALL (e) {
  MATCH (e)-[r:RELATES_TO]-()
  WHERE r.group_id = $group_id AND """
        + seen_by_scope("fact", "r")
        + """
  WITH r ORDER BY r.uuid LIMIT $per_entity
  RETURN r
}
WITH DISTINCT r
MATCH (s:Entity)-[r]->(t:Entity)
"""
        + returned
        + "\n"
    )


FACTS_NEAR = (  # statements whose rows are concatenated (here one)
    _facts_near("RETURN " + _WALK_LIGHT + ",\n       s.uuid AS source_uuid, t.uuid AS target_uuid"),
)


# The walk's facts as ``FACTS_NEAR`` reads them, from the fact index rather than the entities'
# nodes ($query: ``walk_fulltext_query``): only the facts of the entities that the scope may
# see, where reading an entity's every fact to filter them read its whole history (an entity
# that thousands of facts point to, most of them closed then). The same rows: of each entity
# the $per_entity seen first by uuid. Which seeds a fact touches is read from its end words
# (``q.FACT_ENDS_FIELD``: source, then target), and its ends only for the facts kept: a
# status's few hundred valid facts were each matched to both their end nodes before the cut
# (about 8 % of the read's db hits).
_FACTS_NEAR_INDEXED_CUT = f"""
WITH [uuid IN $uuids | 'e' + replace(uuid, '-', '')] AS seeds
CALL db.index.fulltext.queryRelationships('{q.FACT_FULLTEXT_INDEX}', $query)
YIELD relationship AS r
WITH seeds, r WHERE r.group_id = $group_id AND {seen_by_scope("fact", "r")}
WITH seeds, r, split(r.{q.FACT_ENDS_FIELD}, ' ') AS ends
UNWIND CASE WHEN ends[0] = ends[1] THEN ends[..1] ELSE ends END AS touched
WITH touched, r WHERE touched IN seeds
WITH touched, r ORDER BY r.uuid
WITH touched, collect(r) AS read
UNWIND CASE WHEN size(read) <= $per_entity THEN read ELSE read[..$per_entity] END AS r
WITH DISTINCT r
MATCH (s)-[r]->(t)
"""


FACTS_NEAR_INDEXED = (
    _FACTS_NEAR_INDEXED_CUT
    + "RETURN "
    + _WALK_LIGHT
    + """,
       s.uuid AS source_uuid, t.uuid AS target_uuid
"""
)

# The producer ids of the episodes stored by $known_at that mention the entity ``e``, the
# latest first (``hits.latest_first``): every episode that mentions a ticket, a status or a
# team (thousands, for a status every ticket took), so a search's candidates are read
# without them and only the entities it keeps read them (``Neo4jSearch.complete_hits``).
_ENTITY_PRODUCERS = """COLLECT {
         MATCH (ep:Episodic)-[:MENTIONS]->(e)
         WHERE ep.group_id = $group_id AND ep.created_at <= $known_at
         RETURN ep.producer_id ORDER BY ep.valid_at DESC, ep.producer_id
       }"""

# Hits are read in one round trip each (``Neo4jSearch._hits``), times as epoch microseconds
# (the driver builds its own DateTime objects slowly). Hits carry their embeddings (MMR
# compares them), except the facts a walk reads: it may read hundreds. Each kind's read is a
# match on ``uuid`` and its columns, read after the uuids it reads: $uuids
# (``HITS_BY_UUIDS``), a fulltext query's best (``FULLTEXT_HITS``) or a vector search's
# (``VECTOR_HITS``, ``SMALL_SCAN_HITS``), the latter two with the candidate's ``score``.
_HIT_READS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "episode": (
        "MATCH (ep:Episodic {uuid: uuid}) WHERE ep.group_id = $group_id",
        (
            (
                "ep",
                "ep {.*, content_embedding: CASE WHEN $embeddings THEN ep.content_embedding END, "
                + q.times_as_micros("ep", ("valid_at", "created_at"))
                + "}",
            ),
        ),
    ),
    "fact": (
        "MATCH (s:Entity)-[r:RELATES_TO {uuid: uuid}]->(t:Entity) WHERE r.group_id = $group_id",
        (
            (
                "r",
                q.stored(
                    "r",
                    FACT_FIELDS,
                    micros=q.FACT_MICROS_FIELDS,
                    fact_embedding="CASE WHEN $embeddings THEN r.fact_embedding END",
                ),
            ),
            ("source_uuid", "s.uuid"),
            ("target_uuid", "t.uuid"),
            ("source_name", "s.name"),
            ("target_name", "t.name"),
            (
                "producers",
                """COLLECT {
         UNWIND r.episodes AS episode
         MATCH (ep:Episodic {uuid: episode})
         WHERE ep.group_id = $group_id
         RETURN [ep.uuid, ep.producer_id]
       }""",
            ),
        ),
    ),
    "entity": (
        "MATCH (e:Entity {uuid: uuid}) WHERE e.group_id = $group_id",
        (
            (
                "e",
                q.stored(
                    "e",
                    ENTITY_FIELDS,
                    micros=("created_at",),
                    name_embedding="CASE WHEN $embeddings THEN e.name_embedding END",
                ),
            ),
            ("community_uuid", q.COMMUNITY_OF_E),
            # read only with the details (``SearchScope.details``, else null): a search
            # completes the entities it keeps (``ENTITY_PRODUCERS_BY_UUIDS``)
            ("producers", f"CASE WHEN $details THEN {_ENTITY_PRODUCERS} END"),
        ),
    ),
}


def _hit_rows(kind: str, *extra: str) -> str:
    """The read of ``kind``'s hits as rows: its columns, and the ``extra`` ones in scope."""
    match, columns = _HIT_READS[kind]
    returned = [f"{expr} AS {name}" for name, expr in columns] + list(extra)
    return f"{match}\nRETURN " + ",\n       ".join(returned) + "\n"


def _hit_maps(kind: str) -> str:
    """The hits of $limit best [uuid, score] pairs of ``hits`` (best first) as a list of maps
    (the columns of ``_hit_rows`` with ``uuid`` and ``score``), for one row's column."""
    match, columns = _HIT_READS[kind]
    fields = [f"{name}: {expr}" for name, expr in columns] + ["uuid: uuid", "score: score"]
    return (
        "COLLECT {\n  UNWIND hits AS h\n  WITH h[0] AS uuid, h[1] AS score\n"
        "  ORDER BY score DESC, uuid LIMIT $limit\n"
        f"  {match}\n  RETURN {{" + ", ".join(fields) + "}\n}"
    )


_READ_KINDS = ("fact", "entity", "episode")
# The hits' rows of $uuids, by kind.
HITS_BY_UUIDS = {kind: "UNWIND $uuids AS uuid\n" + _hit_rows(kind) for kind in _READ_KINDS}


# The walk's reads (``FACTS_NEAR``, ``FACTS_NEAR_INDEXED``) giving the first $whole facts in
# the walk's order (the first of $uuids they touch, then uuid) with their hit rows (the columns
# of ``HITS_BY_UUIDS["fact"]``), the others as light records with null names and producers: a
# search's walk (``Neo4jSearch.expand_facts``) that stops at that read keeps those, and needs
# no read of its own for them (it was one round trip more on a search's critical path, after
# the walk's). Reading every fact of the walk whole (55-75 for the 20 kept) cost what the
# round trip saved.
def _whole_first(column: str) -> str:
    """The column ``column`` of ``HITS_BY_UUIDS["fact"]`` for a fact read whole (else null)."""
    return f"CASE WHEN whole THEN {column} END"


_FACT_COLUMNS = dict(_HIT_READS["fact"][1])
_WALK_HITS_RETURN = (
    """WITH r, s, t, [s.uuid, t.uuid] AS ends
WITH r, s, t, ends, [i IN range(0, size($uuids) - 1) WHERE $uuids[i] IN ends][0] AS origin
ORDER BY origin, r.uuid
WITH collect([r, s, t, ends]) AS facts
UNWIND range(0, size(facts) - 1) AS i
WITH facts[i][0] AS r, facts[i][1] AS s, facts[i][2] AS t, facts[i][3] AS ends,
     i < $whole AS whole
RETURN CASE WHEN whole THEN """
    + _FACT_COLUMNS["r"]
    + " ELSE "
    + _WALK_LIGHT.removesuffix(" AS r")
    + """ END AS r,
       ends[0] AS source_uuid, ends[1] AS target_uuid, """
    + ", ".join(
        f"{_whole_first(_FACT_COLUMNS[name])} AS {name}"
        for name in ("source_name", "target_name", "producers")
    )
    + "\n"
)
WALK_HITS = (_facts_near(_WALK_HITS_RETURN),)
WALK_HITS_INDEXED = _FACTS_NEAR_INDEXED_CUT + _WALK_HITS_RETURN
# The producers of the entities $uuids of the group (``_ENTITY_PRODUCERS``): the details a
# search's kept entity hits are completed with.
ENTITY_PRODUCERS_BY_UUIDS = f"""
UNWIND $uuids AS uuid
MATCH (e:Entity {{uuid: uuid}}) WHERE e.group_id = $group_id
RETURN uuid, {_ENTITY_PRODUCERS} AS producers
"""
# The best $limit of the group's fulltext matches with their hits' rows, in one round trip
# (the rows of ``HITS_BY_UUIDS``, with ``uuid`` and ``score``); communities are read apart.
FULLTEXT_HITS = {
    kind: _fulltext_best(*_FULLTEXT[kind], kind) + _hit_rows(kind, "uuid", "score")
    for kind in _READ_KINDS
}
# The vector reads with the hits of their best $limit, in the same round trip (``records``:
# maps of the columns of ``HITS_BY_UUIDS`` with ``uuid`` and ``score``; the candidates' and
# the small scan's other columns as in ``VECTOR`` and ``SMALL_SCAN``).
VECTOR_HITS = {
    kind: _candidates(*_VECTOR[kind], records=_hit_maps(kind), kind=kind) for kind in _READ_KINDS
}
SMALL_SCAN_HITS = {
    kind: _small_scan(_MATCH[kind], _VECTOR[kind][2], records=_hit_maps(kind), kind=kind)
    for kind in _READ_KINDS
}
# A search's vector reads of each kind, of the records its scope sees (``seen_by_scope``):
# (the index's candidates, the exact scan of the groups, the small scan); facts, entities
# and episodes with their hits' rows (``VECTOR_HITS``, ``SMALL_SCAN_HITS``).
SEARCH_VECTOR = {
    kind: (
        VECTOR_HITS[kind] if kind in VECTOR_HITS else _candidates(*_VECTOR[kind], kind=kind),
        _scan(kind, _VECTOR[kind][2], kind),
        SMALL_SCAN_HITS[kind]
        if kind in SMALL_SCAN_HITS
        else _small_scan(_MATCH[kind], _VECTOR[kind][2], kind=kind),
    )
    for kind in _VECTOR
}
