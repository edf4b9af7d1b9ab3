"""The as-of filter as Cypher (the Neo4j store's; the embedded store's SQL is
``sqlite_rows.believed_sql``): which facts a question "valid at T, as believed at K" may
answer with. The rules are ``tidegraph.records.asof``; this filter lets through a superset of
them (a fact whose end or start moved later) and ``AsOf.believed`` decides each fact it lets
through.

The clauses are chosen from constants, the values are parameters ($group_id, $known_at,
$valid_at unless include_invalid, $entity_uuid with an anchor): see ``as_of_params``."""

from __future__ import annotations

from typing import Any

from tidegraph.records.asof import AsOf

# How each engine is told to walk from the anchor node of an as-of question about one entity
# (see ``as_of_query``), and under ``WHOLE_GROUP`` how to find a whole group's facts: text
# after the MATCH pattern, text after its WHERE.
AnchorHints = dict[str, tuple[str, str]]
WHOLE_GROUP = "group"

# Valid facts counted per ordered (source, target) pair, self-loops dropped: the entity graph
# of communities (``rows.fold_edges`` makes it undirected).
ENTITY_GRAPH_RETURN = (
    "WITH s, t WHERE s.uuid <> t.uuid\n"
    "RETURN s.uuid AS source, t.uuid AS target, count(*) AS weight"
)


def as_of_match(
    asof: AsOf,
    anchor: str | None = None,
    hints: AnchorHints | None = None,
    entity: str = "$entity_uuid",
) -> str:
    """The MATCH of an as-of question. Binds s, r, t.

    ``anchor`` "s" or "t": only facts whose source (target) is ``entity`` (the parameter
    $entity_uuid, or a variable the caller binds), found from that node by its uuid (a fact
    with the entity at both ends is the source's); see ``as_of_query``.

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
        where.insert(0, f"s.uuid = {entity}")
    elif anchor == "t":
        where.insert(0, f"t.uuid = {entity} AND s.uuid <> {entity}")
    elif anchor is not None:
        raise ValueError(f"anchor must be 's' or 't', not {anchor!r}")
    if anchor is not None and hints is not None:
        after_match, after_where = hints[anchor]
    elif hints is not None and WHOLE_GROUP in hints:
        after_match, after_where = hints[WHOLE_GROUP]
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
    by UNION ALL, each walking from the entity's node (found by its uuid, as the engine's
    ``hints`` say) in one direction, instead of one match over every fact of the group
    filtered on either end."""
    if asof.entity_uuid is None:
        return as_of_match(asof, None, hints) + tail.rstrip("\n") + "\n"
    return anchored_query(asof, tail, hints)


def anchored_query(
    asof: AsOf, tail: str, hints: AnchorHints | None = None, entity: str = "$entity_uuid"
) -> str:
    """``as_of_query`` about the entity ``entity`` (the parameter, or a variable the caller
    binds, e.g. inside ``CALL (entity_uuid) { … }`` for several entities in one statement)."""
    tail = tail.rstrip("\n") + "\n"
    from_source = as_of_match(asof, "s", hints, entity) + tail
    return from_source + "UNION ALL\n" + as_of_match(asof, "t", hints, entity) + tail


def as_of_params(group_id: str, asof: AsOf) -> dict[str, Any]:
    """Exactly the parameters ``as_of_query(asof, ...)`` uses (one group per question)."""
    params: dict[str, Any] = {"group_id": group_id, "known_at": asof.known_at}
    if not asof.include_invalid:
        params["valid_at"] = asof.valid_at
    if asof.entity_uuid is not None:
        params["entity_uuid"] = asof.entity_uuid
    return params
