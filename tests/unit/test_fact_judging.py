"""One LLM call judging the new facts of several episodes (tidegraph.processors.fact_judging): what
it
asks, and when its answers stand for the call an episode would have made alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tidegraph.processors.fact_judging import (
    Message,
    candidates_per_fact,
    judgement_of,
    prompt_of,
    standing_for,
    standing_key,
)
from tidegraph.processors.prompts import FactJudgement, FactResolutionOutput, fact_resolution_user
from tidegraph.processors.timeline import FactDecision
from tidegraph.records.episode import Episode
from tidegraph.records.graph import FactRecord
from tidegraph.records.stages import StampedFact

T0 = datetime(2025, 3, 1, tzinfo=UTC)
GROUP = "g"


def episode(n: int) -> Episode:
    return Episode(
        id=f"m{n}",
        group_id=GROUP,
        source="message",
        content=f"message {n}",
        reference_time=T0 + timedelta(hours=n),
    )


def works_at(company: str, n: int) -> StampedFact:
    return StampedFact(
        source_uuid="alice",
        target_uuid=company,
        relation="WORKS_AT",
        fact=f"Alice works at {company}",
        valid_at=T0 + timedelta(hours=n),
    )


def stored(uuid: str, company: str) -> FactRecord:
    return FactRecord(
        uuid=uuid,
        group_id=GROUP,
        source_uuid="alice",
        target_uuid=company,
        name="WORKS_AT",
        fact=f"Alice works at {company}",
        valid_at=T0,
    )


def two_messages() -> tuple[list[Message], FactRecord]:
    """Message 1: Alice works at Globex (stored: Acme); message 2: Alice works at Initech."""
    acme = stored("f-acme", "acme")
    first, second = episode(1), episode(2)
    facts1, facts2 = [works_at("globex", 1)], [works_at("initech", 2)]
    per1 = candidates_per_fact(facts1, [acme], {}, threshold=0.9)
    earlier = standing_for(GROUP, first.uuid, facts1, {})
    per2 = candidates_per_fact(facts2, [acme, *earlier], {}, threshold=0.9)
    return [Message(first, facts1, per1), Message(second, facts2, per2)], acme


def test_a_joint_prompt_numbers_stored_facts_then_each_messages_new_facts() -> None:
    messages, acme = two_messages()
    prompt = prompt_of(messages)
    assert [f.uuid for f in prompt.stored] == [acme.uuid]
    user = fact_resolution_user(prompt.messages, prompt.stored, {"alice": "Alice", "acme": "Acme"})
    lines = user.splitlines()
    assert lines[:3] == [
        "Existing facts:",
        "[0] Alice -WORKS_AT-> Acme: Alice works at acme (2025-03-01T00:00:00Z .. now)",
        "New facts:",
    ]
    assert lines[3].startswith("(message 1, ") and lines[4] == "[1] Alice works at globex"
    assert lines[5].startswith("(message 2, ") and lines[6] == "[2] Alice works at initech"
    # message 2's fact is judged against the stored fact and message 1's new fact
    assert prompt.question_of == {
        1: (messages[0].episode.uuid, 0),
        2: (messages[1].episode.uuid, 0),
    }
    assert prompt.key_of[1] == standing_key(messages[0].episode.uuid, 0)


def answer(*judgements: tuple[int, int | None, list[int]]) -> FactResolutionOutput:
    return FactResolutionOutput(
        judgements=[
            FactJudgement(new_fact=n, duplicate_of=d, contradicts=c) for n, d, c in judgements
        ]
    )


def test_a_later_messages_answer_names_the_fact_an_earlier_one_became() -> None:
    messages, acme = two_messages()
    prompt = prompt_of(messages)
    # Globex ends Acme; Initech ends Acme and Globex (message 1's new fact, number 1)
    judgement = judgement_of(messages, prompt, answer((1, None, [0]), (2, None, [0, 1])))
    first, second = (m.episode.uuid for m in messages)
    assert judgement.decisions_for(first, messages[0].per_fact) == {
        0: FactDecision(None, (acme.uuid,))
    }
    # message 1 is written: its fact became "f-globex"; message 2's questions, now read from
    # the store, are the same ones with that fact in its place
    judgement.record(first, {0: "f-globex"})
    now = {0: [acme, stored("f-globex", "globex")]}
    assert judgement.decisions_for(second, now) == {0: FactDecision(None, (acme.uuid, "f-globex"))}


def test_answers_stand_only_for_the_questions_the_call_asked() -> None:
    messages, acme = two_messages()
    judgement = judgement_of(messages, prompt_of(messages), answer((2, None, [0, 1])))
    first, second = (m.episode.uuid for m in messages)
    judgement.record(first, {0: "f-globex"})
    globex = stored("f-globex", "globex")
    # another candidate than asked, one fewer, another fact asked: the episode asks alone
    assert judgement.decisions_for(second, {0: [acme, globex, stored("f-x", "x")]}) is None
    assert judgement.decisions_for(second, {0: [acme]}) is None
    assert judgement.decisions_for(second, {0: [acme, globex], 1: [acme]}) is None
    assert judgement.decisions_for("another episode", {0: [acme]}) is None


def test_an_answer_naming_no_candidate_of_its_fact_is_dropped() -> None:
    messages, acme = two_messages()
    # message 1's fact may not name message 2's (a later one), nor itself, nor a stranger
    judgement = judgement_of(messages, prompt_of(messages), answer((1, 2, [1, 2, 7, -1])))
    first = messages[0].episode.uuid
    assert judgement.decisions_for(first, messages[0].per_fact) == {0: FactDecision(None, ())}
    assert judgement.calls == 1 and judgement.take_calls() == 1 and judgement.take_calls() == 0


def test_a_word_for_word_restatement_of_an_earlier_message_is_not_asked() -> None:
    first = episode(1)
    facts1 = [works_at("globex", 1)]
    earlier = standing_for(GROUP, first.uuid, facts1, {})
    again = [works_at("globex", 2)]
    assert candidates_per_fact(again, earlier, {}, threshold=0.9) == {}
