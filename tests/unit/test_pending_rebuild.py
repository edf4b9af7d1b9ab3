"""Episodes stored without extraction (docs/architecture.md "Episodes without an LLM"): rebuilding
their
envelope exactly, the chain's fallback, and which worker sweeps which group."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner

from tidegraph.llm.client import LLMError
from tidegraph.pipelines.pending import partition_of, rebuild_episode
from tidegraph.pipelines.retry import RetryPolicy
from tidegraph.pipelines.step_runner import run_step
from tidegraph.records.episode import Episode
from tidegraph.records.graph import EpisodeRecord

AT = datetime(2024, 3, 1, 9, 30, tzinfo=UTC)


def stored(episode: Episode) -> EpisodeRecord:
    """The record the write step stores for ``episode`` stored without extraction
    (``EpisodeRecord.of``, as tidegraph/processors/invalidation.py builds it)."""
    return EpisodeRecord.of(episode, not_extracted="no_llm")


@pytest.mark.parametrize(
    "fields",
    [
        {"source": "text", "content": "Ana moved to Lisbon"},
        {"source": "message", "content": "Ana: hi", "name": "chat 7"},
        {"source": "message", "content": "Ana: hi", "name": "m-1"},  # name == id
        {"source": "json", "content": {"b": [1, 2.5, None], "a": {"z": "é"}}},
        {"source": "text", "content": "x", "source_description": "support chat"},
    ],
)
def test_a_stored_episode_is_rebuilt_into_the_envelope_it_came_from(fields: dict) -> None:
    reference = (AT + timedelta(hours=2)).astimezone()  # any offset: stored in UTC
    episode = Episode(id="m-1", group_id="g", reference_time=reference, **fields)
    rebuilt = rebuild_episode(stored(episode))
    assert rebuilt.uuid == episode.uuid and rebuilt.content_hash == episode.content_hash


def test_a_record_that_cannot_be_rebuilt_exactly_is_refused() -> None:
    record = stored(Episode(id="m-1", group_id="g", source="text", content="a", reference_time=AT))
    record.content = "b"
    with pytest.raises(ValueError, match="cannot be rebuilt exactly"):
        rebuild_episode(record)


@pytest.mark.parametrize("group", ["acme", "tenant-07", "ü", "x" * 200])
def test_the_sweep_finds_a_groups_partition_as_the_producers_do(group: str) -> None:
    partitions = list(range(8))
    expected = DefaultPartitioner()(group.encode(), partitions, partitions)
    assert partition_of(group, 8) == expected


class FailingStep:
    stage = "extraction"

    def __init__(self, fallback_value: Any) -> None:
        self.value = fallback_value
        self.fallbacks: list[str] = []

    async def run(self, item: Any) -> Any:
        raise LLMError("the LLM is down", stage="extraction", kind="server", attempts=1)

    def fallback(self, item: Any, reason: str) -> Any:
        self.fallbacks.append(reason)
        return self.value


EPISODE = Episode(
    id="e-1", group_id="g", source="message", content="hi", reference_time=datetime.now(UTC)
)


async def test_the_chain_goes_on_with_a_steps_fallback_after_every_retry() -> None:
    step = FailingStep(fallback_value=21)
    policy = RetryPolicy(max_attempts=2, backoff=0.0, backoff_max=0.0)
    result = await run_step(step, "episode", EPISODE, policy=policy, budget=10)
    assert result.failure is None and result.value == 21
    assert step.fallbacks == ["llm_server"]


async def test_without_a_fallback_the_failure_stops_the_record() -> None:
    step = FailingStep(fallback_value=None)
    policy = RetryPolicy(max_attempts=2, backoff=0.0, backoff_max=0.0)
    result = await run_step(step, "episode", EPISODE, policy=policy, budget=10)
    assert result.failure is not None and result.failure.reason == "llm_server"
    assert result.failure.attempts == 2
