"""A group's consecutive episodes resolved, stamped, invalidated and written as one unit
(README "Batch-native stages"): mapped records, or LLM-extracted (text) ones.

The chain's own steps run on each episode in order, as one at a time, against a
``tidegraph.pipelines.batch_view.BatchView`` instead of the store: one read for the whole batch,
each episode seeing the earlier ones' effects in memory, and one ``write_episodes`` call at the end
(one transaction on Neo4j). When anything goes wrong (the view cannot answer a question exactly, a
step fails, the write fails), the batch stops and the caller processes what was not committed one
episode at a time, with the usual retries and dead letters: a failing episode is isolated exactly as
without batches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import weakref
from collections.abc import Sequence
from typing import Any, cast

from tidegraph.embed.cache import CachingEmbedder
from tidegraph.metrics import BATCH_EPISODES, BATCHES, STAGE_EVENTS, STAGE_LATENCY
from tidegraph.pipelines.batch_view import BatchView, EntitiesAhead
from tidegraph.pipelines.chain import CHAIN, build_steps
from tidegraph.pipelines.speculation import Peek, SharedCalls, Starting, try_ahead
from tidegraph.processors.extraction import ExtractionStep
from tidegraph.processors.invalidation import InvalidationStep
from tidegraph.processors.resolution import ResolutionStep
from tidegraph.processors.steps import Components
from tidegraph.records.conversation import embed_text
from tidegraph.records.episode import Episode
from tidegraph.records.stages import Extraction, Processed, StampedEpisode, WriteSummary
from tidegraph.stores.base import BatchWriteError, GraphStore

log = logging.getLogger(__name__)

# Episodes of one group written as one unit, at most.
DEFAULT_BATCH_EPISODES = 64
# LLM extractions of one group in flight ahead of its ordered stages, at most.
DEFAULT_EXTRACT_AHEAD = 4


def batchable(episode: Episode, components: Components) -> bool:
    """Whether ``episode`` may go into a batch: a JSON record with declared mappings (an
    LLM-extracted episode is judged against search results the view cannot answer)."""
    return episode.source == "json" and components.mappings is not None


async def process_batch(components: Components, episodes: Sequence[Episode]) -> list[WriteSummary]:
    """The summaries of ``episodes`` (one group's, in order) processed as one unit: all of
    them, or a prefix (maybe empty): the ones before an episode its mapping cannot extract,
    or the ones committed before the batch stopped. The caller processes the next one alone,
    then batches again."""
    extraction = cast(ExtractionStep, build_steps(components, CHAIN[:1])[0])
    started = time.perf_counter()
    extractions = await _mapped_prefix(extraction, episodes)
    mapping = (time.perf_counter() - started) / max(1, len(extractions))
    done = await process_extractions(components, extractions)
    _count([[(extraction.stage, "ok", mapping)] for _ in done])
    return done


async def process_extractions(
    components: Components, extractions: Sequence[Extraction]
) -> list[WriteSummary]:
    """``process_batch`` from the episodes' extractions (the write hop's records; all mapped,
    or all LLM-extracted): resolution, temporal stamping, invalidation and the write, as one
    unit. An LLM-extracted episode's search (a draft no key or name finds) is asked of the
    store once the episodes before it are written (``BatchView.entity_candidates``); the
    writes after it are held again, so the unit goes on."""
    if len(extractions) < 2:
        return []  # nothing to gain: one at a time
    summaries: list[WriteSummary] = []
    counted: list[Counted] = []
    try:
        judged = not extractions[0].mapped
        view = await BatchView.read(components.store, list(extractions), judged=judged)
        if judged and components.llm is not None:
            shared = SharedCalls(components.llm)
            try:
                await _judged_runs(view, components, shared, extractions, summaries, counted)
            finally:
                shared.close()
        else:
            await _embed_ahead(components, extractions)
            steps = build_steps(
                dataclasses.replace(components, store=cast(GraphStore, view)), CHAIN[1:]
            )
            async with in_memory_turn():
                for item in extractions:
                    await asyncio.sleep(0)  # the loop serves I/O between episodes
                    try:
                        summary, steps_counted = await _through(steps, item)
                        summaries.append(summary)
                        counted.append(steps_counted)
                    except BatchWriteError:
                        raise  # the held writes the view flushed for a search
                    except Exception as exc:
                        if not summaries:
                            raise
                        # The episodes before it are exact: written; it goes alone.
                        log.info("batch stops before episode %s: %s", item.episode.id, exc)
                        break
        written = await view.flush()
    except BatchWriteError as exc:
        BATCHES.labels("fallback").inc()
        log.warning("batch write failed, going on one episode at a time: %s", exc.__cause__)
        committed = _committed(summaries, len(exc.written))
        _count(counted[: len(committed)])
        return _with_written(committed, exc.written)
    except Exception as exc:  # nothing written: the episodes go one at a time
        BATCHES.labels("fallback").inc()
        log.info("batch of %d episodes goes one at a time: %s", len(extractions), exc)
        return []
    BATCHES.labels("batched").inc()
    BATCH_EPISODES.observe(len(summaries))
    _count(counted)
    return _with_written(summaries, written)


def in_memory_turn() -> asyncio.Lock:
    """The turn of a unit's in-memory work on this event loop: one unit at a time.

    The work is CPU-bound on one thread either way. Interleaved, the units of all groups
    would finish together and their writes would queue behind each other while the store
    idles (a convoy: read, compute, write, each in turn for everyone); one at a time, the
    first unit's write runs while the next one computes. Between episodes the holder yields
    to the event loop, so the store's round trips are served meanwhile."""
    loop = asyncio.get_running_loop()
    turn = _TURNS.get(loop)
    if turn is None:
        turn = _TURNS[loop] = asyncio.Lock()
    return turn


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


