"""Ingesting in one process (``tidegraph ingest``, the demo, benchmarks): a file's episodes
through the group runner, each group in order, groups in parallel, with a report.

A record that is not an episode is reported with its reason at once; a failing episode is
reported with the stage and reason its dead letter would carry, and its group goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tidegraph.pipelines.runner import GroupRunner
from tidegraph.records.episode import Episode, parse_episode
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.outcome import Failure, Outcome
from tidegraph.records.stages import WriteSummary


@dataclass(frozen=True)
class FailedRecord:
    """A record that could not be ingested: its ``failure``, the record (the raw line, or the
    episode as JSON) and where it came from."""

    failure: Failure
    record: Any
    group_id: str | None = None
    episode_id: str | None = None
    line: int | None = None  # the line of the input file, when read from one

    @classmethod
    def of(cls, outcome: Outcome[Any]) -> FailedRecord:
        assert outcome.failure is not None
        episode = outcome.episode
        return cls(outcome.failure, episode.model_dump(mode="json"), episode.group_id, episode.id)

    def as_json(self) -> dict[str, Any]:
        f = self.failure
        return {
            "line": self.line,
            "stage": f.stage,
            "reason": f.reason,
            "group_id": self.group_id,
            "episode_id": self.episode_id,
            "error_class": f.error_class,
            "message": f.message,
            "attempts": f.attempts,
            "record": self.record,
        }


@dataclass
class IngestReport:
    episodes: int = 0
    already_processed: int = 0
    not_extracted: int = 0  # stored, searchable, extraction deferred (``deferred`` outcomes)
    entities_new: int = 0
    facts_new: int = 0
    facts_merged: int = 0
    facts_closed: int = 0
    facts_born_closed: int = 0
    llm_calls: int = 0
    seconds: float = 0.0
    failures: list[FailedRecord] = field(default_factory=list)

    def add(self, outcome: Outcome[WriteSummary]) -> None:
        if outcome.failure is not None:
            self.failures.append(FailedRecord.of(outcome))
            return
        self.episodes += 1
        if outcome.not_extracted is not None:
            self.not_extracted += 1
        if outcome.processed or outcome.value is None:
            self.already_processed += 1
            return
        summary = outcome.value
        self.entities_new += summary.entities_new
        self.facts_new += summary.facts_new
        self.facts_merged += summary.facts_merged
        self.facts_closed += summary.facts_closed
        self.facts_born_closed += summary.facts_born_closed
        self.llm_calls += summary.llm_calls

    @property
    def written(self) -> int:
        return self.episodes - self.already_processed

    def line(self) -> str:
        deferred = f" ({self.not_extracted} not extracted)" if self.not_extracted else ""
        return (
            f"{self.episodes} episodes ({self.already_processed} already processed){deferred}, "
            f"{self.entities_new} new entities, "
            f"{self.facts_new} new facts, {self.facts_merged} merged, "
            f"{self.facts_closed + self.facts_born_closed} invalidations "
            f"({self.facts_born_closed} born closed), {self.llm_calls} LLM calls, "
            f"{len(self.failures)} failed, {self.seconds:.1f}s"
        )


def read_jsonl(lines: Iterable[bytes | str]) -> tuple[list[Episode], list[FailedRecord]]:
    """The valid episodes of a file's lines, and a failure (with its reason) for each line
    that is not one; blank lines are skipped."""
    episodes: list[Episode] = []
    failures: list[FailedRecord] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            episodes.append(parse_episode(line))
        except InvalidEpisode as exc:
            text = line.decode(errors="replace") if isinstance(line, bytes) else line
            failure = Failure("validation", exc.reason, type(exc).__name__, f"line {n}: {exc}")
            failures.append(FailedRecord(failure, text.strip(), line=n))
    return episodes, failures


async def ingest(
    runner: GroupRunner,
    episodes: list[Episode],
    *,
    concurrency: int = 8,
    on_done: Callable[[Outcome[WriteSummary]], None] | None = None,
) -> IngestReport:
    """Process episodes in order within each group, up to ``concurrency`` groups at once. A
    failing episode is reported with its reason and its group goes on with the next one."""
    report = IngestReport()
    started = time.perf_counter()
    by_group: dict[str, list[Episode]] = {}
    for episode in episodes:
        by_group.setdefault(episode.group_id, []).append(episode)
    gate = asyncio.Semaphore(concurrency)

    def done(outcome: Outcome[WriteSummary]) -> None:
        report.add(outcome)
        if on_done is not None:
            on_done(outcome)

    async def run_group(items: list[Episode]) -> None:
        async with gate:
            await runner.run(items, done)

    await asyncio.gather(*(run_group(items) for items in by_group.values()))
    report.seconds = time.perf_counter() - started
    return report
