"""What both graph stores share: the Neo4j Cypher text, and the pure helpers that turn records
into query parameters, check a write before it runs and turn rows back into records.

Every query is fully parameterised: user and LLM text (names, summaries, facts, relation
types, group ids, search text) only ever travels as a parameter. The few values formatted into
query text are our own constants (index names) or validated integers (the embedding dimension
in kuzu's DDL, which takes no parameters).

Scores returned by the vector searches of both stores are ``(1 + cos) / 2`` in [0, 1] — the
measure Neo4j's cosine vector index and ``vector.similarity.cosine`` report — so 1.0 is the
same direction, 0.5 orthogonal and 0.0 opposite.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tidegraph.metrics import STORE_BATCH_SIZE, STORE_WRITE_LATENCY
from tidegraph.records.asof import AsOf, start_known_at
from tidegraph.records.graph import (
    EntityRecord,
    EpisodeRecord,
    EpisodeWrite,
    FactClosure,
    FactRecord,
    FactView,
)
from tidegraph.records.ids import LABEL_RE, normalize_name
from tidegraph.records.times import iso, utc


# ----------------------------------------------------------------------------- errors
class StoreSchemaError(RuntimeError):
    """The store's schema does not fit this configuration (e.g. another embedding dimension)."""


class StoreIntegrityError(ValueError):
    """A write would cross groups or reference something that does not exist; nothing was
    written (the transaction was rolled back)."""


class EpisodeConflictError(StoreIntegrityError):
    """The episode's uuid is already stored in its group with other content: its producer
    reused an id for a different record. Nothing was written."""


def check_same_episode(uuid: str, stored_hash: str | None, content_hash: str | None) -> None:
    """Raise EpisodeConflictError when a stored episode's content hash differs from the
    record's (episodes stored before hashes existed have none and always pass)."""
    if content_hash and stored_hash and stored_hash != content_hash:
        raise EpisodeConflictError(
            f"episode {uuid} was already processed with other content (stored content hash "
            f"{stored_hash[:12]}, this record's {content_hash[:12]}): a new episode needs a "
            "new id"
        )


# ----------------------------------------------------------------------------- constants
# Labels an entity may never get: they would make it look like another kind of node.
RESERVED_LABELS = frozenset({"Entity", "Episodic", "Community"})
# Search text is cut to this many words (Lucene refuses queries of more than 1024 clauses).
MAX_SEARCH_WORDS = 64
# How kuzu's fulltext index splits text (its default ignore pattern: digits, ASCII punctuation)
# plus whitespace. Search text is split the same way for both stores.
_SEARCH_SEPARATORS = re.compile(r"""[0-9!@#$%^&*()_+={}\[\]:;<>,.?~\\/|'"`\-\s]+""")
_LUCENE_SPECIAL = re.compile(r'([+\-!(){}\[\]^"~*?:\\/&|])')
# The English stop words kuzu 0.11.3's fulltext index drops (measured: each word indexed as a
# document of its own and searched for; apostrophe forms never survive its tokenizer). It is a
# superset of Lucene's English stop set. Dropping them from every search keeps Neo4j from
# matching words that kuzu cannot match.
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


def vector_candidates(limit: int) -> int:
    """How many neighbours to ask a global vector index for before filtering by group."""
    return max(limit * 10, 100)


# ----------------------------------------------------------------------------- small helpers
def unique(items: Iterable[str]) -> list[str]:
    """Items in first-seen order without duplicates."""
    return list(dict.fromkeys(items))


def clean_labels(labels: Iterable[str]) -> list[str]:
    """Labels that may become real node labels: ``LABEL_RE``-valid and not reserved.
    Anything else is dropped (never escaped into query text)."""
    return unique(
        label
        for label in labels
        if isinstance(label, str) and LABEL_RE.match(label) and label not in RESERVED_LABELS
    )


def search_terms(text: str) -> list[str]:
    """The words a fulltext search looks for, split and filtered identically for both stores:
    lower-cased, cut at kuzu's separators (so digits and ASCII punctuation never match),
    stop words dropped, duplicates removed, at most ``MAX_SEARCH_WORDS``."""
    words = (w for w in _SEARCH_SEPARATORS.split(text.lower()) if w)
    return unique(w for w in words if w not in SEARCH_STOP_WORDS)[:MAX_SEARCH_WORDS]


def search_text(text: str) -> str | None:
    """The search as kuzu takes it (plain words), or None when nothing is searchable (then
    both stores answer with no results)."""
    terms = search_terms(text)
    return " ".join(terms) if terms else None


def lucene_query(text: str) -> str | None:
    """The search as a Lucene query of plain terms (OR-ed): every character that Lucene's
    syntax gives a meaning to is backslash-escaped; all terms are lower case, so AND, OR,
    NOT and TO are words, not operators."""
    terms = search_terms(text)
    if not terms:
        return None
    return " ".join(_LUCENE_SPECIAL.sub(r"\\\1", term) for term in terms)


def check_embedding(embedding: Sequence[float] | None, dim: int, what: str) -> list[float] | None:
    """The embedding as a list of floats, after checking its size and that it has a
    direction (cosine is undefined for the zero vector). None stays None."""
    if embedding is None:
        return None
    values = [float(v) for v in embedding]
    if len(values) != dim:
        raise ValueError(f"{what} has {len(values)} dimensions; the store was set up with {dim}")
    if not all(math.isfinite(v) for v in values) or not any(values):
        raise ValueError(f"{what} must be finite and non-zero")
    return values


def cosine_score(cos: float) -> float:
    """``(1 + cos) / 2`` clamped to [0, 1]."""
    return min(1.0, max(0.0, (1.0 + cos) / 2.0))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_utc(value: Any) -> datetime | None:
    """A datetime from either store as an aware UTC datetime (kuzu returns naive UTC,
    the Neo4j driver its own DateTime; an int is microseconds since the epoch, as
    ``epoch_micros`` projects it)."""
    if value is None:
        return None
    if isinstance(value, int):
        return _EPOCH + timedelta(microseconds=value)
    if hasattr(value, "to_native"):
        value = value.to_native()
    if not isinstance(value, datetime):
        raise TypeError(f"expected a datetime, got {type(value).__name__}")
    return utc(value)


