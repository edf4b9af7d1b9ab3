"""The steps of the chain on the in-memory store, with an in-process scripted LLM: no server.

What each step decides, what it reads and writes (docs/architecture.md "Store access per episode",
"LLM calls"), and where it stops an episode already processed (docs/streaming.md "At-least-once with
idempotent effects")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from pydantic import BaseModel

from tests.support.crm_feed import crm_mappings, owner_record, plan_record
from tests.support.stores import upsert_entities
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.processors.context import RecentEpisodes
from tidegraph.processors.extraction import ExtractionStep
from tidegraph.processors.invalidation import InvalidationStep
from tidegraph.processors.prompts import EntityResolutionOutput, FactResolutionOutput
from tidegraph.processors.resolution import ResolutionStep
from tidegraph.processors.steps import Components
from tidegraph.processors.temporal import TemporalStep
from tidegraph.records.asof import AsOf
from tidegraph.records.episode import Episode
from tidegraph.records.errors import NoExtractorError
from tidegraph.records.graph import EntityRecord, EpisodeRecord, EpisodeWrite
from tidegraph.records.ids import normalize_name, stable_uuid
from tidegraph.records.search import Kind, SearchScope
from tidegraph.records.stages import (
    EntityDraft,
    Extraction,
    FactDraft,
    Processed,
    ResolvedEpisode,
    WriteSummary,
)
from tidegraph.records.times import iso
from tidegraph.stores import EpisodeConflictError, GraphStore
from tidegraph.stores.memory.store import MemoryStore

G = "tenant-1"
T0 = datetime(2024, 1, 1, tzinfo=UTC)
EMBEDDER = HashingEmbedder()
MAPPINGS = crm_mappings()
ACME = (1, "Acme Corp")


def day(n: int) -> datetime:
    return T0 + timedelta(days=n)


# ----------------------------------------------------------------------------- doubles
Answer = Callable[[str], dict[str, Any]]


@dataclass(frozen=True)
class Call:
    stage: str
    schema: type
    user: str


class ScriptedLLM:
    """``tidegraph.processors.prompts.StructuredLLM`` in process: each request is answered by the
    script of its schema (by class name) from the prompt; an unscripted request fails."""

    def __init__(self, **script: Answer) -> None:
        self.script = script
        self.calls: list[Call] = []

    async def structured(self, *, stage: str, system: str, user: str, schema: type) -> Any:
        self.calls.append(Call(stage, schema, user))
        answer = self.script.get(schema.__name__)
        assert answer is not None, f"unscripted {schema.__name__} request:\n{user}"
        return cast(type[BaseModel], schema).model_validate(answer(user))


class Counted:
    """A store that records the name of every call made to it (calls the store makes to
    itself are not counted)."""

    def __init__(self, inner: GraphStore) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await method(*args, **kwargs)

        return counted

    def as_store(self) -> GraphStore:
        return cast(GraphStore, self)


@pytest.fixture
async def store() -> MemoryStore:
    store = MemoryStore()
    await store.setup(EMBEDDER.dim)
    return store


# ----------------------------------------------------------------------------- records
def text_episode(id_: str, content: str, at: datetime = T0) -> Episode:
    return Episode(id=id_, group_id=G, source="text", content=content, reference_time=at)


def json_episode(id_: str, record: dict[str, Any], at: datetime) -> Episode:
    return Episode(id=id_, group_id=G, source="json", content=record, reference_time=at)


def mapped(id_: str, record: dict[str, Any], at: datetime) -> Extraction:
    extraction = MAPPINGS.extract(json_episode(id_, record, at))
    assert extraction is not None
    return extraction


def said(episode: Episode, *facts: tuple[str, str, str]) -> Extraction:
    """An LLM extraction of ``episode``: (subject, RELATION, object) facts."""
    names = list(dict.fromkeys(n for s, _, o in facts for n in (s, o)))
    return Extraction(
        episode=episode,
        entities=[EntityDraft(name=n) for n in names],
        facts=[
            FactDraft(
                subject=names.index(s),
                object=names.index(o),
                relation=r,
                fact=f"{s} {r.lower().replace('_', ' ')} {o}",
            )
            for s, r, o in facts
        ],
        llm_calls=1,
    )


def stored_entity(name: str, key: str | None = None, **fields: Any) -> EntityRecord:
    uuid = stable_uuid("entity", G, *(("key", key) if key else ("name", normalize_name(name))))
    return EntityRecord(uuid=uuid, group_id=G, name=name, key=key, **fields)


def marker(episode: Episode) -> EpisodeWrite:
    """The write of ``episode`` with nothing in it but its processed marker."""
    record = EpisodeRecord(
        uuid=episode.uuid,
        group_id=G,
        name=episode.id,
        source=episode.source,
        source_description="",
        content=episode.content_text(),
        valid_at=episode.reference_time,
        producer_id=episode.id,
        content_hash=episode.content_hash,
    )
    return EpisodeWrite(episode=record)


def no_entity_matches(user: str) -> dict[str, Any]:
    new = user.split("New entities:\n", 1)[1].splitlines()
    return {"matches": [{"entity": i, "duplicate_of": None} for i in range(len(new))]}


async def resolve(store: GraphStore, extraction: Extraction, llm: ScriptedLLM | None = None):
    return await ResolutionStep(store=store, embedder=EMBEDDER, llm=llm).run(extraction)


async def stamp(store: GraphStore, extraction: Extraction, llm: ScriptedLLM | None = None):
    resolved = await resolve(store, extraction, llm)
    assert isinstance(resolved, ResolvedEpisode)
    return await TemporalStep().run(resolved)


async def write(
    store: GraphStore, extraction: Extraction, llm: ScriptedLLM | None = None
) -> WriteSummary:
    """The write hop's steps on one extraction."""
    stamped = await stamp(store, extraction, llm)
    return await InvalidationStep(store=store, embedder=EMBEDDER, llm=llm).run(stamped)