async def _embed_ahead(components: Components, extractions: Sequence[Extraction]) -> None:
    """Every text the unit's steps may embed (entity names, the facts but closing ones, the
    content when mapped content is embedded), in one call before its turn: the steps then
    find them in the embedder's cache, and the turn waits on no embedding service."""
    if not isinstance(components.embedder, CachingEmbedder):
        return
    texts: dict[str, None] = {}
    for extraction in extractions:
        texts.update(dict.fromkeys(entity.name for entity in extraction.entities))
        texts.update(dict.fromkeys(fact.fact for fact in extraction.facts if not fact.closes))
        if components.embed_mapped_content:
            episode = extraction.episode
            texts[embed_text(episode.source, episode.content_text(), episode.reference_time)] = None
    await components.embedder.warm(list(texts))


async def _judged_runs(
    view: BatchView,
    components: Components,
    shared: SharedCalls,
    extractions: Sequence[Extraction],
    summaries: list[WriteSummary],
    counted: list[Counted],
) -> None:
    """LLM-extracted episodes, in runs: each episode of a run resolved and stamped in turn
    (its entities held in the view ahead of its write, so the next one's resolution finds
    them), then the new facts of the whole run judged in one LLM call
    (``InvalidationStep.judge_together``), then each episode's invalidation and write in
    order. A run ends before an episode whose resolution needs the store's search (the
    run is written first: ``EntitiesAhead``; meanwhile that episode's resolution is tried
    against the store as it stands, its entity judging call started ahead:
    ``tidegraph.pipelines.speculation``) or that repeats an episode of the run. Appends to
    ``summaries`` and ``counted``; stops, as the plain loop does, before an episode that
    fails (raising when it is the unit's first)."""
    steps = build_steps(
        dataclasses.replace(components, store=cast(GraphStore, view), llm=shared), CHAIN[1:]
    )
    resolve, invalidation = steps[:-1], cast(InvalidationStep, steps[-1])
    tried = cast(
        ResolutionStep,
        build_steps(
            dataclasses.replace(
                components,
                store=cast(GraphStore, Peek(view, components.store)),
                llm=Starting(shared),
            ),
            CHAIN[1:2],
        )[0],
    )
    guess: list[asyncio.Task[None]] = []
    try:
        await _runs(view, resolve, invalidation, tried, guess, extractions, summaries, counted)
    finally:
        for task in guess:
            task.cancel()