def now_utc() -> datetime:
    return datetime.now(UTC)


@contextmanager
def observe_write(operation: str, rows: int) -> Iterator[None]:
    """Record one write transaction's size and latency."""
    STORE_BATCH_SIZE.labels(operation).observe(rows)
    with STORE_WRITE_LATENCY.labels(operation).time():
        yield


# ----------------------------------------------------------------------------- rows out
def same_group(group_id: str, record_group: str, what: str) -> None:
    if record_group != group_id:
        raise ValueError(f"{what} belongs to group {record_group!r}, not {group_id!r}")


def entity_row(group_id: str, entity: EntityRecord, dim: int, now: datetime) -> dict[str, Any]:
    """The parameters of one entity upsert (aware UTC datetimes)."""
    same_group(group_id, entity.group_id, f"entity {entity.uuid}")
    summary = entity.summary if entity.summary.strip() else None
    return {
        "uuid": entity.uuid,
        "name": entity.name,
        "name_norm": normalize_name(entity.name),
        "labels": clean_labels(entity.labels),
        "summary": summary,
        "key": entity.key,
        "aliases": unique(entity.aliases),
        "name_embedding": check_embedding(
            entity.name_embedding, dim, f"name_embedding of entity {entity.uuid}"
        ),
        "created_at": utc(entity.created_at) if entity.created_at else now,
    }


def fact_row(group_id: str, fact: FactRecord, dim: int, now: datetime) -> dict[str, Any]:
    same_group(group_id, fact.group_id, f"fact {fact.uuid}")
    return {
        "uuid": fact.uuid,
        "source_uuid": fact.source_uuid,
        "target_uuid": fact.target_uuid,
        "name": fact.name,
        "fact": fact.fact,
        "fact_embedding": check_embedding(
            fact.fact_embedding, dim, f"fact_embedding of fact {fact.uuid}"
        ),
        "episodes": list(fact.episodes),
        "valid_at": _opt_utc(fact.valid_at),
        "invalid_at": _opt_utc(fact.invalid_at),
        "created_at": utc(fact.created_at) if fact.created_at else now,
        "expired_at": _opt_utc(fact.expired_at),
        "cardinality": fact.cardinality,
        **end_history_row(fact.prior_ends, fact.prior_ends_learned_at, fact.end_learned_at),
        **_history_row(
            "start", fact.prior_starts, fact.prior_starts_learned_at, fact.start_learned_at
        ),
    }


def end_history_row(
    prior_ends: Sequence[datetime],
    prior_ends_learned_at: Sequence[datetime],
    end_learned_at: datetime | None,
) -> dict[str, Any]:
    """A fact's end history as parameters: None where there is none, which the writes read
    as "leave what is stored" (a history only grows)."""
    return _history_row("end", prior_ends, prior_ends_learned_at, end_learned_at)


def _history_row(
    kind: str, prior: Sequence[datetime], learned: Sequence[datetime], current: datetime | None
) -> dict[str, Any]:
    """``prior_{kind}s``, ``prior_{kind}s_learned_at`` and ``{kind}_learned_at`` (``kind``:
    start or end) as parameters, None where there is none."""
    if len(prior) != len(learned):
        raise ValueError(f"prior_{kind}s and prior_{kind}s_learned_at differ in length")
    return {
        f"prior_{kind}s": [utc(t) for t in prior] or None,
        f"prior_{kind}s_learned_at": [utc(t) for t in learned] or None,
        f"{kind}_learned_at": _opt_utc(current),
    }


def episode_row(group_id: str, episode: EpisodeRecord, now: datetime) -> dict[str, Any]:
    same_group(group_id, episode.group_id, f"episode {episode.uuid}")
    return {
        "uuid": episode.uuid,
        "name": episode.name,
        "source": episode.source,
        "source_description": episode.source_description,
        "content": episode.content,
        "valid_at": utc(episode.valid_at),
        "created_at": utc(episode.created_at) if episode.created_at else now,
        "producer_id": episode.producer_id,
        "content_hash": episode.content_hash or None,
    }


def closure_row(closure: FactClosure) -> dict[str, Any]:
    return {
        "uuid": closure.uuid,
        "invalid_at": utc(closure.invalid_at),
        "expired_at": utc(closure.expired_at),
        **end_history_row(
            closure.prior_ends, closure.prior_ends_learned_at, closure.end_learned_at
        ),
    }


def _opt_utc(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value)


@dataclass
class EntityState:
    """What an upsert may change on a stored entity."""

    labels: list[str]
    aliases: list[str]
    summary: str
    key: str | None

    def merged(self, row: dict[str, Any]) -> EntityState:
        """The state after applying one more upsert row (the MATCH branch of the upsert)."""
        return EntityState(
            labels=unique([*self.labels, *row["labels"]]),
            aliases=unique([*self.aliases, *row["aliases"]]),
            summary=row["summary"] if row["summary"] is not None else self.summary,
            key=self.key if self.key is not None else row["key"],
        )


def fold_entity_rows(
    rows: list[dict[str, Any]], stored: dict[str, EntityState]
) -> tuple[list[dict[str, Any]], dict[str, EntityState]]:
    """Split upsert rows into (rows to create, final state of stored entities to update),
    applying repeated uuids in order exactly as a sequence of MERGEs would."""
    created: dict[str, dict[str, Any]] = {}
    states: dict[str, EntityState] = {}
    for row in rows:
        uuid = row["uuid"]
        if uuid in states:
            states[uuid] = states[uuid].merged(row)
        elif uuid in stored:
            states[uuid] = stored[uuid].merged(row)
        else:
            created[uuid] = row
            states[uuid] = EntityState([], [], "", None).merged(row)
    creates = [{**row, **vars(states[uuid])} for uuid, row in created.items()]
    updates = {uuid: state for uuid, state in states.items() if uuid not in created}
    return creates, updates