# ============================================================================= resolution
async def test_a_key_match_resolves_whatever_the_name(store: MemoryStore) -> None:
    acme = stored_entity("Acme Corp", key="crm:account:1", labels=["Account"])
    await upsert_entities(store, G, [acme])
    resolved = await resolve(
        store, mapped("e1", plan_record((1, "ACME Inc."), "Pro", day(1)), day(1))
    )

    assert isinstance(resolved, ResolvedEpisode)
    account, plan = resolved.entity_uuids
    assert account == acme.uuid
    assert resolved.pending.created == [plan] and resolved.entities_new == 1
    [update] = [e for e in resolved.pending.entities if e.uuid == acme.uuid]
    assert update.aliases == ["acme inc"]  # the name it was seen under, for later name matches


async def test_an_exact_name_or_alias_match_resolves(store: MemoryStore) -> None:
    globex = stored_entity("Globex Corporation", aliases=["globex"])
    await upsert_entities(store, G, [globex])
    extraction = said(text_episode("e1", "GLOBEX hired Globex Corporation."),
                      ("GLOBEX", "HIRED", "Globex Corporation."))  # fmt: skip
    llm = ScriptedLLM()  # a request would fail: exact matches need no LLM

    resolved = await resolve(store, extraction, llm)
    assert isinstance(resolved, ResolvedEpisode)
    assert resolved.entity_uuids == [globex.uuid, globex.uuid]
    assert resolved.pending.created == [] and llm.calls == []


async def test_a_keyless_mention_joins_the_one_keyed_entity_of_its_name(
    store: MemoryStore,
) -> None:
    acme = stored_entity("Acme Corp", key="crm:account:1")
    await upsert_entities(store, G, [acme])
    episode = text_episode("e1", "Acme Corp called")
    extraction = Extraction(episode=episode, entities=[EntityDraft(name="Acme Corp")])
    llm = ScriptedLLM()  # a request would fail: the one keyed "Acme Corp" needs no LLM

    resolved = await resolve(store, extraction, llm)
    assert isinstance(resolved, ResolvedEpisode)
    assert resolved.entity_uuids == [acme.uuid] and llm.calls == []


