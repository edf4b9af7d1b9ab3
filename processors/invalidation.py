"""Invalidation stage: fact dedupe and contradiction on the two timelines, then one idempotent
write transaction (README "Two timelines").

It runs right after resolution and temporal stamping, in the same ordered hop (``topics.chain``):
the stored facts it compares with include every earlier episode of the group. The candidates
of a mapped episode were read with resolution's lookup (``PendingWrite.known_facts``); those
of an LLM-judged one are read here, with their embeddings. The transaction writes the entity
upserts resolution left (``PendingWrite.entities``), the facts, the closures, the mentions and
the Episodic node, the processed marker, and skips an episode processed meanwhile (a stale
worker that lost its partition). The rules themselves are pure: ``processors.timeline``.
"""

from __future__ import annotations

import logging

from processors.prompts import (
    FACT_RESOLUTION_SYSTEM,
    FactResolutionOutput,
    StructuredLLM,
    fact_resolution_user,
)
from processors.timeline import FactDecision, plan_facts, restatement_of
from tidegraph.embed.base import Embedder
from tidegraph.metrics import FACTS_INVALIDATED
from tidegraph.records.graph import EntityRecord, EpisodeRecord, EpisodeWrite, FactRecord
from tidegraph.records.stages import StampedEpisode, StampedFact, WriteSummary
from tidegraph.records.times import utcnow
from tidegraph.store.base import GraphStore
from tidegraph.store.hits import EPISODE_EMBED_CHARS

log = logging.getLogger(__name__)

MAX_CANDIDATES_PER_FACT = 12


