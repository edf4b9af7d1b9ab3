"""Invalidation stage: fact dedupe and contradiction on the two timelines, then one idempotent
write transaction (docs/architecture.md "Two timelines").

It runs right after resolution and temporal stamping, in the same ordered hop
(``tidegraph.pipelines.runner``): the stored facts it compares with include every earlier episode of
the group. The candidates of a mapped episode were read with resolution's lookup
(``PendingWrite.known_facts``); those of an LLM-judged one are read here, with their embeddings. The
transaction writes the entity upserts resolution left (``PendingWrite.entities``), the facts, the
closures, the mentions and the Episodic node, the processed marker, and skips an episode processed
meanwhile (a stale worker that lost its partition). The rules themselves are pure:
``tidegraph.processors.timeline``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from tidegraph.embed.base import Embedder
from tidegraph.metrics import FACT_JUDGEMENTS, FACTS_INVALIDATED, labelled
from tidegraph.processors.fact_judging import (
    Judgement,
    Message,
    Vectors,
    candidates_per_fact,
    judgement_of,
    prompt_of,
    standing_for,
)
from tidegraph.processors.prompts import (
    FACT_RESOLUTION_SYSTEM,
    FactResolutionOutput,
    StructuredLLM,
    fact_resolution_user,
)
from tidegraph.processors.steps import UnitStore
from tidegraph.processors.timeline import FactDecision, plan_facts
from tidegraph.records.conversation import embed_text
from tidegraph.records.episode import Episode
from tidegraph.records.graph import EpisodeRecord, EpisodeWrite, FactRecord
from tidegraph.records.stages import (
    Processed,
    StampedEpisode,
    StampedFact,
    WriteSummary,
    stored_extraction,
)
from tidegraph.records.times import now_for

log = logging.getLogger(__name__)


class InvalidationStep:
    """``run(stamped) -> WriteSummary``, or ``Processed`` when the write found the episode
    already processed."""

    stage = "invalidation"

    def __init__(
        self,
        *,
        store: UnitStore,
        embedder: Embedder,
        llm: StructuredLLM | None,
        embed_mapped_content: bool = False,
        clock: Callable[[Episode], datetime] = now_for,
    ) -> None:
        """``embed_mapped_content``: also embed the content of an episode a declared mapping
        extracted (docs/configuration.md, ``TIDEGRAPH_EMBED_MAPPED_CONTENT``); ``clock``: the
        ingestion time of its write (now)."""
        self.store = store
        self.embedder = embedder
        self.llm = llm
        self.embed_mapped_content = embed_mapped_content
        self.clock = clock

    async def run(
        self, stamped: StampedEpisode, joint: Judgement | None = None
    ) -> WriteSummary | Processed:
        """``joint``: the answers of a call that judged this episode's facts with those of
        the episodes before it in its unit (``judge_together``), used when they answer the
        questions this episode asks now (``tidegraph.processors.fact_judging``)."""
        episode = stamped.episode
        group = episode.group_id
        pending = stamped.pending
        facts = stamped.facts
        judged = self.llm is not None and not stamped.mapped
        candidates = None
        if pending.known_facts is not None and not judged:
            candidates = prefetched_candidates(
                facts, pending.known_facts, set(pending.known_sources)
            )
        if candidates is None:
            candidates = await self._candidates(group, facts, judged=judged)
        vectors = joint.vectors.pop(episode.uuid, None) if joint is not None else None
        embeddings, content_embedding = vectors or await self._embed(stamped)
        decisions: dict[int, FactDecision] = {}
        llm_calls = stamped.llm_calls + (joint.take_calls() if joint is not None else 0)
        if judged:
            decisions, calls = await self._judge(episode, facts, candidates, embeddings, joint)
            llm_calls += calls
        now = pending.ingested_at or self.clock(episode)
        plan = plan_facts(
            group_id=group,
            episode_uuid=episode.uuid,
            stamped=facts,
            existing=candidates,
            now=now,
            embeddings=embeddings,
            decisions=decisions,
        )
        if joint is not None:
            joint.record(episode.uuid, plan.became)
        write = EpisodeWrite(
            episode=episode_record(stamped, content_embedding, now),
            mentions=stamped.mentions,
            facts=list(plan.facts.values()),
            closures=list(plan.closures.values()),
            entities=pending.entities,
            created=pending.created,
        )
        if not await self.store.write_episode(group, write):
            # Processed meanwhile (e.g. by the worker that now owns the group), or stored
            # without extraction before and again now.
            return Processed(
                episode=episode,
                created_entities=pending.created,
                not_extracted=stamped.not_extracted,
            )
        labelled(FACTS_INVALIDATED, "closed").inc(plan.closed)
        labelled(FACTS_INVALIDATED, "born_closed").inc(plan.born_closed)
        return WriteSummary(
            group_id=group,
            episode_uuid=episode.uuid,
            episode_id=episode.id,
            created_entities=pending.created,
            llm_calls=llm_calls,
            not_extracted=stamped.not_extracted,
            facts_new=plan.new,
            facts_merged=plan.merged,
            facts_closed=plan.closed,
            facts_born_closed=plan.born_closed,
            entities=len(stamped.mentions),
            entities_new=stamped.entities_new,
        )

    async def _candidates(
        self, group: str, facts: list[StampedFact], *, judged: bool
    ) -> list[FactRecord]:
        """The stored facts the new ones can merge with or close (see ``candidate_reads``)."""
        pairs, ends = candidate_reads(facts, judged=judged)
        if not pairs and not ends:
            return []
        return await self.store.fact_candidates(group, pairs, ends, embeddings=judged)

    async def _embed(self, stamped: StampedEpisode) -> Vectors:
        """One embedding call: the texts of the facts (but closing ones), and the episode's
        content (episode search). A mapped record's content is not embedded unless asked:
        what it says is in its facts and entities, which are, and BM25 finds the record."""
        facts = stamped.facts
        to_embed = [i for i, f in enumerate(facts) if not f.closes]
        texts = [facts[i].fact for i in to_embed]
        embed_content = not stamped.mapped or self.embed_mapped_content
        if embed_content:
            episode = stamped.episode
            texts.append(embed_text(episode.source, episode.content_text(), episode.reference_time))
        vectors = await self.embedder.embed(texts) if texts else []
        content_embedding = vectors.pop() if embed_content else None
        return dict(zip(to_embed, vectors, strict=True)), content_embedding

    async def judge_together(self, stampeds: list[StampedEpisode]) -> Judgement | None:
        """One LLM call judging the new facts of consecutive LLM-extracted episodes of one
        group (in order, none written yet), each against its candidates as the store holds
        them and the new facts of the episodes before it; None when there is nothing to
        share (fewer than two episodes, no LLM). Each episode's ``run`` then takes the
        answers that are its own (``tidegraph.processors.fact_judging``)."""
        if len(stampeds) < 2 or self.llm is None or any(s.mapped for s in stampeds):
            return None
        group = stampeds[0].episode.group_id
        threshold = self.embedder.thresholds.fact_candidate
        vectors: dict[str, Vectors] = {}
        messages: list[Message] = []
        earlier: list[FactRecord] = []
        for stamped in stampeds:
            episode = stamped.episode
            candidates = await self._candidates(group, stamped.facts, judged=True)
            vectors[episode.uuid] = await self._embed(stamped)
            embeddings = vectors[episode.uuid][0]
            per_fact = candidates_per_fact(
                stamped.facts, [*candidates, *earlier], embeddings, threshold
            )
            messages.append(Message(episode, stamped.facts, per_fact))
            earlier += standing_for(group, episode.uuid, stamped.facts, embeddings)
        joint = await self._ask(group, messages)
        joint.vectors = vectors
        return joint

    async def _judge(
        self,
        episode: Episode,
        facts: list[StampedFact],
        existing: list[FactRecord],
        embeddings: dict[int, list[float]],
        joint: Judgement | None,
    ) -> tuple[dict[int, FactDecision], int]:
        """The LLM's decisions on the facts that have candidates (``candidates_per_fact``):
        from ``joint`` when it asked exactly these questions, else from one call of this
        episode's own; no call when no fact has a candidate."""
        threshold = self.embedder.thresholds.fact_candidate
        per_fact = candidates_per_fact(facts, existing, embeddings, threshold)
        if not per_fact:
            return {}, 0
        if joint is not None:
            decisions = joint.decisions_for(episode.uuid, per_fact)
            if decisions is not None:
                FACT_JUDGEMENTS.labels("joint").inc()
                return decisions, 0
        FACT_JUDGEMENTS.labels("alone").inc()
        alone = await self._ask(episode.group_id, [Message(episode, facts, per_fact)])
        decisions = alone.decisions_for(episode.uuid, per_fact)
        assert decisions is not None  # the questions it was just asked
        return decisions, alone.calls

    async def _ask(self, group: str, messages: list[Message]) -> Judgement:
        """One call for the questions of ``messages`` (none when there are none)."""
        prompt = prompt_of(messages)
        if not prompt.question_of:
            return judgement_of(messages, prompt, None)
        names = await self._entity_names(group, prompt.stored)
        output: FactResolutionOutput = await self.llm.structured(  # type: ignore[union-attr]
            stage=self.stage,
            system=FACT_RESOLUTION_SYSTEM,
            user=fact_resolution_user(prompt.messages, prompt.stored, names),
            schema=FactResolutionOutput,
        )
        return judgement_of(messages, prompt, output)

    async def _entity_names(self, group: str, facts: list[FactRecord]) -> dict[str, str]:
        uuids = sorted({u for f in facts for u in (f.source_uuid, f.target_uuid)})
        return await self.store.entity_names(group, uuids)


