"""Identifiers as search terms (docs/retrieval.md "Identifiers"): what is indexed of a text and
searched of a query, the same for every store, and the ranking of what carries a named id."""

from __future__ import annotations

import pytest

from tests.unit.recall_fixtures import fact
from tidegraph.recall.rerank import carrying_first
from tidegraph.records.search import Hit
from tidegraph.stores.search_text import (
    identifier_words,
    identifiers,
    indexed_text,
    search_terms,
)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("Ticket NW-1002 is open", ["nw1002", "1002"]),
        ("incident 1-732025285", ["1732025285", "732025285"]),
        ("invoice INV/2025/0042", ["inv20250042", "2025", "0042"]),
        ("call +44 20 7946 0958", ["442079460958", "7946", "0958"]),
        ("upgrade to v2.3.1", ["v231", "v2"]),
        ("mail dana.reyes@acme.com", ["danareyesacmecom"]),
        ("SKU NW1002", ["nw1002", "1002"]),
    ],
)
def test_an_identifier_is_indexed_whole_and_by_its_parts(text: str, words: list[str]) -> None:
    assert identifier_words(text) == words
    assert indexed_text(text) == f"{text} {' '.join(words)}"


def test_a_long_identifier_is_split_as_a_short_one() -> None:
    # a short token's words are remembered, a long one's worked out each time: the same rule
    prefix = "ORDER-" + "X" * 60
    assert identifier_words(f"see {prefix}-1002 and {prefix}-1002") == [
        f"order{'x' * 60}1002",
        "1002",
    ]
    assert identifier_words("see NW-1002 and NW-1002") == ["nw1002", "1002"]


@pytest.mark.parametrize(
    "text",
    ["3 users in 2025", "rated 3.5 stars", "pages 1-2", "on the 2nd at 10am", "at 10:30"],
)
def test_plain_numbers_are_not_identifiers(text: str) -> None:
    assert identifier_words(text) == [] and identifiers(text) == set()


@pytest.mark.parametrize(
    ("typed", "found_in"),
    [
        ("NW-1002", "Ticket NW-1002 is open"),
        ("nw1002", "Ticket NW-1002 is open"),
        ("1002", "Ticket NW-1002 is open"),
        ("What is the status of 732025285?", "incident 1-732025285 is closed"),
        ("+44 20 7946 0958", "Dana's number is +44 20 7946 0958"),
    ],
)
def test_an_id_typed_as_people_type_it_matches_the_indexed_text(typed: str, found_in: str) -> None:
    indexed = set(indexed_text(found_in).lower().split())
    assert set(search_terms(typed)) & indexed - {"ticket", "status"}


def test_short_numbers_of_a_query_are_not_searched() -> None:
    assert search_terms("3 users joined in 2025") == ["users", "joined", "2025"]
    assert search_terms("I have 2 dogs") == ["dogs"]


def fact_hit_of(text: str, uuid: str) -> Hit:
    return Hit("fact", uuid, 1.0, fact(uuid, "s", "t", text), "g")


def test_what_carries_the_named_id_comes_first_in_its_order() -> None:
    hits = [
        fact_hit_of("Ticket NW-1004 was raised by Initech", "a"),
        fact_hit_of("Ticket NW-1002 was raised by Acme", "b"),
        fact_hit_of("Ticket NW-1001 was raised by Globex", "c"),
        fact_hit_of("Ticket NW-1002 is closed", "d"),
    ]
    ranked = carrying_first(hits, identifiers("What is ticket NW-1002 about?"))
    assert [h.uuid for h in ranked] == ["b", "d", "a", "c"]
    assert carrying_first(hits, set()) == hits
