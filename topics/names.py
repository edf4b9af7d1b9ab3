"""Topic names: every tidegraph topic lives under one prefix (``TIDEGRAPH_TOPIC_PREFIX``).

All topics are keyed by ``group_id`` and have the same partition count, so a group's records
sit on the same partition number of every topic and Faust's co-partitioned assignor keeps the
whole chain of a group on one worker.
"""

from __future__ import annotations

from dataclasses import dataclass

# The stages in chain order; each consumes the topic named after the previous hop.
STAGES = ("extraction", "resolution", "temporal", "invalidation")


@dataclass(frozen=True)
class TopicNames:
    prefix: str

    @property
    def episodes(self) -> str:
        """Input: episode envelopes as produced (raw JSON)."""
        return f"{self.prefix}.episodes"

    @property
    def extracted(self) -> str:
        """extraction -> resolution."""
        return f"{self.prefix}.extracted"

    @property
    def resolved(self) -> str:
        """resolution -> temporal."""
        return f"{self.prefix}.resolved"

    @property
    def stamped(self) -> str:
        """temporal -> invalidation + write."""
        return f"{self.prefix}.stamped"

    @property
    def entities_new(self) -> str:
        """Entities an episode created, for the community processor."""
        return f"{self.prefix}.entities.new"

    @property
    def dlq(self) -> str:
        """Dead letters of every stage."""
        return f"{self.prefix}.dlq"

    def all(self) -> list[str]:
        return [
            self.episodes,
            self.extracted,
            self.resolved,
            self.stamped,
            self.entities_new,
            self.dlq,
        ]

    def input_of(self, stage: str) -> str:
        """The topic a stage consumes."""
        return {
            "extraction": self.episodes,
            "resolution": self.extracted,
            "temporal": self.resolved,
            "invalidation": self.stamped,
        }[stage]