async def test_two_keyed_entities_of_one_name_are_left_to_one_batched_llm_call(
    store: MemoryStore,
) -> None:
    sales = stored_entity("John Smith", key="crm:contact:1", summary="sales")
    support = stored_entity("John Smith", key="crm:contact:2", summary="support")
    await upsert_entities(store, G, [sales, support])

    def support_is_john(user: str) -> dict[str, Any]:
        listed = user.split("New entities:")[0].splitlines()[1:]
        index = next(i for i, line in enumerate(listed) if line.endswith(": support"))
        return {
            "matches": [{"entity": 0, "duplicate_of": index}, {"entity": 1, "duplicate_of": None}]
        }

    llm = ScriptedLLM(EntityResolutionOutput=support_is_john)
    extraction = said(text_episode("e1", "John Smith and J. Smith met"),
                      ("John Smith", "MET", "J. Smith"))  # fmt: skip

    resolved = await resolve(store, extraction, llm)
    assert isinstance(resolved, ResolvedEpisode)
    [call] = llm.calls
    assert (call.stage, call.schema) == ("resolution", EntityResolutionOutput)
    assert "[0] John Smith:" in call.user and "[1] J. Smith:" in call.user  # both, one call
    new = stable_uuid("entity", G, "name", "j smith")
    assert resolved.entity_uuids == [support.uuid, new]
    assert resolved.pending.created == [new] and resolved.llm_calls == 2  # extraction's + this


async def test_new_entities_get_deterministic_uuids_and_are_created(store: MemoryStore) -> None:
    extraction = mapped("e1", plan_record(ACME, "Basic", day(1)), day(1))
    first = await resolve(store, extraction)
    again = await resolve(MemoryStore(), extraction)

    assert isinstance(first, ResolvedEpisode) and isinstance(again, ResolvedEpisode)
    account = stable_uuid("entity", G, "key", "crm:account:1")
    plan = stable_uuid("entity", G, "name", "basic")
    assert first.entity_uuids == again.entity_uuids == [account, plan]
    assert first.pending.created == [account, plan] and first.entities_new == 2
    assert all(e.name_embedding for e in first.pending.entities)  # upserted with the episode
    assert await store.browse.counts(G) == {"episodes": 0, "entities": 0, "facts": 0, "mentions": 0}


async def test_a_processed_episode_stops_at_the_lookup(store: MemoryStore) -> None:
    extraction = said(text_episode("e1", "Alice works at Acme"), ("Alice", "WORKS_AT", "Acme"))
    await store.write_episode(G, marker(extraction.episode))
    counted, llm = Counted(store), ScriptedLLM()

    result = await resolve(counted.as_store(), extraction, llm)
    assert isinstance(result, Processed) and result.episode == extraction.episode
    assert counted.calls == ["lookup_entities"] and llm.calls == []


async def test_a_mapped_lookup_reads_the_facts_of_its_relations(store: MemoryStore) -> None:
    await write(store, mapped("e1", plan_record(ACME, "Basic", day(1)), day(1)))
    await write(store, mapped("e2", owner_record(ACME, (7, "Olive"), day(2)), day(2)))
    acme = stable_uuid("entity", G, "key", "crm:account:1")

    resolved = await resolve(store, mapped("e3", plan_record(ACME, "Pro", day(3)), day(3)))
    assert isinstance(resolved, ResolvedEpisode)
    known = resolved.pending.known_facts or []
    assert [(f.source_uuid, f.name, f.fact) for f in known] == [
        (acme, "HAS_PLAN", "Acme Corp is on the Basic plan")
    ]  # OWNED_BY is not a relation of this episode
    assert acme in resolved.pending.known_sources
    text = said(text_episode("e4", "Acme Corp is on Pro"), ("Acme Corp", "HAS_PLAN", "Pro"))
    unmapped = await resolve(store, text)
    assert isinstance(unmapped, ResolvedEpisode) and unmapped.pending.known_facts is None


async def test_an_id_reused_for_other_content_is_refused(store: MemoryStore) -> None:
    await store.write_episode(G, marker(text_episode("e1", "Alice works at Acme")))
    other = said(text_episode("e1", "Bob works at Globex"), ("Bob", "WORKS_AT", "Globex"))
    with pytest.raises(EpisodeConflictError):
        await resolve(store, other)