# ----------------------------------------------------------------------------- write checks
def check_entity_owners(group_id: str, owners: dict[str, str]) -> None:
    """``owners`` maps stored entity uuids of an upsert to their group."""
    foreign = sorted(u for u, g in owners.items() if g != group_id)
    if foreign:
        raise StoreIntegrityError(
            f"entity uuids already belong to another group: {', '.join(foreign[:5])}"
        )


@dataclass
class StoredFact:
    group_id: str
    source_uuid: str
    target_uuid: str


def check_episode_write(
    group_id: str,
    write: EpisodeWrite,
    episode_group: str | None,
    entity_groups: dict[str, str],
    facts: dict[str, StoredFact],
) -> None:
    """Refuse a write that would cross groups or point at missing entities or facts.

    ``episode_group``: the group of a stored Episodic with the episode's uuid (None if new);
    ``entity_groups``: stored entities among the mentions and fact endpoints, by uuid;
    ``facts``: stored facts among the written and closed fact uuids, by uuid."""
    if episode_group is not None and episode_group != group_id:
        raise StoreIntegrityError(f"episode {write.episode.uuid} belongs to another group")
    needed = unique(
        [*write.mentions, *(u for f in write.facts for u in (f.source_uuid, f.target_uuid))]
    )
    missing = [u for u in needed if entity_groups.get(u) != group_id]
    if missing:
        raise StoreIntegrityError(
            f"entities not in group {group_id!r} (upsert them first): {', '.join(missing[:5])}"
        )
    for fact in write.facts:
        stored = facts.get(fact.uuid)
        if stored is None:
            continue
        if stored.group_id != group_id:
            raise StoreIntegrityError(f"fact {fact.uuid} belongs to another group")
        if (stored.source_uuid, stored.target_uuid) != (fact.source_uuid, fact.target_uuid):
            raise StoreIntegrityError(f"fact {fact.uuid} is stored between other entities")
    written = {f.uuid for f in write.facts}
    unknown = [
        c.uuid
        for c in write.closures
        if c.uuid not in written and (c.uuid not in facts or facts[c.uuid].group_id != group_id)
    ]
    if unknown:
        raise StoreIntegrityError(f"closures of unknown facts: {', '.join(unknown[:5])}")


# ----------------------------------------------------------------------------- rows back
ENTITY_FIELDS = (
    "uuid",
    "group_id",
    "name",
    "labels",
    "summary",
    "key",
    "aliases",
    "name_embedding",
    "created_at",
)
FACT_FIELDS = (
    "uuid",
    "group_id",
    "name",
    "fact",
    "fact_embedding",
    "episodes",
    "valid_at",
    "invalid_at",
    "created_at",
    "expired_at",
    "cardinality",
    "prior_ends",
    "prior_ends_learned_at",
    "end_learned_at",
    "prior_starts",
    "prior_starts_learned_at",
    "start_learned_at",
)
EPISODE_FIELDS = (
    "uuid",
    "group_id",
    "name",
    "source",
    "source_description",
    "content",
    "valid_at",
    "created_at",
    "producer_id",
    "content_hash",
)
_TIME_FIELDS = frozenset(
    {"valid_at", "invalid_at", "created_at", "expired_at", "end_learned_at", "start_learned_at"}
)
_TIME_LIST_FIELDS = frozenset(
    {"prior_ends", "prior_ends_learned_at", "prior_starts", "prior_starts_learned_at"}
)


