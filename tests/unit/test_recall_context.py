"""The context builder (tidegraph/recall/context.py): template, dates, order and budget."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.recall_fixtures import community, day, entity, episode, fact, people_graph
from tidegraph.recall.context import MIN_BUDGET, build_context
from tidegraph.recall.search import SearchResults
from tidegraph.records.asof import AsOf
from tidegraph.records.search import Hit, SearchScope

NOW = datetime(2024, 6, 1, 12, 30, tzinfo=UTC)


def results(*hits: Hit, valid_at=NOW, known_at=NOW, include_invalid=False) -> SearchResults:
    scope = SearchScope(("g",), AsOf(valid_at, known_at, include_invalid, None))
    found = SearchResults("q", "combined", scope)
    for hit in hits:
        found.of(hit.kind).append(hit)
    return found


def hit(record) -> Hit:
    kind = {"FactRecord": "fact", "EntityRecord": "entity", "EpisodeRecord": "episode"}.get(
        type(record).__name__, "community"
    )
    return Hit(kind, record.uuid, 1.0, record, "g")


def full() -> SearchResults:
    graph = people_graph()
    facts = [graph.facts[u] for u in ("f_globex", "f_friend", "f_paris", "f_tea", "f_acme")]
    entities = [graph.entities[u] for u in ("alice", "bob", "acme", "globex", "paris", "tea")]
    episodes = [graph.episodes[u] for u in ("e3", "e2", "e1")]
    records = [*facts, *entities, graph.communities["c_acme"][1], *episodes]
    return results(*(hit(r) for r in records), include_invalid=True)


def test_the_template():
    text = build_context(full())
    assert text == "\n".join(
        [
            "MEMORY (any validity, as known at 2024-06-01 12:30 UTC)",
            "",
            "FACTS (when each was true):",
            "- Alice Smith works at Globex (valid 2024-04-10 – present)",
            "- Bob Jones is a friend of Alice Smith (valid 2024-01-01 – present)",
            "- Acme Corp is headquartered in Paris (valid 2024-01-01 – present)",
            "- Bob Jones likes green tea (valid 2024-01-01 – present)",
            "- Alice Smith works at Acme Corp as an engineer "
            "(valid 2024-01-01 – 2024-04-10, ended)",
            "",
            "ENTITIES:",
            "- Alice Smith: software engineer",
            "- Bob Jones: Alice's friend",
            "- Acme Corp: a software company",
            "- Globex: a logistics company",
            "- Paris: capital of France",
            "- green tea",
            "",
            "COMMUNITIES:",
            "- Acme people: Alice Smith and Acme Corp, in Paris",
            "",
            "EPISODES:",
            "- 2024-04-30 msg-e3: Bob had green tea with Alice and talked about her new job.",
            "- 2024-04-10 msg-e2: Alice told us she moved to Globex.",
            "- 2024-01-01 msg-e1: Alice started at Acme Corp today, as an engineer in Paris.",
        ]
    )


def test_dates_as_believed_at_known_at():
    t = datetime(2024, 3, 5, 9, 15, tzinfo=UTC)
    later_end = fact("late", "a", "b", "A ends later", valid_at=day(0), created_at=day(0))
    later_end.move_end(day(200), now=NOW + timedelta(days=1))  # learned after known_at
    future = fact("future", "a", "b", "A contract", valid_at=t, invalid_at=day(900),
                  expired_at=day(1), created_at=day(0))  # fmt: skip
    unknown = fact("open", "a", "b", "A  has\nno start", valid_at=None, created_at=day(0))
    text = build_context(results(hit(later_end), hit(future), hit(unknown), valid_at=day(40)))
    assert text.splitlines() == [
        "MEMORY (valid at 2024-02-10, as known at 2024-06-01 12:30 UTC)",
        "",
        "FACTS (when each was true):",
        "- A ends later (valid 2024-01-01 – present)",  # its end was not known yet
        "- A contract (valid 2024-03-05 09:15 – 2026-06-19)",  # ends after known-at
        "- A has no start (valid unknown – present)",  # one line, whitespace collapsed
    ]


def test_empty_results_say_so_briefly():
    assert build_context(results()) == (
        "NO MEMORY FOUND (valid at 2024-06-01 12:30 UTC, as known at 2024-06-01 12:30 UTC)"
    )


def test_the_budget_is_respected_and_each_section_keeps_its_rank_order():
    whole = full()
    complete = build_context(whole, max_chars=100_000)
    for budget in range(MIN_BUDGET, len(complete) + 20, 7):
        text = build_context(whole, max_chars=budget)
        assert len(text) <= budget
        lines = text.splitlines()
        assert lines[0].startswith("MEMORY (")
        for line in lines:  # no line is cut, except an episode's excerpt
            assert line in complete.splitlines() or (line.startswith("- 2024") and line[-1] == "…")
        for kind in ("fact", "entity", "community", "episode"):
            shown = [line for line in lines if line in {_line(h) for h in whole.of(kind)}]
            assert shown == [_line(h) for h in whole.of(kind)][: len(shown)]
    assert build_context(whole, max_chars=len(complete)) == complete


def _line(h: Hit) -> str:
    """The complete line of a hit, as the unlimited context prints it."""
    complete = build_context(results(h, include_invalid=True), max_chars=100_000).splitlines()
    return complete[-1]


def test_lines_are_taken_by_rank_across_sections():
    text = build_context(full(), max_chars=330).splitlines()
    assert text[:4] == [
        "MEMORY (any validity, as known at 2024-06-01 12:30 UTC)",
        "",
        "FACTS (when each was true):",
        "- Alice Smith works at Globex (valid 2024-04-10 – present)",
    ]
    assert "- Alice Smith: software engineer" in text  # the best entity before a second fact
    assert "- Acme people: Alice Smith and Acme Corp, in Paris" in text


def test_a_token_budget_is_about_four_characters_a_token():
    assert len(build_context(full(), max_tokens=50)) <= 200
    assert build_context(full(), max_tokens=50, max_chars=150) == build_context(
        full(), max_chars=150
    )


def test_episodes_are_optional_and_their_excerpts_are_cut():
    graph_episode = episode("long", "word " * 200, day(3))
    found = results(hit(entity("alice", "Alice")), hit(graph_episode))
    text = build_context(found, episode_chars=60)
    last = text.splitlines()[-1]
    assert last.startswith("- 2024-01-04 msg-long: word word") and last.endswith("…")
    assert len(last) == len("- 2024-01-04 msg-long: ") + 60
    assert "EPISODES" not in build_context(found, episodes=False)
    squeezed = build_context(found, max_chars=200)
    assert len(squeezed) <= 200 and squeezed.endswith("…")


def test_communities_without_summary_and_bad_budgets():
    text = build_context(results(hit(community("c", "Team", "", []))))
    assert text.splitlines()[-1] == "- Team"
    with pytest.raises(ValueError, match="too small"):
        build_context(full(), max_chars=50)
    with pytest.raises(ValueError, match="too small.*tokens"):
        build_context(full(), max_tokens=10)
    with pytest.raises(ValueError, match="episode_chars"):
        build_context(full(), episode_chars=5)
