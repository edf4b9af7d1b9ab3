"""What the LLM is asked about new facts: for one episode, or for several consecutive
episodes of a group in one call (docs/streaming.md "Batch-native stages").

A new fact without a cardinality is judged against its candidates: the facts sharing an
endpoint with it that have its relation or similar wording (``candidates_per_fact``).

Several episodes of a unit are judged in one call (``ask``): each episode's facts against
its stored candidates and against the new facts of the episodes before it, which stand in
for the facts they will become (``standing_for``) and are numbered in the same prompt. When
an episode's turn comes (in order, after the earlier episodes' writes), its questions are
worked out again from the store as it then stands, and the joint answers are used only when
they are the same questions: the same facts against the same candidates, an earlier
episode's new fact standing for the fact it became (``Judgement.decisions_for``). Otherwise
the episode asks alone. So a joint call decides nothing that the episode's own call would
not have been asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tidegraph.processors.prompts import FactResolutionOutput
from tidegraph.processors.timeline import FactDecision, restatement_of
from tidegraph.records.episode import Episode
from tidegraph.records.graph import FactRecord
from tidegraph.records.stages import StampedFact
from tidegraph.records.times import iso

MAX_CANDIDATES_PER_FACT = 12

_STANDING = "new:"  # the key prefix of a new fact standing for a stored one

# An episode's fact embeddings by fact index, and its content's embedding.
Vectors = tuple[dict[int, list[float]], list[float] | None]


@dataclass
class Message:
    """One episode's part of a call: its facts and, by fact index, their candidates."""

    episode: Episode
    facts: list[StampedFact]
    per_fact: dict[int, list[FactRecord]]


@dataclass(frozen=True)
class _Asked:
    candidates: frozenset[str]  # keys: stored uuids, or new facts of earlier episodes
    duplicate_of: str | None = None
    contradicts: tuple[str, ...] = ()


@dataclass
class Judgement:
    """The answers of one call, by episode uuid and fact index, as candidate keys."""

    asked: dict[str, dict[int, _Asked]] = field(default_factory=dict)
    calls: int = 0  # LLM calls made (0 or 1), counted once by ``take_calls``
    # The fact each earlier episode's new fact became (``record``): key -> stored uuid.
    became: dict[str, str] = field(default_factory=dict)
    # The embeddings worked out for the call, by episode uuid (taken by the episode's write).
    vectors: dict[str, Vectors] = field(default_factory=dict)

    def decisions_for(
        self, episode_uuid: str, per_fact: dict[int, list[FactRecord]]
    ) -> dict[int, FactDecision] | None:
        """The decisions for the episode's questions ``per_fact`` (worked out now), or None
        when the call did not ask exactly these."""
        asked = self.asked.get(episode_uuid)
        if asked is None or set(asked) != set(per_fact):
            return None
        decisions: dict[int, FactDecision] = {}
        for i, candidates in per_fact.items():
            answer = asked[i]
            if {self._stored(k) for k in answer.candidates} != {f.uuid for f in candidates}:
                return None
            duplicate = None if answer.duplicate_of is None else self._stored(answer.duplicate_of)
            decisions[i] = FactDecision(
                duplicate, tuple(self._stored(k) for k in answer.contradicts)
            )
        return decisions

    def record(self, episode_uuid: str, became: dict[int, str]) -> None:
        """What the episode's new facts became once it is planned (``FactPlan.became``)."""
        for i, uuid in became.items():
            self.became[standing_key(episode_uuid, i)] = uuid

    def take_calls(self) -> int:
        calls, self.calls = self.calls, 0
        return calls

    def _stored(self, key: str) -> str:
        return self.became.get(key, key)


def standing_key(episode_uuid: str, index: int) -> str:
    return f"{_STANDING}{episode_uuid}:{index}"


def standing_for(
    group_id: str, episode_uuid: str, facts: list[StampedFact], embeddings: dict[int, list[float]]
) -> list[FactRecord]:
    """An episode's new facts as the facts a later episode of the same call is judged
    against, before it is written (keyed ``standing_key``)."""
    return [
        FactRecord(
            uuid=standing_key(episode_uuid, i),
            group_id=group_id,
            source_uuid=f.source_uuid,
            target_uuid=f.target_uuid or f.source_uuid,
            name=f.relation,
            fact=f.fact,
            fact_embedding=embeddings.get(i),
            valid_at=f.valid_at,
            invalid_at=f.invalid_at,
            cardinality=f.cardinality,
        )
        for i, f in enumerate(facts)
        if not f.closes
    ]


