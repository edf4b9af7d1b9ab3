"""The breadth-first walk every store's ``expand_facts`` and ``entity_distances`` use
(tidegraph/stores/hits.py): its order (nearer first, then from the more relevant seed) and how
little it reads when a few facts are asked for."""

from __future__ import annotations

from tests.unit.recall_fixtures import fact
from tidegraph.records.graph import FactRecord
from tidegraph.stores.hits import distances, expanded


class Graph:
    """Facts by uuid; ``reads`` records each ``facts_of`` call's entities."""

    def __init__(self, *facts: FactRecord) -> None:
        self.facts = list(facts)
        self.reads: list[list[str]] = []

    async def facts_of(self, entities: list[str]) -> list[FactRecord]:
        self.reads.append(list(entities))
        wanted = set(entities)
        return [f for f in self.facts if {f.source_uuid, f.target_uuid} & wanted]


def star(centre: str, leaves: int, prefix: str) -> list[FactRecord]:
    return [fact(f"{prefix}{i:02d}", centre, f"{centre}-leaf{i}", "x") for i in range(leaves)]


async def test_facts_of_the_more_relevant_seed_come_first_whatever_their_uuids() -> None:
    graph = Graph(*star("best", 3, "z"), *star("second", 3, "a"))
    found = await expanded(graph.facts_of, ["best", "second"], 1, 10)
    assert [f.uuid for f, _ in found] == ["z00", "z01", "z02", "a00", "a01", "a02"]
    assert {hop for _, hop in found} == {1}


async def test_a_nearer_fact_beats_a_fact_from_a_more_relevant_seed() -> None:
    # best -z00-> mid -y00-> far; second -a00-> other
    graph = Graph(
        fact("z00", "best", "mid", "x"),
        fact("y00", "mid", "far", "x"),
        fact("a00", "second", "other", "x"),
    )
    found = await expanded(graph.facts_of, ["best", "second"], 2, 10)
    assert [(f.uuid, hop) for f, hop in found] == [("z00", 1), ("a00", 1), ("y00", 2)]


async def test_the_walk_reads_the_best_seeds_first_and_stops_once_the_answer_is_known() -> None:
    seeds = [f"s{i:02d}" for i in range(40)]
    graph = Graph(*(f for i, s in enumerate(seeds) for f in star(s, 3, f"f{i:02d}-")))
    found = await expanded(graph.facts_of, seeds, 2, 10)
    # 8 seeds of 3 facts each hold the 10 best: one read of the first 8 seeds, no second hop
    assert graph.reads == [seeds[:8]]
    assert [f.uuid for f, _ in found] == [f"f{i:02d}-{j:02d}" for i in range(4) for j in range(3)][
        :10
    ]


async def test_a_smaller_first_read_finds_the_same_facts_reading_fewer() -> None:
    seeds = [f"s{i:02d}" for i in range(40)]
    facts = [f for i, s in enumerate(seeds) for f in star(s, 3, f"f{i:02d}-")]
    every = await expanded(Graph(*facts).facts_of, seeds, 2, 10)
    graph = Graph(*facts)
    found = await expanded(graph.facts_of, seeds, 2, 10, first_chunk=2)
    assert found == every
    # 2 seeds (6 facts), then 4 more (18): the 10 best are known after 6 seeds, not 8
    assert graph.reads == [seeds[:2], seeds[2:6]]


async def test_distances_count_hops_from_the_centre() -> None:
    graph = Graph(fact("f1", "a", "b", "x"), fact("f2", "b", "c", "x"), fact("f3", "c", "d", "x"))
    assert await distances([graph.facts_of], "a", ["b", "c", "d", "zz"], 2) == {"b": 1, "c": 2}
