"""The pure community logic: assignment, propagation, refresh diff, agreement, names."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import pytest

from tidegraph.llm.client import strict_json_schema
from tidegraph.processors.communities import (
    CommunitySummaryOutput,
    adjusted_mutual_info,
    adjusted_rand_index,
    assign_by_majority,
    community_uuid,
    default_name,
    degrees,
    drift_ratio,
    groups,
    label_propagation,
    modularity,
    normalized_mutual_info,
    plan_refresh,
    summary_prompt,
    to_networkx,
)
from tidegraph.records.graph import CommunityRecord, WeightedEdge


def edges_of(pairs: list[tuple[str, str]], weight: int = 1) -> list[WeightedEdge]:
    return [WeightedEdge(*sorted((a, b)), weight) for a, b in pairs]


def clique(names: str) -> list[tuple[str, str]]:
    return list(itertools.combinations(names, 2))


def test_assignment_takes_the_weighted_majority() -> None:
    communities = {"a": "A", "b": "A", "c": "B", "d": None}
    assert assign_by_majority({"a": 1, "b": 1, "c": 1}, communities) == "A"
    assert assign_by_majority({"a": 1, "c": 3}, communities) == "B"
    assert assign_by_majority({"d": 5, "c": 1}, communities) == "B"
    assert assign_by_majority({"d": 5}, communities) is None
    assert assign_by_majority({}, communities) is None


def test_assignment_ties_go_to_the_smallest_uuid_whatever_the_order() -> None:
    communities = {"a": "zz", "b": "mm", "c": "aa"}
    for order in itertools.permutations(["a", "b", "c"]):
        assert assign_by_majority({n: 2 for n in order}, communities) == "aa"


def test_label_propagation_finds_cliques_and_is_deterministic() -> None:
    edges = edges_of(clique("abcd"), 2) + edges_of(clique("efgh"), 2) + edges_of([("a", "e")])
    nodes = [*"abcdefgh", "lonely"]
    result = label_propagation(nodes, edges, seed=3)
    assert result.converged
    assert groups(result.labels) == [list("abcd"), list("efgh"), ["lonely"]]
    again = label_propagation(list(reversed(nodes)), list(reversed(edges)), seed=3)
    assert again.labels == result.labels


def test_label_propagation_respects_the_iteration_cap() -> None:
    path = edges_of([(str(i), str(i + 1)) for i in range(50)])
    capped = label_propagation([str(i) for i in range(51)], path, max_iterations=1)
    assert capped.iterations == 1
    with pytest.raises(ValueError):
        label_propagation([], [], max_iterations=0)


def _stored(uuid: str, members: str, name: str = "") -> CommunityRecord:
    return CommunityRecord(uuid, name or uuid, f"about {uuid}", list(members))


def test_plan_keeps_unchanged_and_matches_by_overlap() -> None:
    stored = [_stored("u1", "abc"), _stored("u2", "def"), _stored("u3", "xy")]
    fresh = {**dict.fromkeys("abc", "L1"), **dict.fromkeys("defg", "L2"), "x": "x", "y": "y"}
    plan = plan_refresh("g", stored, fresh)
    assert plan.unchanged == [stored[0]]
    assert plan.changed == [CommunityRecord("u2", "u2", "about u2", list("defg"))]
    assert plan.created == []
    assert plan.deleted == ["u3"]  # x and y became singletons


def test_plan_split_and_merge() -> None:
    stored = [_stored("u1", "abcdef")]
    split = plan_refresh("g", stored, {**dict.fromkeys("abcd", "1"), **dict.fromkeys("ef", "2")})
    assert [(c.uuid, c.members) for c in split.changed] == [("u1", list("abcd"))]
    assert [(c.uuid, c.members) for c in split.created] == [
        (community_uuid("g", ["e", "f"]), ["e", "f"])
    ]
    stored = [_stored("u2", "abc"), _stored("u1", "def")]
    merged = plan_refresh("g", stored, dict.fromkeys("abcdef", "1"))
    assert [c.uuid for c in merged.changed] == ["u1"]  # equal overlap: the smaller uuid
    assert merged.deleted == ["u2"]


def test_ari_ami_and_nmi() -> None:
    a = {**dict.fromkeys("abc", "1"), **dict.fromkeys("def", "2")}
    renamed = {k: "x" + v for k, v in a.items()}
    assert adjusted_rand_index(a, renamed) == pytest.approx(1.0)
    assert normalized_mutual_info(a, renamed) == pytest.approx(1.0)
    assert adjusted_mutual_info(a, renamed) == pytest.approx(1.0)
    # by hand: contingency [[2, 1], [0, 3]]; ARI = (4 - 2.8) / (6.5 - 2.8);
    # NMI = 2 * (ln2/3 - ln2/6 + ln1.5/2) / (ln2 + H(1/3, 2/3))
    b = {**dict.fromkeys("ab", "1"), **dict.fromkeys("cdef", "2")}
    assert adjusted_rand_index(a, b) == pytest.approx(1.2 / 3.7)
    h_b = -(math.log(1 / 3) / 3 + 2 * math.log(2 / 3) / 3)
    mi = math.log(2) / 3 - math.log(2) / 6 + math.log(1.5) / 2
    assert normalized_mutual_info(a, b) == pytest.approx(2 * mi / (math.log(2) + h_b))
    assert adjusted_rand_index({"a": "1"}, {"a": "2"}) == 1.0
    # AMI corrects MI for chance: below NMI for this small, weakly related pair
    assert 0 < adjusted_mutual_info(a, b) < normalized_mutual_info(a, b)
    # a missing entity is a singleton on that side
    assert adjusted_rand_index(a, {k: v for k, v in a.items() if k != "f"}) < 1.0


def test_modularity_matches_networkx() -> None:
    edges = edges_of(clique("abcd"), 2) + edges_of(clique("efgh"), 2) + edges_of([("a", "e")])
    graph = to_networkx("abcdefgh", edges)
    partition = {**dict.fromkeys("abcd", "1"), **dict.fromkeys("efgh", "2")}
    expected = nx.community.modularity(graph, [set("abcd"), set("efgh")], weight="weight")
    assert modularity(graph, partition) == pytest.approx(expected)
    assert modularity(graph, partition) > modularity(graph, dict.fromkeys("abcdefgh", "1"))


def test_names_prompt_and_schema() -> None:
    edges = edges_of([("a", "b"), ("a", "c"), ("a", "d"), ("b", "c")])
    names = {"a": "Acme", "b": "Bolt", "c": "Cogs", "d": "Dent"}
    degree = degrees(edges)
    assert default_name(list("abcd"), degree, names) == "Acme, Bolt, Cogs +1"
    assert default_name(["d"], degree, names) == "Dent"
    prompt = summary_prompt(list("dcba"), degree, names, {"a": "makes  printers\n", "d": ""})
    assert prompt.splitlines() == [
        "Community of 4 entities; the most connected:",
        "- Acme: makes printers",
        "- Bolt",
        "- Cogs",
        "- Dent",
    ]
    schema = strict_json_schema(CommunitySummaryOutput)
    assert set(schema["required"]) == {"name", "summary"}
    assert drift_ratio(5, 0) == 5 and drift_ratio(5, 50) == 0.1