def candidates_per_fact(
    facts: list[StampedFact],
    existing: list[FactRecord],
    embeddings: dict[int, list[float]],
    threshold: float,
) -> dict[int, list[FactRecord]]:
    """By fact index, the facts of ``existing`` the LLM judges each new fact against (no
    entry for a fact without any): for a fact without cardinality that does not restate a
    stored one word for word, the facts sharing an endpoint with the same relation or a
    wording at least ``threshold`` similar, the same relation first, then the most similar,
    at most ``MAX_CANDIDATES_PER_FACT``."""
    per_fact: dict[int, list[FactRecord]] = {}
    for i, new in enumerate(facts):
        if new.closes or new.cardinality is not None:
            continue
        if _restates(existing, new):
            continue  # the same words between the same entities: a duplicate, no question
        ends = {new.source_uuid, new.target_uuid}
        scored = []
        for f in existing:
            if not ({f.source_uuid, f.target_uuid} & ends):
                continue
            if f.valid_at is not None and f.invalid_at == f.valid_at:
                continue  # a recorded end (valid at no time): nothing to judge
            similarity = _cosine(embeddings.get(i), f.fact_embedding)
            if f.name == new.relation or similarity >= threshold:
                scored.append((f.name != new.relation, -similarity, f.uuid, f))
        scored.sort(key=lambda s: s[:3])
        if scored:
            per_fact[i] = [s[3] for s in scored[:MAX_CANDIDATES_PER_FACT]]
    return per_fact


@dataclass
class Prompt:
    """A call's prompt parts (``tidegraph.processors.prompts.fact_resolution_user``) and what its
    numbers stand for."""

    stored: list[FactRecord]  # numbered from 0
    messages: list[tuple[str | None, list[tuple[int, str]]]]
    key_of: dict[int, str]  # number -> stored uuid or standing key
    question_of: dict[int, tuple[str, int]]  # number of an asked fact -> (episode uuid, index)


def prompt_of(messages: list[Message]) -> Prompt:
    """The numbering of one call: the stored candidates by uuid, then every new fact that
    is asked about or is a later fact's candidate, message by message."""
    stored: dict[str, FactRecord] = {}
    referenced: set[str] = set()
    for message in messages:
        for candidates in message.per_fact.values():
            for f in candidates:
                if f.uuid.startswith(_STANDING):
                    referenced.add(f.uuid)
                else:
                    stored.setdefault(f.uuid, f)
    listed = sorted(stored.values(), key=lambda f: f.uuid)
    key_of = {n: f.uuid for n, f in enumerate(listed)}
    question_of: dict[int, tuple[str, int]] = {}
    sections: list[tuple[str | None, list[tuple[int, str]]]] = []
    number = len(listed)
    for at, message in enumerate(messages, 1):
        uuid = message.episode.uuid
        lines = []
        for i, fact in enumerate(message.facts):
            key = standing_key(uuid, i)
            if i not in message.per_fact and key not in referenced:
                continue
            key_of[number] = key
            if i in message.per_fact:
                question_of[number] = (uuid, i)
            lines.append((number, fact.fact))
            number += 1
        if lines:
            label = None
            if len(messages) > 1:
                label = f"message {at}, {iso(message.episode.reference_time)}"
            sections.append((label, lines))
    return Prompt(listed, sections, key_of, question_of)


def judgement_of(
    messages: list[Message], prompt: Prompt, output: FactResolutionOutput | None
) -> Judgement:
    """The call's answers (``output``; None: no call was needed) as candidate keys; an
    answer naming a fact that is not one of the new fact's candidates is dropped."""
    judgement = Judgement(calls=0 if output is None else 1)
    for message in messages:
        judgement.asked[message.episode.uuid] = {
            i: _Asked(frozenset(f.uuid for f in candidates))
            for i, candidates in message.per_fact.items()
        }
    for answer in output.judgements if output is not None else []:
        question = prompt.question_of.get(answer.new_fact)
        if question is None:
            continue
        uuid, i = question
        asked = judgement.asked[uuid][i]

        def pick(number: int | None, allowed: frozenset[str] = asked.candidates) -> str | None:
            key = None if number is None else prompt.key_of.get(number)
            return key if key in allowed else None

        contradicts = tuple(k for k in (pick(n) for n in answer.contradicts) if k)
        judgement.asked[uuid][i] = _Asked(asked.candidates, pick(answer.duplicate_of), contradicts)
    return judgement


def _restates(existing: list[FactRecord], new: StampedFact) -> bool:
    """True when ``new`` repeats a fact word for word (``restatement_of``: while it holds, or
    before it with nothing between): plan_facts merges it without the LLM."""
    same_pair = [f for f in existing if f.source_uuid == new.source_uuid and f.name == new.relation]
    return restatement_of(new, same_pair) is not None


def _cosine(a: list[float] | None, b: list[float] | None) -> float:
    if not a or not b or len(a) != len(b):
        return 0.0
    return sum(x * y for x, y in zip(a, b, strict=True))  # both are L2-normalised