class InvalidationStep:
    """``run(stamped) -> WriteSummary`` (``skipped`` when the write found the episode already
    processed)."""

    stage = "invalidation"

    def __init__(
        self,
        *,
        store: GraphStore,
        embedder: Embedder,
        llm: StructuredLLM | None,
        embed_mapped_content: bool = False,
    ) -> None:
        """``embed_mapped_content``: also embed the content of an episode a declared mapping
        extracted (README "Configuration", ``TIDEGRAPH_EMBED_MAPPED_CONTENT``)."""
        self.store = store
        self.embedder = embedder
        self.llm = llm
        self.embed_mapped_content = embed_mapped_content

    async def run(self, stamped: StampedEpisode) -> WriteSummary:
        episode = stamped.episode
        group = episode.group_id
        pending = stamped.pending
        summary = WriteSummary(
            group_id=group,
            episode_uuid=episode.uuid,
            episode_id=episode.id,
            created_entities=pending.created,
        )
        facts = stamped.facts
        judged = self.llm is not None and not stamped.mapped
        candidates = None
        if pending.known_facts is not None and not judged:
            candidates = prefetched_candidates(
                facts, pending.known_facts, set(pending.known_sources)
            )
        if candidates is None:
            candidates = await self._candidates(group, facts, judged=judged)
        # One embedding call: the facts' texts, and the episode's content (episode search).
        # A mapped record's content is not embedded unless asked: what it says is in its
        # facts and entities, which are, and BM25 finds the record itself.
        content = episode.content_text()
        to_embed = [i for i, f in enumerate(facts) if not f.closes]
        texts = [facts[i].fact for i in to_embed]
        embed_content = not stamped.mapped or self.embed_mapped_content
        if embed_content:
            texts.append(content[:EPISODE_EMBED_CHARS])
        vectors = await self.embedder.embed(texts) if texts else []
        content_embedding = vectors.pop() if embed_content else None
        embeddings = dict(zip(to_embed, vectors, strict=True))
        decisions: dict[int, FactDecision] = {}
        llm_calls = 0
        if judged:
            decisions, llm_calls = await self._judge(group, facts, candidates, embeddings)
        now = utcnow()
        plan = plan_facts(
            group_id=group,
            episode_uuid=episode.uuid,
            stamped=facts,
            existing=candidates,
            now=now,
            embeddings=embeddings,
            decisions=decisions,
        )
        record = EpisodeRecord(
            uuid=episode.uuid,
            group_id=group,
            name=episode.name or episode.id,
            source=episode.source,
            source_description=episode.source_description,
            content=content,
            content_embedding=content_embedding,
            valid_at=episode.reference_time,
            created_at=now,
            producer_id=episode.id,
            content_hash=episode.content_hash,
            not_extracted=stamped.not_extracted,
        )
        written = await self.store.write_episode(
            group,
            EpisodeWrite(
                episode=record,
                mentions=stamped.mentions,
                facts=list(plan.facts.values()),
                closures=list(plan.closures.values()),
                entities=pending.entities,
                created=pending.created,
            ),
        )
        summary.llm_calls = stamped.llm_calls + llm_calls
        summary.not_extracted = stamped.not_extracted
        if not written:  # processed meanwhile (e.g. by the worker that now owns the group)
            summary.skipped = True
            return summary
        FACTS_INVALIDATED.labels("closed").inc(plan.closed)
        FACTS_INVALIDATED.labels("born_closed").inc(plan.born_closed)
        summary.facts_new = plan.new
        summary.facts_merged = plan.merged
        summary.facts_closed = plan.closed
        summary.facts_born_closed = plan.born_closed
        summary.entities = len(stamped.mentions)
        summary.entities_new = stamped.entities_new
        return summary

    async def _candidates(
        self, group: str, facts: list[StampedFact], *, judged: bool
    ) -> list[FactRecord]:
        """The stored facts the new ones can merge with or close (see ``candidate_reads``)."""
        pairs, ends = candidate_reads(facts, judged=judged)
        if not pairs and not ends:
            return []
        return await self.store.fact_candidates(group, pairs, ends, embeddings=judged)

    async def _judge(
        self,
        group: str,
        facts: list[StampedFact],
        existing: list[FactRecord],
        embeddings: dict[int, list[float]],
    ) -> tuple[dict[int, FactDecision], int]:
        """One LLM call judging every new fact against its candidates (shared endpoint and
        same relation or similar text); no call when no fact has a candidate."""
        threshold = self.embedder.thresholds.fact_candidate
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
        if not per_fact:
            return {}, 0
        listed: dict[str, FactRecord] = {}
        for candidates in per_fact.values():
            for f in candidates:
                listed.setdefault(f.uuid, f)
        ordered = sorted(listed.values(), key=lambda f: f.uuid)
        names = await self._entity_names(group, ordered)
        output: FactResolutionOutput = await self.llm.structured(  # type: ignore[union-attr]
            stage=self.stage,
            system=FACT_RESOLUTION_SYSTEM,
            user=fact_resolution_user(
                [(i, facts[i].fact) for i in sorted(per_fact)], ordered, names
            ),
            schema=FactResolutionOutput,
        )
        decisions: dict[int, FactDecision] = {}
        for j in output.judgements:
            if j.new_fact not in per_fact:
                continue
            allowed = {f.uuid for f in per_fact[j.new_fact]}

            def pick(k: int | None, allowed: set[str] = allowed) -> str | None:
                if k is None or not 0 <= k < len(ordered):
                    return None
                return ordered[k].uuid if ordered[k].uuid in allowed else None

            contradicts = tuple(u for u in (pick(k) for k in j.contradicts) if u)
            decisions[j.new_fact] = FactDecision(pick(j.duplicate_of), contradicts)
        return decisions, 1

    async def _entity_names(self, group: str, facts: list[FactRecord]) -> dict[str, str]:
        uuids = sorted({u for f in facts for u in (f.source_uuid, f.target_uuid)})
        records: list[EntityRecord] = await self.store.entities_by_uuids(group, uuids)
        return {r.uuid: r.name for r in records}


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


def _restates(existing: list[FactRecord], new: StampedFact) -> bool:
    """True when ``new`` repeats a stored fact word for word (``restatement_of``: while it
    holds, or before it with nothing between): plan_facts merges it without the LLM."""
    same_pair = [f for f in existing if f.source_uuid == new.source_uuid and f.name == new.relation]
    return restatement_of(new, same_pair) is not None


def _cosine(a: list[float] | None, b: list[float] | None) -> float:
    if not a or not b or len(a) != len(b):
        return 0.0
    return sum(x * y for x, y in zip(a, b, strict=True))  # both are L2-normalised