# ============================================================================= invalidation
async def test_a_mapped_episode_is_written_in_one_call_from_what_resolution_read(
    store: MemoryStore,
) -> None:
    counted = Counted(store)
    step = InvalidationStep(store=counted.as_store(), embedder=EMBEDDER, llm=None)

    basic = await stamp(store, mapped("e1", plan_record(ACME, "Basic", day(1)), day(1)))
    first = await step.run(basic)
    assert counted.calls == ["write_episode"]
    assert await store.browse.counts(G) == {"episodes": 1, "entities": 2, "facts": 1, "mentions": 2}
    assert await store.episode_processed(G, basic.episode.uuid)
    assert first.created_entities == basic.pending.created and first.facts_new == 1

    pro = await stamp(store, mapped("e2", plan_record(ACME, "Pro", day(5)), day(5)))
    assert pro.pending.known_facts  # read with resolution's lookup
    second = await step.run(pro)
    assert counted.calls == ["write_episode", "write_episode"]  # no read of its own
    assert (second.facts_new, second.facts_closed) == (1, 1)
    history = await store.browse.query_facts(G, include_invalid=True)
    assert [(v.object, v.valid_at, v.invalid_at) for v in history] == [
        ("Basic", iso(day(1)), iso(day(5))),
        ("Pro", iso(day(5)), None),
    ]


async def test_an_llm_judged_episode_reads_its_candidates_itself(store: MemoryStore) -> None:
    llm = ScriptedLLM(
        EntityResolutionOutput=no_entity_matches,
        FactResolutionOutput=lambda user: {"judgements": []},
    )
    await write(
        store, said(text_episode("e1", "Alice works at Acme"), ("Alice", "WORKS_AT", "Acme")), llm
    )
    stamped = await stamp(
        store,
        said(
            text_episode("e2", "Alice works at Initech", day(1)), ("Alice", "WORKS_AT", "Initech")
        ),
        llm,
    )
    counted = Counted(store)

    await InvalidationStep(store=counted.as_store(), embedder=EMBEDDER, llm=llm).run(stamped)
    assert counted.calls[0] == "fact_candidates" and counted.calls[-1] == "write_episode"
    assert [c.schema for c in llm.calls][-1] is FactResolutionOutput


async def test_an_llm_contradiction_closes_only_a_fact_sharing_an_endpoint(
    store: MemoryStore,
) -> None:
    def hostile(user: str) -> dict[str, Any]:
        """New fact "Alice works at Initech" contradicts every fact listed (also Carol's)."""
        existing, new = user.split("New facts:\n")
        listed = range(len(existing.splitlines()) - 1)
        return {
            "judgements": [
                {
                    "new_fact": int(line[1:].split("]", 1)[0]),
                    "duplicate_of": None,
                    "contradicts": list(listed) if "Initech" in line else [],
                }
                for line in new.splitlines()
            ]
        }

    llm = ScriptedLLM(EntityResolutionOutput=no_entity_matches, FactResolutionOutput=hostile)
    first = said(
        text_episode("e1", "Alice works at Acme, Carol lives in London, Bob works at Globex"),
        ("Alice", "WORKS_AT", "Acme"),
        ("Carol", "LIVES_IN", "London"),
        ("Bob", "WORKS_AT", "Globex"),
    )
    await write(store, first, llm)
    second = said(
        text_episode("e2", "Alice works at Initech. Carol lives in Paris", day(10)),
        ("Alice", "WORKS_AT", "Initech"),
        ("Carol", "LIVES_IN", "Paris"),
    )

    summary = await write(store, second, llm)
    [judged] = [c for c in llm.calls if c.schema is FactResolutionOutput]
    assert "Carol lives in London" in judged.user and "Globex" not in judged.user
    assert summary.facts_closed == 1
    views = await store.browse.query_facts(G, include_invalid=True)
    assert {(v.subject, v.object): v.invalid_at for v in views} == {
        ("Alice", "Acme"): iso(day(10)),  # closed when Initech starts
        ("Alice", "Initech"): None,
        ("Bob", "Globex"): None,
        ("Carol", "London"): None,  # named by the LLM, but shares no endpoint with Initech
        ("Carol", "Paris"): None,
    }