def _clean(props: dict[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in fields:
        value = props.get(name)
        if name in _TIME_FIELDS:
            value = to_utc(value)
        elif name in _TIME_LIST_FIELDS:
            value = None if value is None else [to_utc(v) for v in value]
        elif isinstance(value, tuple):
            value = list(value)
        if value is not None:
            out[name] = value
    return out


def entity_record(props: dict[str, Any], community_uuid: str | None = None) -> EntityRecord:
    data = _clean(props, ENTITY_FIELDS)
    data.setdefault("summary", "")
    return EntityRecord(**data, community_uuid=community_uuid)


def fact_record(props: dict[str, Any], source_uuid: str, target_uuid: str) -> FactRecord:
    return FactRecord(
        **_clean(props, FACT_FIELDS), source_uuid=source_uuid, target_uuid=target_uuid
    )


def episode_record(props: dict[str, Any]) -> EpisodeRecord:
    data = _clean(props, EPISODE_FIELDS)
    data.setdefault("producer_id", "")
    return EpisodeRecord(**data)


def sort_entities(entities: Iterable[EntityRecord]) -> list[EntityRecord]:
    return sorted(entities, key=lambda e: (e.name, e.uuid))


def sort_facts(facts: Iterable[FactRecord]) -> list[FactRecord]:
    return sorted(facts, key=lambda f: (_time_key(f.valid_at), f.uuid))


def rank(hits: Iterable[tuple[Any, float]], limit: int) -> list[tuple[Any, float]]:
    """Records with scores: best first, ties by uuid, at most ``limit``."""
    return sorted(hits, key=lambda h: (-h[1], h[0].uuid))[: max(limit, 0)]


def top(hits: Iterable[tuple[str, float]], limit: int) -> list[tuple[str, float]]:
    """(uuid, score) pairs: best first, ties by uuid, at most ``limit``."""
    return sorted(hits, key=lambda h: (-h[1], h[0]))[: max(limit, 0)]


def _time_key(value: datetime | None) -> tuple[int, datetime]:
    # None (an open start) sorts first.
    return (0, datetime.min.replace(tzinfo=UTC)) if value is None else (1, value)


def fact_view(
    fact: FactRecord, subject: str, obj: str, producers: dict[str, str], asof: AsOf
) -> FactView:
    """A fact as believed at ``asof.known_at``: an end the store had not learned by then is
    shown as unknown, a start that moved since as it was then. Episodes are producer ids
    (the episode uuid when none is stored)."""
    invalid_at, expired_at = asof.known_end(fact)
    return FactView(
        uuid=fact.uuid,
        subject=subject,
        relation=fact.name,
        object=obj,
        fact=fact.fact,
        valid_at=iso(start_known_at(fact, asof.known_at)),
        invalid_at=iso(invalid_at),
        created_at=iso(fact.created_at),
        expired_at=iso(expired_at),
        episodes=[producers.get(u) or u for u in fact.episodes],
    )


def sort_views(views: Iterable[tuple[FactView, FactRecord]]) -> list[FactView]:
    """Ordered by subject, relation, valid_at (open start first), uuid."""
    ordered = sorted(
        views, key=lambda v: (v[0].subject, v[0].relation, _time_key(v[1].valid_at), v[0].uuid)
    )
    return [view for view, _ in ordered]


# ============================================================================= Neo4j Cypher
ENTITY_VECTOR_INDEX = "entity_name_embedding"
FACT_VECTOR_INDEX = "relates_to_fact_embedding"
ENTITY_FULLTEXT_INDEX = "entity_name_summary"
VECTOR_INDEXES = (ENTITY_VECTOR_INDEX, FACT_VECTOR_INDEX)
FULLTEXT_ANALYZER = "english"  # Porter stemming + English stop words, like kuzu's FTS default

_FULLTEXT_OPTIONS = "OPTIONS {indexConfig: {`fulltext.analyzer`: $analyzer}}"
_VECTOR_OPTIONS = (
    "OPTIONS {indexConfig: {`vector.dimensions`: $dim, `vector.similarity_function`: 'cosine'}}"
)

# Each statement runs alone (schema changes cannot share a transaction with anything else).
SCHEMA = (
    # uniqueness (IS KEY is Enterprise-only); relationship uniqueness works in Community 5.26
    "CREATE CONSTRAINT episodic_uuid IF NOT EXISTS FOR (n:Episodic) REQUIRE n.uuid IS UNIQUE",
    "CREATE CONSTRAINT entity_uuid IF NOT EXISTS FOR (n:Entity) REQUIRE n.uuid IS UNIQUE",
    "CREATE CONSTRAINT community_uuid IF NOT EXISTS FOR (n:Community) REQUIRE n.uuid IS UNIQUE",
    "CREATE CONSTRAINT relates_to_uuid IF NOT EXISTS "
    "FOR ()-[r:RELATES_TO]-() REQUIRE r.uuid IS UNIQUE",
    # range
    "CREATE INDEX episodic_group_id IF NOT EXISTS FOR (n:Episodic) ON (n.group_id)",
    "CREATE INDEX episodic_valid_at IF NOT EXISTS FOR (n:Episodic) ON (n.valid_at)",
    "CREATE INDEX entity_group_id IF NOT EXISTS FOR (n:Entity) ON (n.group_id)",
    "CREATE INDEX entity_name_norm IF NOT EXISTS FOR (n:Entity) ON (n.name_norm)",
    "CREATE INDEX entity_key IF NOT EXISTS FOR (n:Entity) ON (n.key)",
    # a stable key is looked up within its group (the same CRM ids recur in every tenant)
    "CREATE INDEX entity_group_key IF NOT EXISTS FOR (n:Entity) ON (n.group_id, n.key)",
    "CREATE INDEX community_group_id IF NOT EXISTS FOR (n:Community) ON (n.group_id)",
    "CREATE INDEX mentions_group_id IF NOT EXISTS FOR ()-[r:MENTIONS]-() ON (r.group_id)",
    "CREATE INDEX has_member_group_id IF NOT EXISTS FOR ()-[r:HAS_MEMBER]-() ON (r.group_id)",
    "CREATE INDEX relates_to_group_id IF NOT EXISTS FOR ()-[r:RELATES_TO]-() ON (r.group_id)",
    "CREATE INDEX relates_to_valid_at IF NOT EXISTS FOR ()-[r:RELATES_TO]-() ON (r.valid_at)",
    "CREATE INDEX relates_to_invalid_at IF NOT EXISTS FOR ()-[r:RELATES_TO]-() ON (r.invalid_at)",
    "CREATE INDEX relates_to_created_at IF NOT EXISTS FOR ()-[r:RELATES_TO]-() ON (r.created_at)",
    "CREATE INDEX relates_to_expired_at IF NOT EXISTS FOR ()-[r:RELATES_TO]-() ON (r.expired_at)",
    # fulltext
    "CREATE FULLTEXT INDEX entity_name_summary IF NOT EXISTS "
    "FOR (n:Entity) ON EACH [n.name, n.summary] " + _FULLTEXT_OPTIONS,
    "CREATE FULLTEXT INDEX relates_to_fact IF NOT EXISTS "
    "FOR ()-[r:RELATES_TO]-() ON EACH [r.fact] " + _FULLTEXT_OPTIONS,
    "CREATE FULLTEXT INDEX episodic_content IF NOT EXISTS "
    "FOR (n:Episodic) ON EACH [n.content] " + _FULLTEXT_OPTIONS,
    "CREATE FULLTEXT INDEX community_name IF NOT EXISTS "
    "FOR (n:Community) ON EACH [n.name] " + _FULLTEXT_OPTIONS,
    # vector (HNSW)
    "CREATE VECTOR INDEX entity_name_embedding IF NOT EXISTS "
    "FOR (n:Entity) ON n.name_embedding " + _VECTOR_OPTIONS,
    "CREATE VECTOR INDEX relates_to_fact_embedding IF NOT EXISTS "
    "FOR ()-[r:RELATES_TO]-() ON r.fact_embedding " + _VECTOR_OPTIONS,
)

SHOW_VECTOR_INDEXES = """
SHOW VECTOR INDEXES YIELD name, options
WHERE name IN $names
RETURN name, options.indexConfig.`vector.dimensions` AS dim
"""

AWAIT_INDEXES = "CALL db.awaitIndexes($timeout)"

# ---- episodes
# Lookups by uuid name the uniqueness constraint's index: without the hint the planner may
# pick the group_id index and filter every episode (entity, fact) of the group instead.
# No hint here: clients (`ingest --via kafka`, `dlq replay`) ask before any worker may have
# created the schema, and a hint on a missing index is an error; the planner picks the unique
# index seek for this shape by itself (checked with EXPLAIN).
EPISODE_PROCESSED = """
OPTIONAL MATCH (ep:Episodic {uuid: $uuid})
WHERE ep.group_id = $group_id
RETURN ep IS NOT NULL AS processed, ep.content_hash AS content_hash
"""

RECENT_EPISODES = """
MATCH (ep:Episodic)
WHERE ep.group_id = $group_id AND ep.valid_at < $before
RETURN ep {.*} AS ep
ORDER BY ep.valid_at DESC, ep.uuid DESC
LIMIT $limit
"""

PRODUCER_IDS = """
MATCH (ep:Episodic)
WHERE ep.uuid IN $uuids AND ep.group_id = $group_id
RETURN ep.uuid AS uuid, ep.producer_id AS producer_id
"""

# ---- entities
_COMMUNITY_OF_E = """COLLECT {
  MATCH (c:Community)-[:HAS_MEMBER]->(e) WHERE c.group_id = $group_id
  RETURN c.uuid ORDER BY c.uuid LIMIT 1
}[0]"""

# The entity projection every entity read ends with.
_ENTITY_RETURN = f"""
RETURN e {{.*}} AS e,
       {_COMMUNITY_OF_E} AS community_uuid
"""

ENTITY_GROUPS = """
MATCH (e:Entity)
WHERE e.uuid IN $uuids
RETURN e.uuid AS uuid, e.group_id AS group_id
"""

# One MERGE per row of ``$rows_param``; on match, labels and aliases are added (set union),
# the summary replaced when the row has one and the key set while null.
_UPSERT_ENTITY_ROWS = """
UNWIND {rows} AS row
MERGE (e:Entity {{uuid: row.uuid}})
ON CREATE SET e.group_id = $group_id,
              e.name = row.name,
              e.name_norm = row.name_norm,
              e.summary = '',
              e.name_embedding = row.name_embedding,
              e.created_at = row.created_at
SET e.labels = coalesce(e.labels, [])
               + [label IN row.labels WHERE NOT label IN coalesce(e.labels, [])],
    e.aliases = coalesce(e.aliases, [])
                + [alias IN row.aliases WHERE NOT alias IN coalesce(e.aliases, [])],
    e.summary = coalesce(row.summary, e.summary),
    e.key = coalesce(e.key, row.key)
SET e:$(row.labels)
"""
UPSERT_ENTITIES = _UPSERT_ENTITY_ROWS.format(rows="$rows")

_ENTITIES_NAMED = """
MATCH (e:Entity)
WHERE e.group_id = $group_id
  AND (e.name_norm IN $names OR any(alias IN e.aliases WHERE alias IN $names))
"""
_ENTITIES_KEYED = """
MATCH (e:Entity)
USING INDEX e:Entity(group_id, key)
WHERE e.group_id = $group_id AND e.key IN $keys
"""

ENTITIES_BY_NAMES = _ENTITIES_NAMED + _ENTITY_RETURN

ENTITIES_BY_KEYS = _ENTITIES_KEYED + _ENTITY_RETURN


def epoch_micros(expression: str) -> str:
    """Cypher for a datetime as microseconds since the epoch (null stays null): the driver
    turns an int into Python far faster than a DateTime, and ``to_utc`` reads it back."""
    return f"{expression}.epochSeconds * 1000000 + {expression}.microsecond"


def _times_as_micros(variable: str, fields: tuple[str, ...]) -> str:
    return ", ".join(f"{name}: {epoch_micros(f'{variable}.{name}')}" for name in fields)


_FACT_TIMES = _times_as_micros("r", ("valid_at", "invalid_at", "created_at", "expired_at"))

# Everything resolution needs in one round trip: whether the episode is already processed
# (then nothing else is read), the entities matching the drafts' keys or names (without their
# name embeddings and communities, which resolution does not use) and, of each, the stored facts
# it is the source of with a relation in $relations (without their embeddings). One row per
# entity found (``how``: key or name), or a single row with a null entity.
RESOLUTION_LOOKUP = (
    """
OPTIONAL MATCH (ep:Episodic {uuid: $episode_uuid})
USING INDEX ep:Episodic(uuid)
WHERE ep.group_id = $group_id
WITH ep IS NOT NULL AS processed, ep.content_hash AS stored_hash
OPTIONAL CALL (processed) {
  WITH processed WHERE NOT processed"""
    + _ENTITIES_KEYED
    + """  RETURN e, 'key' AS how
  UNION ALL
  WITH processed WHERE NOT processed"""
    + _ENTITIES_NAMED
    + """  RETURN e, 'name' AS how
}
RETURN processed, stored_hash, how,
       e {.*, name_embedding: null, """
    + _times_as_micros("e", ("created_at",))
    + """} AS e,
       COLLECT {
         MATCH (e)-[r:RELATES_TO]->(t:Entity)
         WHERE r.group_id = $group_id AND r.name IN $relations
         RETURN r {.*, fact_embedding: null, target_uuid: t.uuid, """
    + _FACT_TIMES
    + """}
       } AS facts
"""
)

ENTITIES_BY_UUIDS = (
    """
MATCH (e:Entity)
WHERE e.uuid IN $uuids AND e.group_id = $group_id
"""
    + _ENTITY_RETURN
)

LIST_ENTITIES = (
    """
MATCH (e:Entity)
WHERE e.group_id = $group_id
"""
    + _ENTITY_RETURN
)

FULLTEXT_ENTITIES = (
    """
CALL db.index.fulltext.queryNodes($index, $query) YIELD node, score
WITH node AS e, score
WHERE e.group_id = $group_id
ORDER BY score DESC, e.uuid
LIMIT $limit
WITH e, score
"""
    + _ENTITY_RETURN
    + ", score"
)

# Ask the global index for $k neighbours and keep this group's, rescored exactly on the stored
# vectors (the index's own scores are approximate: its vectors are quantized).
VECTOR_ENTITY_CANDIDATES = """
CALL db.index.vector.queryNodes($index, $k, $embedding) YIELD node, score
WITH collect(
       CASE WHEN node.group_id = $group_id
       THEN {uuid: node.uuid, score: vector.similarity.cosine(node.name_embedding, $embedding)}
       END
     ) AS hits, count(*) AS raw
RETURN raw, hits
"""

# Exact cosine over the group (when the group is a small part of the index).
VECTOR_ENTITY_SCAN = """
MATCH (e:Entity)
WHERE e.group_id = $group_id AND e.name_embedding IS NOT NULL
WITH e, vector.similarity.cosine(e.name_embedding, $embedding) AS score
ORDER BY score DESC, e.uuid
LIMIT $limit
RETURN e.uuid AS uuid, score
"""

# ---- facts
_FACT_RETURN = """
RETURN r {.*} AS r, s.uuid AS source_uuid, t.uuid AS target_uuid
"""
_MERGE_FACT_ROWS = """
UNWIND {rows} AS row
MATCH (s:Entity {{uuid: row.source_uuid}}), (t:Entity {{uuid: row.target_uuid}})
MERGE (s)-[r:RELATES_TO {{uuid: row.uuid}}]->(t)
ON CREATE SET r.group_id = $group_id, r.created_at = row.created_at
SET r.name = row.name,
    r.fact = row.fact,
    r.fact_embedding = coalesce(row.fact_embedding, r.fact_embedding),
    r.episodes = row.episodes,
    r.valid_at = row.valid_at,
    r.invalid_at = row.invalid_at,
    r.cardinality = row.cardinality,
    r.prior_ends = coalesce(row.prior_ends, r.prior_ends),
    r.prior_ends_learned_at = coalesce(row.prior_ends_learned_at, r.prior_ends_learned_at),
    r.end_learned_at = coalesce(row.end_learned_at, r.end_learned_at),
    r.prior_starts = coalesce(row.prior_starts, r.prior_starts),
    r.prior_starts_learned_at = coalesce(row.prior_starts_learned_at, r.prior_starts_learned_at),
    r.start_learned_at = coalesce(row.start_learned_at, r.start_learned_at),
    r.expired_at = coalesce(r.expired_at, row.expired_at)
"""

_CLOSE_FACT_ROWS = """
UNWIND {rows} AS row
MATCH ()-[r:RELATES_TO {{uuid: row.uuid}}]->()
USING INDEX r:RELATES_TO(uuid)
WHERE r.group_id = $group_id
SET r.invalid_at = row.invalid_at,
    r.prior_ends = coalesce(row.prior_ends, r.prior_ends),
    r.prior_ends_learned_at = coalesce(row.prior_ends_learned_at, r.prior_ends_learned_at),
    r.end_learned_at = coalesce(row.end_learned_at, r.end_learned_at),
    r.expired_at = coalesce(r.expired_at, row.expired_at)
"""

FACTS_TOUCHING = (
    """
UNWIND $uuids AS uuid
MATCH (e:Entity {uuid: uuid})-[r:RELATES_TO]-()
USING INDEX e:Entity(uuid)
WHERE e.group_id = $group_id AND r.group_id = $group_id
WITH DISTINCT r
MATCH (s:Entity)-[r]->(t:Entity)
"""
    + _FACT_RETURN
)

# The stored facts a new episode's facts can merge with or close: those of each
# (subject, relation) in $pairs, and every fact touching an entity of $ends.
_FACT_CANDIDATES = """
CALL () {
  UNWIND $pairs AS pair
  MATCH (s:Entity {uuid: pair.source})-[r:RELATES_TO]->(:Entity)
  USING INDEX s:Entity(uuid)
  WHERE s.group_id = $group_id AND r.group_id = $group_id AND r.name = pair.relation
  RETURN r
  UNION
  UNWIND $ends AS uuid
  MATCH (e:Entity {uuid: uuid})-[r:RELATES_TO]-(:Entity)
  USING INDEX e:Entity(uuid)
  WHERE e.group_id = $group_id AND r.group_id = $group_id
  RETURN r
}
MATCH (s:Entity)-[r]->(t:Entity)
"""
# (times as epoch microseconds: see epoch_micros)
FACT_CANDIDATES = (
    _FACT_CANDIDATES
    + f"RETURN r {{.*, {_FACT_TIMES}}} AS r, s.uuid AS source_uuid, t.uuid AS target_uuid\n"
)
FACT_CANDIDATES_PLAIN = (
    _FACT_CANDIDATES
    + f"RETURN r {{.*, fact_embedding: null, {_FACT_TIMES}}} AS r, "
    + "s.uuid AS source_uuid, t.uuid AS target_uuid\n"
)

FACTS_BY_UUIDS_FULL = (
    """
MATCH (s:Entity)-[r:RELATES_TO]->(t:Entity)
WHERE r.uuid IN $uuids AND r.group_id = $group_id
"""
    + _FACT_RETURN
)

# ---- one episode's write: one read of what it touches, then one write
# What the checks of an episode write need (see ``check_episode_write``): the group of a stored
# Episodic with this uuid (the processed marker), and of the stored entities and facts the
# write names.
WRITE_STATE = """
OPTIONAL MATCH (ep:Episodic {uuid: $episode_uuid})
WITH ep.group_id AS episode_group, ep.content_hash AS episode_hash
CALL () {
  UNWIND $entity_uuids AS uuid
  MATCH (e:Entity {uuid: uuid})
  RETURN collect([e.uuid, e.group_id]) AS entities
}
CALL () {
  UNWIND $fact_uuids AS uuid
  MATCH (s)-[r:RELATES_TO {uuid: uuid}]->(t)
  RETURN collect([r.uuid, r.group_id, s.uuid, t.uuid]) AS facts
}
RETURN episode_group, episode_hash, entities, facts
"""

# Entities first (mentions and facts point at them), then the Episodic marker, its MENTIONS,
# the facts (full state) and the closures, in one statement.
WRITE_EPISODE = (
    "CALL () {"
    + _UPSERT_ENTITY_ROWS.format(rows="$entities")
    + """}
MERGE (ep:Episodic {uuid: $ep.uuid})
ON CREATE SET ep.group_id = $group_id, ep.created_at = $ep.created_at
SET ep.name = $ep.name,
    ep.source = $ep.source,
    ep.source_description = $ep.source_description,
    ep.content = $ep.content,
    ep.valid_at = $ep.valid_at,
    ep.producer_id = $ep.producer_id,
    ep.content_hash = $ep.content_hash
WITH ep
CALL (ep) {
  UNWIND $mentions AS mention
  MATCH (e:Entity {uuid: mention})
  MERGE (ep)-[m:MENTIONS]->(e)
  ON CREATE SET m.group_id = $group_id
}
CALL () {"""
    + _MERGE_FACT_ROWS.format(rows="$facts")
    + "}\nCALL () {"
    + _CLOSE_FACT_ROWS.format(rows="$closures")
    + "}\n"
)

VECTOR_FACT_CANDIDATES = """
CALL db.index.vector.queryRelationships($index, $k, $embedding) YIELD relationship, score
WITH collect(
       CASE WHEN relationship.group_id = $group_id
       THEN {
         uuid: relationship.uuid,
         score: vector.similarity.cosine(relationship.fact_embedding, $embedding)
       }
       END
     ) AS hits, count(*) AS raw
RETURN raw, hits
"""

VECTOR_FACT_SCAN = """
MATCH ()-[r:RELATES_TO]->()
WHERE r.group_id = $group_id AND r.fact_embedding IS NOT NULL
WITH r, vector.similarity.cosine(r.fact_embedding, $embedding) AS score
ORDER BY score DESC, r.uuid
LIMIT $limit
RETURN r.uuid AS uuid, score
"""


# How each store is told to walk from the anchor node of an as-of question about one entity
# (see ``as_of_query``): text after the MATCH pattern, text after its WHERE.
AnchorHints = dict[str, tuple[str, str]]
NEO4J_ANCHOR_HINTS: AnchorHints = {
    "s": ("USING INDEX s:Entity(uuid)", ""),
    "t": ("USING INDEX t:Entity(uuid)", ""),
}


def as_of_match(asof: AsOf, anchor: str | None = None, hints: AnchorHints | None = None) -> str:
    """The MATCH of an as-of question, the same text for both stores (kuzu speaks this much
    Cypher); the clauses are chosen from constants, the values are parameters ($group_id,
    $known_at, $valid_at unless include_invalid, $entity_uuid with an anchor). Binds s, r, t.

    ``anchor`` "s" or "t": only facts whose source (target) is $entity_uuid, found from that
    node by its uuid (a fact with the entity at both ends is the source's); see
    ``as_of_query``.

    A fact is believed at $known_at when created by then; its invalid_at counts only when
    its expired_at is known by then. It is valid at $valid_at when valid_at <= t < invalid_at
    (a null valid_at is an open start, a null invalid_at an open end). When the end moved
    after $known_at (``end_learned_at``), the end believed then is one of ``prior_ends``:
    such a fact is let through here and ``AsOf.believed`` decides it. A start only ever moves
    earlier (``prior_starts``), so the current valid_at lets through every fact whose start
    believed then fits, and ``AsOf.believed`` decides those too. With $known_at = now (the
    graph questions of communities) this match is exact."""
    where = ["r.group_id = $group_id", "r.created_at <= $known_at"]
    after_match = after_where = ""
    if anchor == "s":
        where.insert(0, "s.uuid = $entity_uuid")
    elif anchor == "t":
        where.insert(0, "t.uuid = $entity_uuid AND s.uuid <> $entity_uuid")
    elif anchor is not None:
        raise ValueError(f"anchor must be 's' or 't', not {anchor!r}")
    if anchor is not None and hints is not None:
        after_match, after_where = hints[anchor]
    text = "MATCH (s:Entity)-[r:RELATES_TO]->(t:Entity)\n"
    text += f"{after_match}\n" if after_match else ""
    text += "WHERE " + " AND ".join(where)
    text += f"\n{after_where}" if after_where else ""
    if not asof.include_invalid:
        text += """
WITH s, r, t,
     CASE WHEN coalesce(r.end_learned_at, r.expired_at) <= $known_at
          THEN r.invalid_at ELSE NULL END AS known_invalid
WHERE (r.valid_at IS NULL OR r.valid_at <= $valid_at)
  AND (known_invalid IS NULL OR $valid_at < known_invalid)"""
    return text + "\n"


def as_of_query(asof: AsOf, tail: str, hints: AnchorHints | None = None) -> str:
    """An as-of question with its RETURN ``tail``. About one entity, it is two matches joined
    by UNION ALL, each walking from the entity's node (found by its uuid, as the store's
    ``hints`` say) in one direction, instead of one match over every fact of the group
    filtered on either end."""
    tail = tail.rstrip("\n") + "\n"
    if asof.entity_uuid is None:
        return as_of_match(asof) + tail
    from_source = as_of_match(asof, "s", hints) + tail
    return from_source + "UNION ALL\n" + as_of_match(asof, "t", hints) + tail


def as_of_params(group_id: str, asof: AsOf) -> dict[str, Any]:
    """Exactly the parameters ``as_of_query(asof, ...)`` uses."""
    params: dict[str, Any] = {"group_id": group_id, "known_at": asof.known_at}
    if not asof.include_invalid:
        params["valid_at"] = asof.valid_at
    if asof.entity_uuid is not None:
        params["entity_uuid"] = asof.entity_uuid
    return params


def query_facts_cypher(asof: AsOf) -> str:
    return as_of_query(
        asof,
        "RETURN r {.*} AS r, s.uuid AS source_uuid, t.uuid AS target_uuid, "
        "s.name AS subject, t.name AS object",
        NEO4J_ANCHOR_HINTS,
    )


# ---- maintenance
COUNTS = """
CALL () { MATCH (ep:Episodic) WHERE ep.group_id = $group_id RETURN count(ep) AS episodes }
CALL () { MATCH (e:Entity) WHERE e.group_id = $group_id RETURN count(e) AS entities }
CALL () {
  MATCH ()-[r:RELATES_TO]->() WHERE r.group_id = $group_id RETURN count(r) AS facts
}
CALL () {
  MATCH (ep:Episodic)-[m:MENTIONS]->() WHERE ep.group_id = $group_id RETURN count(m) AS mentions
}
RETURN episodes, entities, facts, mentions
"""

# One batch per call, per label (the group_id index is per label); repeat until 0.
DELETE_GROUP_BATCH = {
    # Facts first, in batches of their own: deleting a well-connected entity would otherwise
    # delete all its facts (with their embeddings) in one transaction.
    "RELATES_TO": """
MATCH (s:Entity)-[r:RELATES_TO]->()
WHERE s.group_id = $group_id
WITH r LIMIT $batch
DELETE r
RETURN count(*) AS deleted
""",
    **{
        label: f"""
MATCH (n:{label})
WHERE n.group_id = $group_id
WITH n LIMIT $batch
DETACH DELETE n
RETURN count(*) AS deleted
"""
        for label in ("Episodic", "Community", "Entity")
    },
}


# ---- communities (the same text for both stores; kuzu speaks this much Cypher)
GROUP_ENTITY_UUIDS = "MATCH (e:Entity) WHERE e.group_id = $group_id RETURN e.uuid"


def entity_graph_cypher(asof: AsOf, hints: AnchorHints | None = None) -> str:
    """Valid facts counted per ordered (source, target) pair; self-loops dropped."""
    tail = "WITH s, t WHERE s.uuid <> t.uuid\nRETURN s.uuid, t.uuid, count(*)"
    return as_of_query(asof, tail, hints)


def fold_edges(rows: Iterable[Sequence[Any]]) -> list[tuple[str, str, int]]:
    """(source, target, count) rows → undirected (a < b) weighted pairs, sorted."""
    weights: dict[tuple[str, str], int] = {}
    for source, target, count in rows:
        if source == target:
            continue
        pair = (source, target) if source < target else (target, source)
        weights[pair] = weights.get(pair, 0) + int(count)
    return [(a, b, w) for (a, b), w in sorted(weights.items())]


def neighbour_weights_of(entity_uuid: str, rows: Iterable[Sequence[Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a, b, w in fold_edges(rows):
        other = b if a == entity_uuid else a if b == entity_uuid else None
        if other is not None:
            out[other] = out.get(other, 0) + w
    return dict(sorted(out.items()))


GROUP_COMMUNITIES = (
    "MATCH (c:Community) WHERE c.group_id = $group_id RETURN c.uuid, c.name, c.summary"
)
GROUP_COMMUNITY_MEMBERS = """
MATCH (c:Community)-[:HAS_MEMBER]->(e:Entity)
WHERE c.group_id = $group_id AND e.group_id = $group_id
RETURN c.uuid, e.uuid
"""
COMMUNITY_GROUPS = "MATCH (c:Community) WHERE c.uuid IN $uuids RETURN c.uuid, c.group_id"
DELETE_COMMUNITIES = """
MATCH (c:Community) WHERE c.uuid IN $uuids AND c.group_id = $group_id DETACH DELETE c
"""
UPSERT_COMMUNITIES = """
UNWIND $rows AS row
MERGE (c:Community {uuid: row.uuid})
ON CREATE SET c.group_id = $group_id
SET c.name = row.name,
    c.summary = row.summary,
    c.name_embedding = coalesce(row.name_embedding, c.name_embedding)
"""
DROP_MEMBERSHIPS = """
MATCH (c:Community)-[m:HAS_MEMBER]->(e:Entity)
WHERE c.group_id = $group_id AND (c.uuid IN $uuids OR e.uuid IN $members)
DELETE m
"""
ADD_MEMBERSHIPS = """
UNWIND $rows AS row
MATCH (c:Community {uuid: row.community}), (e:Entity {uuid: row.entity})
WHERE c.group_id = $group_id AND e.group_id = $group_id
CREATE (c)-[:HAS_MEMBER {group_id: $group_id}]->(e)
"""
MEMBER_TARGETS = """
MATCH (c:Community), (e:Entity)
WHERE c.uuid = $community_uuid AND c.group_id = $group_id
  AND e.uuid = $entity_uuid AND e.group_id = $group_id
RETURN count(*)
"""
DROP_OTHER_MEMBERSHIPS = """
MATCH (c:Community)-[m:HAS_MEMBER]->(e:Entity)
WHERE c.group_id = $group_id AND e.uuid = $entity_uuid AND c.uuid <> $community_uuid
DELETE m
"""
MERGE_MEMBERSHIP = """
MATCH (c:Community), (e:Entity)
WHERE c.uuid = $community_uuid AND c.group_id = $group_id
  AND e.uuid = $entity_uuid AND e.group_id = $group_id
MERGE (c)-[m:HAS_MEMBER]->(e)
ON CREATE SET m.group_id = $group_id
"""


def check_community_owners(group_id: str, owners: dict[str, str]) -> None:
    for uuid, owner in sorted(owners.items()):
        if owner != group_id:
            raise StoreIntegrityError(f"community {uuid} belongs to another group")


def community_rows(
    upserts: Sequence[Any], dim: int
) -> tuple[list[dict[str, Any]], list[dict[str, str]], list[str]]:
    """(community rows, membership rows, member uuids) for ``write_communities``; a member
    listed by two upserts stays with the last one."""
    owner: dict[str, str] = {}
    rows = []
    for c in upserts:
        embedding = check_embedding(c.name_embedding, dim, "community name embedding")
        rows.append(
            {"uuid": c.uuid, "name": c.name, "summary": c.summary, "name_embedding": embedding}
        )
        for member in c.members:
            owner[member] = c.uuid
    members = sorted(owner)
    return rows, [{"community": owner[m], "entity": m} for m in members], members


def fold_communities(
    heads: Iterable[Sequence[Any]], memberships: Iterable[Sequence[Any]]
) -> list[tuple[str, str, str, list[str]]]:
    members: dict[str, list[str]] = {}
    for community, entity in memberships:
        members.setdefault(community, []).append(entity)
    return sorted(
        (uuid, name or "", summary or "", sorted(set(members.get(uuid, []))))
        for uuid, name, summary in heads
    )
