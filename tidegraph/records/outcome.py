"""What became of one episode: the one value every way of running the chain answers with.

The group runner (``tidegraph.pipelines.runner``) gives one ``Outcome`` per episode, in the
group's order; the Kafka hops turn it into their output record or a dead letter, ``tidegraph
ingest`` into its report, the HTTP and MCP servers into their answer. ``Failure`` is the one
description of a failed record: the stage, the dead-letter reason (one of
``tidegraph.processors.failures.REASONS``), the error and how many attempts were made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from tidegraph.records.episode import Episode
from tidegraph.records.stages import Extraction, WriteSummary

T = TypeVar("T", Extraction, WriteSummary)

# written: in the graph, extracted; deferred: stored and searchable, its extraction deferred
# (``not_extracted`` says why); processed: it was already (a redelivery, a replay: nothing
# changed); extracted: the extraction hop's value, not written yet; failed: ``failure`` says
# where and why.
Status = Literal["written", "deferred", "processed", "extracted", "failed"]


@dataclass(frozen=True)
class Failure:
    """Why a record failed: where, the dead-letter reason, the error, the attempts made."""

    stage: str
    reason: str
    error_class: str
    message: str
    attempts: int = 1

    @classmethod
    def of(cls, stage: str, error: BaseException, reason: str, attempts: int = 1) -> Failure:
        return cls(stage, reason, type(error).__name__, str(error), attempts)

    def line(self) -> str:
        return f"{self.stage}: {self.reason}: {self.error_class}: {self.message}"


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """One episode's outcome: its ``value`` (the extraction, or the write's summary), or
    ``processed`` (nothing to do; ``created_entities``: the entities its earlier write created,
    so that their events can be sent again; ``unextracted``: it is stored without extraction
    and still is, and why), or its ``failure``."""

    episode: Episode
    value: T | None = None
    processed: bool = False
    created_entities: list[str] = field(default_factory=list)
    unextracted: str | None = None
    failure: Failure | None = None

    @property
    def not_extracted(self) -> str | None:
        """Why the episode is stored without extraction (None: extracted, or failed)."""
        if isinstance(self.value, WriteSummary):
            return self.value.not_extracted
        return self.unextracted

    @property
    def status(self) -> Status:
        if self.failure is not None:
            return "failed"
        if self.processed:
            return "processed"
        if isinstance(self.value, WriteSummary):
            return "written" if self.value.not_extracted is None else "deferred"
        return "extracted"

    @property
    def ok(self) -> bool:
        return self.failure is None

    @classmethod
    def failed(cls, episode: Episode, failure: Failure) -> Outcome[T]:
        return cls(episode, failure=failure)

    @classmethod
    def already(
        cls, episode: Episode, created_entities: list[str], unextracted: str | None = None
    ) -> Outcome[T]:
        return cls(
            episode,
            processed=True,
            created_entities=list(created_entities),
            unextracted=unextracted,
        )