async def test_a_write_finding_the_episode_processed_is_skipped_and_keeps_its_created_entities(
    store: MemoryStore,
) -> None:
    stamped = await stamp(store, mapped("e1", plan_record(ACME, "Basic", day(1)), day(1)))
    step = InvalidationStep(store=store, embedder=EMBEDDER, llm=None)
    await step.run(stamped)
    counts = await store.browse.counts(G)

    again = await step.run(stamped)  # e.g. a retry after a commit whose answer was lost
    assert isinstance(again, Processed)
    assert again.created_entities == stamped.pending.created != []  # entities.new re-sent
    assert await store.browse.counts(G) == counts


@pytest.mark.parametrize("embed_mapped_content", [False, True])
async def test_a_mapped_records_content_is_embedded_only_when_asked(
    store: MemoryStore, embed_mapped_content: bool
) -> None:
    step = InvalidationStep(
        store=store, embedder=EMBEDDER, llm=None, embed_mapped_content=embed_mapped_content
    )
    record = mapped("e1", plan_record(ACME, "Basic", day(1)), day(1))
    note = said(text_episode("t1", "Alice joined Acme Corp", day(2)), ("Alice", "WORKS_AT", "Acme"))
    for extraction in (record, note):
        await step.run(await stamp(store, extraction))
    scope = SearchScope((G,), AsOf.resolve(None, None, False, None))

    async def nearest(kind: Kind, text: str) -> set[str]:
        hits = await store.search.vector_search(scope, kind, await EMBEDDER.embed_one(text), 10)
        return {hit.uuid for hit in hits}

    record_uuid, note_uuid = record.episode.uuid, note.episode.uuid
    by_vector = await nearest("episode", record.episode.content_text())
    assert (record_uuid in by_vector) is embed_mapped_content
    assert note_uuid in await nearest("episode", note.episode.content_text())  # text: always
    # Either way the record's fact is embedded and the record itself found by its words.
    assert await nearest("fact", record.facts[0].fact)
    found = await store.search.fulltext_search(scope, "episode", "Basic", 10)
    assert record_uuid in {hit.uuid for hit in found}


# ============================================================================= extraction
def extracting(user: str) -> dict[str, Any]:
    return {"entities": [{"name": "Alice", "type": "Person", "summary": None}], "facts": []}


async def test_a_mapped_record_needs_no_store_and_no_llm(store: MemoryStore) -> None:
    counted, llm = Counted(store), ScriptedLLM()
    step = ExtractionStep(
        mappings=MAPPINGS,
        llm=llm,
        store=counted.as_store(),
        context=RecentEpisodes(counted.as_store()),
    )
    extraction = await step.run(json_episode("e1", plan_record(ACME, "Pro", day(1)), day(1)))
    assert isinstance(extraction, Extraction) and extraction.mapped
    assert [e.name for e in extraction.entities] == ["Acme Corp", "Pro"]
    assert counted.calls == [] and llm.calls == []


async def test_without_an_llm_unmapped_json_has_no_extractor(store: MemoryStore) -> None:
    step = ExtractionStep(mappings=MAPPINGS, llm=None, store=store)
    with pytest.raises(NoExtractorError) as failed:
        await step.run(json_episode("e2", {"type": "invoice.paid", "amount": 3}, day(1)))
    assert failed.value.reason == "no_extractor"


async def test_without_an_llm_a_text_episode_goes_on_unextracted(store: MemoryStore) -> None:
    step = ExtractionStep(mappings=MAPPINGS, llm=None, store=store)
    result = await step.run(text_episode("e1", "Alice works at Acme"))
    assert isinstance(result, Extraction)
    assert result.not_extracted == "no_llm" and result.entities == [] and result.facts == []


@pytest.mark.parametrize(
    ("source", "reason", "stored"),
    [
        ("text", "llm_server", True),
        ("text", "llm_invalid_output", True),
        ("text", "timeout", True),
        ("text", "invalid_value", False),  # the record's own fault: dead-lettered
        ("json", "llm_server", False),  # business data: dead-lettered, replayed later
    ],
)
async def test_extraction_falls_back_to_unextracted_only_for_llm_failures_of_text(
    store: MemoryStore, source: str, reason: str, stored: bool
) -> None:
    step = ExtractionStep(mappings=MAPPINGS, llm=ScriptedLLM(), store=store)
    episode = (
        text_episode("e1", "Alice works at Acme")
        if source == "text"
        else json_episode("e2", {"type": "invoice.paid"}, day(1))
    )
    result = step.fallback(episode, reason)
    if stored:
        assert result is not None and result.not_extracted == reason
    else:
        assert result is None


