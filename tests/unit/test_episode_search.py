"""Conversation-aware episode search, the pure parts (docs/retrieval.md "Conversation-aware episode
search"): what is indexed of a message (tidegraph/records/conversation.py), how a query's
words split into names and words (tidegraph/stores/episode_search.py), and the recency rules
(tidegraph/recall/recency.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tidegraph.recall.recency import (
    asked_words,
    asks_current,
    slots,
    subject_words,
    supersede,
    value_words,
)
from tidegraph.records.conversation import (
    CONTEXT_TURNS,
    EPISODE_EMBED_CHARS,
    date_words,
    embed_text,
    search_fields,
    split_speaker,
    thread_context,
)
from tidegraph.records.graph import EpisodeRecord
from tidegraph.records.search import Hit
from tidegraph.stores.episode_search import episode_query, lucene_episode_query

MAY_8 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)  # a Monday


# ---- what is indexed ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("source", "content", "expected"),
    [
        (
            "message",
            "Caroline: I went to a support group",
            ("Caroline", "I went to a support group"),
        ),
        ("message", "Dana Reyes:   we moved to Pro", ("Dana Reyes", "we moved to Pro")),
        ("message", "see https://example.com/x", ("", "see https://example.com/x")),  # no ": "
        ("message", "no speaker here", ("", "no speaker here")),
        (
            "message",
            "a b c d e f: six words are no name",
            ("", "a b c d e f: six words are no name"),
        ),
        ("message", "2024: a year is no name", ("", "2024: a year is no name")),
        (
            "text",
            "Note: a text episode has no speaker",
            ("", "Note: a text episode has no speaker"),
        ),
    ],
)
def test_a_message_is_read_as_speaker_and_what_was_said(source, content, expected):
    assert split_speaker(source, content) == expected


def test_the_date_is_indexed_in_words_and_embedded_with_the_speaker():
    assert date_words(MAY_8) == "Monday 8 May 2023"
    fields = search_fields("message", "Caroline: I went to a support group", MAY_8, ["Hi!"])
    assert (fields.body, fields.speaker, fields.when, fields.context) == (
        "I went to a support group",
        "Caroline",
        "Monday 8 May 2023",
        "Hi!",
    )
    assert embed_text("message", "Caroline: hello", MAY_8) == "Caroline (Monday 8 May 2023): hello"
    assert embed_text("text", "Acme renewed", MAY_8) == "(Monday 8 May 2023) Acme renewed"
    assert len(embed_text("text", "x" * 5000, MAY_8)) == EPISODE_EMBED_CHARS


def test_a_replys_context_is_the_turns_before_it_oldest_first_and_bounded():
    newest_first = [f"turn {n}" for n in range(5, 0, -1)]  # as a store reads them
    assert thread_context(newest_first) == ["turn 3", "turn 4", "turn 5"][-CONTEXT_TURNS:]
    assert thread_context([]) == []


# ---- names and words -----------------------------------------------------------------------
def test_a_query_word_that_names_a_speaker_is_searched_on_the_speaker_only():
    query = episode_query("What did Caroline research?", ["caroline", "melanie"])
    assert query is not None and (query.words, query.names) == (["research"], ["caroline"])
    lucene = lucene_episode_query(query, ("b", "s", "c", "w", "i"))
    # the words are required in body, context, date or ids; the name only adds, on the speaker
    assert (
        lucene == "+(b:(research) c:(research)^0.5 w:(research)^1.0 i:(research)) s:(caroline)^2.0"
    )


def test_a_query_of_names_only_is_about_the_speaker_and_searched_as_words():
    query = episode_query("Caroline", ["caroline"])
    assert query is not None and (query.words, query.names) == (["caroline"], [])
    assert episode_query("the of and", ["caroline"]) is None


# ---- recency -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("query", "current"),
    [
        ("Which plan is Acme on?", True),
        ("Who is the account owner now?", True),
        ("What is the latest status of Acme?", True),
        ("Which plan was Acme on?", False),
        ("What did Caroline research?", False),
        ("Which plan did Acme use before?", False),
        ("Acme plan", False),
        ("Which plan is Acme on now, and what was it before?", True),  # says so
    ],
)
def test_a_question_is_about_now_when_it_says_so_or_is_in_the_present_tense(query, current):
    assert asks_current(query) is current


def _said(uuid: str, text: str, days: int, score: float) -> Hit:
    record = EpisodeRecord(
        uuid=uuid, group_id="g", name=uuid, source="message", source_description="",
        content=text, valid_at=MAY_8 + timedelta(days=days), producer_id=uuid,
    )  # fmt: skip
    return Hit(kind="episode", uuid=uuid, score=score, record=record, group_id="g")


def test_the_latest_restatement_of_what_is_asked_comes_first():
    ranked = [
        _said("pro", "Dana: Acme moved to the Pro plan", 10, 0.9),  # best match, older
        _said("owner", "Omar: Lena is the new owner of Acme", 300, 0.8),  # newest, other thing
        _said("basic", "Lena: we put Acme on the Basic plan", 200, 0.7),  # latest plan
        _said("enterprise", "Dana: Acme chose the Enterprise plan", 100, 0.6),
        _said("other", "Dana: Bluebird moved to the Pro plan", 250, 0.5),
    ]
    ordered = [h.uuid for h in supersede(ranked, "Which plan is Acme on?")]
    # The statements of Acme's plan first, newest first; what says less of the question after
    # them in its own order (the owner change, though newest, never jumps ahead).
    assert ordered == ["basic", "enterprise", "pro", "owner", "other"]
    assert [h.score for h in supersede(ranked, "Which plan is Acme on?")][0] == 0.7


def test_supersession_leaves_an_order_alone_when_nothing_restates():
    ranked = [
        _said("a", "Dana: the printer jammed again", 1, 0.9),
        _said("b", "Omar: coffee machine is broken", 2, 0.8),
    ]
    assert [h.uuid for h in supersede(ranked, "printer")] == ["a", "b"]
    assert [h.uuid for h in supersede(ranked, "the of")] == ["a", "b"]  # no searchable word


def test_a_later_restatement_found_further_down_is_brought_up_an_older_one_is_not():
    ranked = [
        _said("pro", "Dana: Acme moved to the Pro plan", 10, 0.9),
        _said("note", "Omar: Acme sent a thank-you note", 20, 0.8),
        _said("free", "Lena: Acme was on the Free plan once", 5, 0.3),  # older, below
        _said("basic", "Lena: we put Acme on the Basic plan", 200, 0.2),  # newer, below
    ]
    ordered = [h.uuid for h in supersede(ranked, "Which plan is Acme on?", depth=2)]
    assert ordered == ["basic", "pro", "note", "free"]


@pytest.mark.parametrize(
    ("query", "ignore", "names", "asked"),
    [
        ("Which plan is Acme Corp on?", "", {"acme", "corp"}, "plan"),
        ("Who is the account owner for Acme now?", "", {"acme"}, "account owner"),
        ("Which plan was Acme on in March 2024?", "in March 2024", {"acme"}, "plan"),
        ("Acme plan", "", set(), ""),  # a sentence's first word is capitalised anyway
        ("which plan is acme on?", "", set(), ""),  # nothing written as a name
    ],
)
def test_a_question_names_its_subject_by_capitals_inside_a_sentence(query, ignore, names, asked):
    assert subject_words(query, ignore) == names
    assert asked_words(query, ignore) == asked


def test_a_restatement_that_does_not_name_the_attribute_comes_first_by_the_value_it_carries():
    ranked = [
        _said("pro", "Dana: Acme Corp moved to the Pro plan", 10, 0.9),  # says "plan", oldest
        _said("owner", "Omar: Acme Corp is looked after by Lena Fischer now", 300, 0.8),  # newest
        _said("note", "Lena: Acme Corp sent a thank-you note", 250, 0.7),
        _said("upgrade", "Lena: Acme Corp upgraded to Enterprise Plus", 200, 0.6),  # no "plan"
        _said("other", "Dana: Bluebird Bakery moved to the Basic plan", 280, 0.5),
    ]
    # Another subject's statement of the plan (found by searching "plan" alone) carries
    # "Enterprise Plus", and a statement of the same template as the upgrade ("<name>
    # upgraded to _") carries Basic, a value of the plan: what fills that slot is a plan.
    stating = [_said("bb", "Priya: Bluebird Bakery is on the Enterprise Plus plan", 50, 1.0)]
    lexicon = [_said("cb", "Omar: Cobalt Labs upgraded to Basic", 60, 1.0)]
    ordered = supersede(ranked, "Which plan is Acme Corp on?", stating=stating, lexicon=lexicon)
    assert [h.uuid for h in ordered] == ["upgrade", "pro", "owner", "note", "other"]
    # Without a template to read it in, "Enterprise Plus" is only a name the upgrade says: it
    # keeps its place.
    alone = [h.uuid for h in supersede(ranked, "Which plan is Acme Corp on?", stating=stating)]
    assert alone == ["pro", "owner", "note", "upgrade", "other"]


def test_a_value_is_a_value_whatever_its_case():
    # "trial" is written in lower case: it fills the slot of "<name> status is now _" with
    # "churned", and "marking <name> as _" with "active", both values of the status.
    ranked = [
        _said("churned", "Dana: Acme Corp status is now churned", 10, 0.9),
        _said("plan", "Omar: Acme Corp upgraded to Pro", 300, 0.8),  # newest, another thing
        _said("trial", "Lena: marking Acme Corp as trial", 200, 0.7),  # the latest status
    ]
    stating = [_said("bb", "Priya: Bluebird Bakery status is now active", 5, 1.0)]
    lexicon = [_said("cb", "Omar: marking Cobalt Labs as active", 6, 1.0)]
    query = "What is the status of Acme Corp?"
    ordered = supersede(ranked, query, stating=stating, lexicon=lexicon)
    assert [h.uuid for h in ordered] == ["trial", "churned", "plan"]
    # The lexicon is what tells: without a statement of the same template, "marking Acme Corp as
    # trial" says nothing that is known to be a status.
    assert [h.uuid for h in supersede(ranked, query, stating=stating)] == [
        "churned",
        "plan",
        "trial",
    ]


def test_the_words_of_a_template_fill_no_slot():
    # "update" is said by a statement of the status, but in the same place whatever the
    # account and the value: a word of a template, not a value. The newer address change
    # that also says it does not join the status.
    ranked = [
        _said("trial", "Dana: account status update for Acme Corp: trial", 10, 0.9),
        _said(
            "address", "Omar: please update the address for Acme Corp to 5 Canal Street", 300, 0.8
        ),
    ]
    stating = [
        _said("bb", "Priya: account status update for Bluebird Bakery: active", 5, 1.0),
        _said("cb", "Priya: account status update for Cobalt Labs: churned", 6, 1.0),
    ]
    ordered = supersede(ranked, "What is the status of Acme Corp?", stating=stating)
    assert [h.uuid for h in ordered] == ["trial", "address"]
    assert "update" not in value_words(ranked, "What is the status of Acme Corp?", stating=stating)


def test_a_name_written_in_lower_case_is_the_name_still():
    # "dana reyes", written in lower case, is the name "Dana Reyes" written elsewhere: so the
    # rep's template holds two names, and Omar Haddad, in the slot of a value, is a value.
    ranked = [
        _said("dana", "Omar: Dana Reyes is the new account owner for Acme Corp", 10, 0.9),
        _said("plan", "Omar: Acme Corp upgraded to Pro", 300, 0.8),  # newest, another thing
        _said("omar", "Lena: the rep for Acme Corp is Omar Haddad going forward", 200, 0.7),
    ]
    lexicon = [_said("bb", "Dana: the rep for Bluebird Bakery is dana reyes going forward", 5, 1)]
    query = "Who is the account owner for Acme Corp?"
    assert [h.uuid for h in supersede(ranked, query, lexicon=lexicon)] == ["omar", "dana", "plan"]


def test_the_slots_of_templates_are_what_differs_between_statements_alike():
    texts = [
        "Acme Corp status is now trial",
        "Bluebird Bakery status is now churned",
        "we set the status of Cobalt Labs to active",
        "we set the status of Ember Studios to trial",
        "Priya Nair takes over Acme Corp starting Monday",
        "Dana Reyes takes over Bluebird Bakery starting Monday",
    ]
    found = slots(texts, frozenset({"acme", "corp"}))
    fillers = {w for slot in found.values() for f in slot for w in f}
    assert {"trial", "churned", "active"} <= fillers  # the values, in lower case
    assert {"priya", "nair", "dana", "reye"} <= fillers  # names fill slots too
    assert not {"set", "monday", "status"} & fillers  # a template's words fill none
    # The subject's own slot ("takes over <name> starting") is no slot of a value.
    assert not {"bluebird", "bakery"} & fillers


def test_the_values_searched_for_are_those_the_statements_of_what_is_asked_carry():
    ranked = [_said("a", "Dana: Acme Corp status is now churned", 10, 0.9)]
    stating = [
        _said("b", "Priya: Bluebird Bakery status is now active", 5, 1.0),
        _said("c", "Priya: we set the status of Cobalt Labs to trial", 6, 1.0),
        _said("d", "Priya: we set the status of Ember Studios to churned", 7, 1.0),
    ]
    words = value_words(ranked, "What is the status of Acme Corp now?", stating=stating).split()
    assert {"churned", "active", "trial"} <= set(words)
    assert not {"set", "status", "acme", "corp"} & set(words)
    assert (
        value_words(ranked, "what is the status of acme corp?", stating=stating) == ""
    )  # no subject


def test_a_group_found_only_further_down_comes_first():
    # None of the statements of Acme Corp's status is among the best two: the newest of them
    # comes up all the same (the question is about it).
    ranked = [
        _said("note", "Omar: Acme Corp sent a thank-you note", 20, 0.9),
        _said("call", "Omar: Acme Corp wants a call", 30, 0.8),
        _said("old", "Lena: Acme Corp status is now trial", 5, 0.3),
        _said("new", "Lena: Acme Corp status is now active", 40, 0.2),
    ]
    ordered = [h.uuid for h in supersede(ranked, "What is the status of Acme Corp?", depth=2)]
    assert ordered == ["new", "old", "note", "call"]


def test_a_turn_that_names_a_speaker_restates_nothing_of_theirs():
    # In a conversation the subject is one of the speakers, and a turn naming them speaks to
    # them: "fun" fills the slot "great" fills in John's statement of the studio, but Maria's
    # turn says nothing of John's. The order stays the ranking's.
    ranked = [
        _said("studio", "John: the studio sounds like a great place", 10, 0.9),
        _said("fun", "Maria: John, that sounds like a fun place", 30, 0.8),
        _said("bye", "Maria: bye John", 20, 0.7),
    ]
    ordered = [h.uuid for h in supersede(ranked, "Which studio does John go to?")]
    assert ordered == ["studio", "fun", "bye"]
    # The same turns about an account that does not speak: the newer one restates it.
    about = [
        _said("studio", "Dana: the Acme Corp studio sounds like a great place", 10, 0.9),
        _said("fun", "Omar: Acme Corp, that sounds like a fun place", 30, 0.8),
        _said("bye", "Omar: bye Acme Corp", 20, 0.7),
    ]
    ordered = [h.uuid for h in supersede(about, "Which studio does Acme Corp go to?")]
    assert ordered == ["fun", "studio", "bye"]


def test_a_word_every_kind_of_statement_says_is_no_value():
    ranked = [
        _said("pro", "Dana: Acme moved to the Pro plan today", 10, 0.9),
        # Newer, about Acme, and each shares a word with the statements of the plan; but
        # "today" fills no slot (it is where it is whatever the plan), and "Lena Fischer" is
        # said by two of Acme's other statements: something else of Acme's, not its plan.
        _said("status", "Omar: Acme went quiet today", 300, 0.8),
        _said("visit", "Omar: Acme had a visit from Lena Fischer", 250, 0.7),
        _said("call", "Omar: Acme booked a call with Lena Fischer", 260, 0.6),
    ]
    stating = [_said("bb", "Priya: Lena Fischer put Bluebird on the Basic plan today", 5, 1.0)]
    ordered = [h.uuid for h in supersede(ranked, "Which plan is Acme on?", stating=stating)]
    assert ordered == ["pro", "status", "visit", "call"]