def candidate_reads(
    facts: list[StampedFact], *, judged: bool
) -> tuple[list[tuple[str, str]], list[str]]:
    """What to read for ``plan_facts``: (subject, relation) pairs and entities whose every fact
    is read. For a relation with a cardinality (or a closing record), the facts of the same
    subject and relation; for a fact the LLM judges, every fact sharing an endpoint (its
    candidates). Unjudged facts without a cardinality (mapped) only merge with facts of the
    same subject and relation, so no more is read for them: reading a shared object's facts
    (an account, a plan, a ticket status) would read, and copy, every fact pointing at it,
    ever more with each episode of the group. Only judged facts need the stored embeddings
    (a fact written back without one keeps its stored embedding)."""
    pairs = {(f.source_uuid, f.relation) for f in facts if f.closes or f.cardinality or not judged}
    ends = {
        u
        for f in facts
        if judged and not (f.closes or f.cardinality)
        for u in (f.source_uuid, f.target_uuid)
        if u
    }
    return sorted(pairs), sorted(ends)


def prefetched_candidates(
    facts: list[StampedFact], read: list[FactRecord], sources: set[str]
) -> list[FactRecord] | None:
    """The unjudged candidates of ``facts`` (``candidate_reads(judged=False)``) out of
    ``read``: the stored facts of relations among the facts' whose source is in ``sources``
    (e.g. read with the resolution lookup). None when some fact's subject is not in
    ``sources``: then ``read`` may miss candidates and they must be read."""
    pairs, ends = candidate_reads(facts, judged=False)
    if ends or any(source not in sources for source, _ in pairs):
        return None
    wanted = set(pairs)
    return [f for f in read if (f.source_uuid, f.name) in wanted]


def episode_record(
    stamped: StampedEpisode, content_embedding: list[float] | None, now: datetime
) -> EpisodeRecord:
    """The episode's node as written: its processed marker (unless stored unextracted)."""
    return EpisodeRecord.of(
        stamped.episode,
        created_at=now,
        content_embedding=content_embedding,
        not_extracted=stamped.not_extracted,
        extraction=None
        if stamped.extraction is None or stamped.not_extracted is not None
        else stored_extraction(stamped.extraction),
        extracted_at=None if stamped.not_extracted is not None else now,
    )