async def test_an_episode_for_the_llm_already_processed_costs_no_call(store: MemoryStore) -> None:
    episode = text_episode("e1", "Alice works at Acme")
    await store.write_episode(G, marker(episode))
    llm = ScriptedLLM(ExtractionOutput=extracting)

    result = await ExtractionStep(mappings=MAPPINGS, llm=llm, store=store).run(episode)
    assert isinstance(result, Processed) and llm.calls == []


async def test_the_llm_is_given_the_groups_earlier_episodes(store: MemoryStore) -> None:
    await store.write_episode(G, marker(text_episode("e0", "Stored: Alice joined Acme", day(0))))
    await store.write_episode(G, marker(text_episode("e9", "Stored later: Acme moved", day(9))))
    llm = ScriptedLLM(ExtractionOutput=extracting)
    step = ExtractionStep(
        mappings=MAPPINGS, llm=llm, store=store, context=RecentEpisodes(store), context_episodes=4
    )

    first = await step.run(text_episode("e1", "In flight: Alice met Bob", day(1)))
    await step.run(text_episode("e2", "Current: Bob left", day(2)))  # e1 is not written yet
    assert isinstance(first, Extraction) and first.llm_calls == 1
    prompt = llm.calls[-1].user
    context, current = prompt.split("Current episode (")
    assert "Previous episodes (context only):" in context
    assert context.index("Stored: Alice joined Acme") < context.index("In flight: Alice met Bob")
    assert "Stored later" not in prompt and "Current: Bob left" in current
    assert "In flight" not in llm.calls[0].user.split("Current episode (")[0]


async def test_a_joint_extraction_answer_is_taken_episode_by_episode(store: MemoryStore) -> None:
    """Several episodes in one call: each answer goes to the episode its index names (the
    first answer for an index counts, indexes outside the request are ignored), an episode
    the answer leaves out gets None (it is then asked alone), and the call counts once."""
    episodes = [text_episode(f"e{n}", f"Message {n}", day(n)) for n in range(3)]

    def answer(user: str) -> dict[str, Any]:
        def named(name: str) -> dict[str, Any]:
            return {"name": name, "type": "Person", "summary": None}

        return {
            "episodes": [
                {"episode": 2, "entities": [named("Carol")], "facts": []},
                {"episode": 7, "entities": [named("Nobody")], "facts": []},
                {"episode": 0, "entities": [named("Alice")], "facts": []},
                {"episode": 2, "entities": [named("Not Carol")], "facts": []},
            ]
        }

    llm = ScriptedLLM(EpisodesExtractionOutput=answer)
    step = ExtractionStep(
        mappings=MAPPINGS, llm=llm, store=store, context=RecentEpisodes(store), context_episodes=4
    )
    prepared = [await step.prepare(e) for e in episodes]
    results = await step.ask_together(prepared)
    assert [[x.name for x in r.entities] if r else None for r in results] == [
        ["Alice"],
        None,
        ["Carol"],
    ]
    assert [r.episode.id if r else None for r in results] == ["e0", None, "e2"]
    assert [r.llm_calls if r else None for r in results] == [1, None, 0]
    [call] = llm.calls
    assert [call.user.count(f"Message {n}") for n in range(3)] == [1, 1, 1]
    assert (
        call.user.index("Message 0") < call.user.index("Message 1") < call.user.index("Message 2")
    )


# ============================================================================= the runner
def test_the_runner_builds_its_steps_over_shared_components(store: MemoryStore) -> None:
    components = Components.of(store=store, embedder=EMBEDDER, llm=None, mappings=MAPPINGS)
    runner = GroupRunner(components)
    assert runner.extraction.store is store and runner.extraction.context is components.context
    steps = runner.units._steps(store, None)  # type: ignore[arg-type]
    assert steps.resolution.store is steps.invalidation.store is store
    assert steps.resolution.embedder is steps.invalidation.embedder is components.embedder
