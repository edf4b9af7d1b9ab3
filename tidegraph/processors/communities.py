"""Communities, as pure logic (docs/communities.md "Communities"): no store, no LLM, no clock.

- ``assign_by_majority``: the community a new entity joins (weighted neighbour majority);
- ``label_propagation``: a deterministic, capped, weighted asynchronous label propagation;
- ``plan_refresh``: the diff of a fresh partition against the stored communities, keeping
  the uuid (and name and summary) of every stored community matched to a new one;
- ``adjusted_rand_index``, ``normalized_mutual_info``, ``adjusted_mutual_info`` (scikit-learn),
  ``modularity`` (networkx): agreement and quality;
- ``default_name`` and the summary prompt for ``CommunitySummaryOutput``.

A partition is a ``dict`` entity uuid -> label (any string); an entity missing from one side
of a comparison counts as a community of its own there.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx
from pydantic import BaseModel
from sklearn.metrics import (
    adjusted_mutual_info_score,
    adjusted_rand_score,
    normalized_mutual_info_score,
)

from tidegraph.records.graph import CommunityRecord, WeightedEdge
from tidegraph.records.ids import stable_uuid

Partition = Mapping[str, str]
MIN_COMMUNITY_SIZE = 2
DEFAULT_MAX_ITERATIONS = 30


# ----------------------------------------------------------------------------- assignment
def assign_by_majority(
    neighbour_weights: Mapping[str, int], communities: Mapping[str, str | None]
) -> str | None:
    """The community holding the largest total weight among the neighbours; ties go to the
    smallest community uuid. None when no neighbour is in a community."""
    totals: dict[str, int] = defaultdict(int)
    for neighbour, weight in neighbour_weights.items():
        community = communities.get(neighbour)
        if community is not None and weight > 0:
            totals[community] += weight
    if not totals:
        return None
    return min(totals, key=lambda c: (-totals[c], c))


# ----------------------------------------------------------------------------- propagation
@dataclass(frozen=True)
class Propagation:
    labels: dict[str, str]  # entity uuid -> label (an entity uuid of the community)
    iterations: int
    converged: bool


def _adjacency(nodes: Iterable[str], edges: Iterable[WeightedEdge]) -> dict[str, dict[str, int]]:
    adj: dict[str, dict[str, int]] = {n: {} for n in sorted(set(nodes))}
    for e in sorted(edges, key=lambda e: (e.source, e.target)):
        if e.source == e.target or e.weight <= 0:
            continue
        for a, b in ((e.source, e.target), (e.target, e.source)):
            adj.setdefault(a, {})
            adj.setdefault(b, {})
            adj[a][b] = adj[a].get(b, 0) + e.weight
    return adj


def label_propagation(
    nodes: Iterable[str],
    edges: Iterable[WeightedEdge],
    *,
    seed: int = 0,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
) -> Propagation:
    """Weighted asynchronous label propagation (Raghavan et al.), as networkx's
    ``asyn_lpa_communities`` does it, plus an iteration cap. Deterministic for a seed: the
    visiting order of each sweep is a seeded shuffle of the sorted nodes; a node keeps its
    label while it is among the heaviest, else takes one of the heaviest (seeded choice
    among them, sorted). Stops when a sweep changes nothing or after ``max_iterations``."""
    if max_iterations < 1:
        raise ValueError("max_iterations must be at least 1")
    adj = _adjacency(nodes, edges)
    labels = {n: n for n in adj}
    order = sorted(adj)
    rng = random.Random(seed)
    for sweep in range(1, max_iterations + 1):
        rng.shuffle(order)
        changed = False
        for node in order:
            neighbours = adj[node]
            if not neighbours:
                continue
            weights: dict[str, int] = defaultdict(int)
            for other, weight in neighbours.items():
                weights[labels[other]] += weight
            best = max(weights.values())
            heaviest = sorted(label for label, w in weights.items() if w == best)
            if labels[node] in heaviest:
                continue
            labels[node] = heaviest[0] if len(heaviest) == 1 else rng.choice(heaviest)
            changed = True
        if not changed:
            return Propagation(labels, sweep, True)
    return Propagation(labels, max_iterations, False)


def groups(partition: Partition) -> list[list[str]]:
    """The communities of a partition, members sorted, ordered by first member."""
    by_label: dict[str, list[str]] = defaultdict(list)
    for entity, label in partition.items():
        by_label[label].append(entity)
    return sorted(sorted(members) for members in by_label.values())


def partition_of(communities: Iterable[CommunityRecord]) -> dict[str, str]:
    return {m: c.uuid for c in communities for m in c.members}


# ----------------------------------------------------------------------------- refresh diff
@dataclass
class RefreshPlan:
    unchanged: list[CommunityRecord] = field(default_factory=list)
    changed: list[CommunityRecord] = field(default_factory=list)  # stored uuid, new members
    created: list[CommunityRecord] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    @property
    def rewrites(self) -> list[CommunityRecord]:
        return [*self.changed, *self.created]


def community_uuid(group_id: str, members: Sequence[str]) -> str:
    """The uuid of a new community: from its (sorted) founding members."""
    return stable_uuid("community", group_id, *sorted(members))


def plan_refresh(
    group_id: str,
    stored: Sequence[CommunityRecord],
    fresh: Partition,
    *,
    min_size: int = MIN_COMMUNITY_SIZE,
) -> RefreshPlan:
    """Match each fresh community (of at least ``min_size`` members) to the stored community
    it shares most members with, one to one, greedily by overlap (ties: smaller stored uuid,
    then smaller first member). A matched pair with the same members is unchanged (kept as
    stored); with other members it is changed (uuid, name and summary kept until rewritten);
    an unmatched fresh community is created; an unmatched stored one is deleted."""
    fresh_groups = [g for g in groups(fresh) if len(g) >= min_size]
    owner = partition_of(stored)
    overlaps: list[tuple[int, str, str, int]] = []
    for index, members in enumerate(fresh_groups):
        shared = Counter(owner[m] for m in members if m in owner)
        overlaps += [(-n, uuid, members[0], index) for uuid, n in shared.items()]
    by_uuid = {c.uuid: c for c in stored}
    matched: dict[int, str] = {}
    taken: set[str] = set()
    for _, uuid, _, index in sorted(overlaps):
        if index not in matched and uuid not in taken:
            matched[index] = uuid
            taken.add(uuid)
    plan = RefreshPlan()
    for index, members in enumerate(fresh_groups):
        kept = matched.get(index)
        if kept is None:
            plan.created.append(CommunityRecord(community_uuid(group_id, members), "", "", members))
            continue
        old = by_uuid[kept]
        if sorted(old.members) == members:
            plan.unchanged.append(old)
        else:
            plan.changed.append(CommunityRecord(kept, old.name, old.summary, members))
    plan.deleted = sorted(set(by_uuid) - taken)
    return plan


# ----------------------------------------------------------------------------- agreement
def _aligned(a: Partition, b: Partition) -> tuple[list[str], list[str]]:
    keys = sorted(set(a) | set(b))
    return (
        [a.get(k, "\x00" + k) for k in keys],
        [b.get(k, "\x00" + k) for k in keys],
    )


def adjusted_rand_index(a: Partition, b: Partition) -> float:
    """ARI (scikit-learn) over the union of both key sets; 1.0 for identical partitions."""
    left, right = _aligned(a, b)
    if len(left) < 2:
        return 1.0
    return float(adjusted_rand_score(left, right))


def normalized_mutual_info(a: Partition, b: Partition) -> float:
    """NMI (scikit-learn, arithmetic-mean normalisation) over the union of both key sets."""
    left, right = _aligned(a, b)
    if not left:
        return 1.0
    return float(normalized_mutual_info_score(left, right))


def adjusted_mutual_info(a: Partition, b: Partition) -> float:
    """AMI (scikit-learn): mutual information corrected for chance, over both key sets."""
    left, right = _aligned(a, b)
    if len(left) < 2:
        return 1.0
    return float(adjusted_mutual_info_score(left, right))


def to_networkx(nodes: Iterable[str], edges: Iterable[WeightedEdge]) -> nx.Graph:
    graph = nx.Graph()
    graph.add_nodes_from(sorted(set(nodes)))
    graph.add_weighted_edges_from((e.source, e.target, e.weight) for e in edges)
    return graph


def modularity(graph: nx.Graph, partition: Partition) -> float:
    """Weighted modularity (networkx) of ``partition`` on ``graph``; nodes it does not
    cover count as singletons."""
    if graph.number_of_edges() == 0:
        return 0.0
    full = {n: partition.get(n, "\x00" + n) for n in graph.nodes}
    return float(nx.community.modularity(graph, [set(g) for g in groups(full)], weight="weight"))


def drift_ratio(assignments_since_refresh: int, group_size: int) -> float:
    return assignments_since_refresh / max(group_size, 1)


# ----------------------------------------------------------------------------- names
def degrees(edges: Iterable[WeightedEdge]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for e in edges:
        out[e.source] += e.weight
        out[e.target] += e.weight
    return out


def top_members(
    members: Sequence[str], degree: Mapping[str, int], names: Mapping[str, str], k: int
) -> list[str]:
    """Members by weighted degree (highest first), then name, then uuid."""
    return sorted(members, key=lambda m: (-degree.get(m, 0), names.get(m, ""), m))[:k]


def default_name(
    members: Sequence[str], degree: Mapping[str, int], names: Mapping[str, str], k: int = 3
) -> str:
    """A deterministic name without an LLM: the names of the top ``k`` members."""
    picked = [names.get(m, m) for m in top_members(members, degree, names, k)]
    rest = len(members) - len(picked)
    return ", ".join(picked) + (f" +{rest}" if rest > 0 else "")


# ----------------------------------------------------------------------------- summaries
class CommunitySummaryOutput(BaseModel):
    """What the LLM returns for one community (strict schema: every field required)."""

    name: str
    summary: str


SUMMARY_SYSTEM = (
    "You summarise a community of related entities of a knowledge graph. Reply with a short "
    "name (2 to 6 words, the key terms that hold the community together) and a summary of "
    "at most three sentences. Use only the facts given."
)
MAX_PROMPT_MEMBERS = 40
MAX_MEMBER_SUMMARY_CHARS = 300


def summary_prompt(
    members: Sequence[str],
    degree: Mapping[str, int],
    names: Mapping[str, str],
    summaries: Mapping[str, str],
) -> str:
    """The user message for one community: its most connected members (map step: each
    member reduced to its name and a truncated summary), to be reduced into one summary."""
    picked = top_members(members, degree, names, MAX_PROMPT_MEMBERS)
    lines = [f"Community of {len(members)} entities; the most connected:"]
    for m in picked:
        text = " ".join(summaries.get(m, "").split())[:MAX_MEMBER_SUMMARY_CHARS]
        lines.append(f"- {names.get(m, m)}" + (f": {text}" if text else ""))
    return "\n".join(lines)