async def _runs(
    view: BatchView,
    resolve: list[Any],
    invalidation: InvalidationStep,
    tried: ResolutionStep,
    guess: list[asyncio.Task[None]],
    extractions: Sequence[Extraction],
    summaries: list[WriteSummary],
    counted: list[Counted],
) -> None:
    """The loop of ``_judged_runs`` (``guess``: the tried resolution in flight, if any)."""
    at = 0
    while at < len(extractions):
        run: list[tuple[Any, Counted]] = []  # (StampedEpisode or skip summary, counted)
        seen: set[str] = set()
        stop = False
        for item in extractions[at:]:
            if item.episode.uuid in seen:
                break
            if guess:
                await guess.pop()  # its call is started before the real one may ask for it
            try:
                out, steps_counted = await _through(resolve, item)
            except EntitiesAhead:
                guess.append(asyncio.create_task(try_ahead(tried, item)))
                break
            except BatchWriteError:
                raise
            except Exception as exc:
                if not summaries and not run:
                    raise
                log.info("batch stops before episode %s: %s", item.episode.id, exc)
                stop = True
                break
            seen.add(item.episode.uuid)
            if isinstance(out, StampedEpisode):
                view.hold_entities(out.episode.uuid, out.pending.entities)
            run.append((out, steps_counted))
        stamped = [out for out, _ in run if isinstance(out, StampedEpisode)]
        try:
            joint = await invalidation.judge_together(stamped)
        except BatchWriteError:
            raise
        except Exception as exc:  # each episode then asks alone
            log.info("joint fact judgement failed, each episode asks alone: %s", exc)
            joint = None
        for out, steps_counted in run:
            if isinstance(out, StampedEpisode):
                started = time.perf_counter()
                try:
                    out = await invalidation.run(out, joint)
                except BatchWriteError:
                    raise
                except Exception as exc:
                    if not summaries:
                        raise
                    log.info("batch stops before episode %s: %s", out.episode.id, exc)
                    stop = True
                    break
                steps_counted.append((invalidation.stage, "ok", time.perf_counter() - started))
            summaries.append(out)
            counted.append(steps_counted)
        at += len(run)
        if stop or not run:
            return


async def _mapped_prefix(
    extraction: ExtractionStep, episodes: Sequence[Episode]
) -> list[Extraction]:
    """The extractions of ``episodes`` up to the first one its mapping does not extract (a
    record it cannot read goes one at a time, to its dead letter)."""
    extractions: list[Extraction] = []
    for episode in episodes:
        try:
            mapped = await extraction.map_record(episode)
        except Exception:
            break
        if mapped is None:
            break
        extractions.append(mapped)
    return extractions


# What a batch's episode did at each stage: (stage, outcome, seconds), counted once the
# batch is written (an episode the batch gives back is counted when processed alone).
Counted = list[tuple[str, str, float]]


async def _through(steps: list[Any], item: Any) -> tuple[Any, Counted]:
    extraction: Extraction = item
    counted: Counted = []
    for step in steps:
        started = time.perf_counter()
        item = await step.run(item)
        elapsed = time.perf_counter() - started
        if isinstance(item, Processed):
            counted.append((step.stage, "skipped", elapsed))
            episode = extraction.episode
            summary = WriteSummary(
                group_id=episode.group_id,
                episode_uuid=episode.uuid,
                episode_id=episode.id,
                skipped=True,
                created_entities=item.created_entities,
            )
            return summary, counted
        counted.append((step.stage, "ok", elapsed))
    return item, counted


def _count(counted: list[Counted]) -> None:
    for episode in counted:
        for stage, outcome, seconds in episode:
            STAGE_EVENTS.labels(stage, outcome).inc()
            STAGE_LATENCY.labels(stage).observe(seconds)


def _with_written(summaries: list[WriteSummary], written: list[bool]) -> list[WriteSummary]:
    """The summaries, those whose write the store skipped (processed meanwhile) as skipped."""
    results = iter(written)
    out = []
    for summary in summaries:
        if not summary.skipped and not next(results):
            summary = WriteSummary(
                group_id=summary.group_id,
                episode_uuid=summary.episode_uuid,
                episode_id=summary.episode_id,
                skipped=True,
            )
        out.append(summary)
    return out


def _committed(summaries: list[WriteSummary], writes: int) -> list[WriteSummary]:
    """The summaries of the episodes up to the first write that was not committed."""
    out: list[WriteSummary] = []
    for summary in summaries:
        if not summary.skipped:
            if writes == 0:
                break
            writes -= 1
        out.append(summary)
    return out
