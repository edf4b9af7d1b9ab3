"""Topic names: every tidegraph topic lives under one prefix (``TIDEGRAPH_TOPIC_PREFIX``).

All topics are keyed by ``group_id`` and have the same partition count, so a group's records
sit on the same partition number of every topic and Faust's co-partitioned assignor keeps the
whole chain of a group on one worker.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TopicNames:
    prefix: str

    @property
    def episodes(self) -> str:
        """Input: episode envelopes as produced (raw JSON)."""
        return f"{self.prefix}.episodes"

    @property
    def extracted(self) -> str:
        """The extraction hop -> the write hop (resolution, temporal, invalidation)."""
        return f"{self.prefix}.extracted"

    @property
    def entities_new(self) -> str:
        """Entities an episode created, for the community processor."""
        return f"{self.prefix}.entities.new"

    @property
    def dlq(self) -> str:
        """Dead letters of every stage."""
        return f"{self.prefix}.dlq"

    @property
    def changes(self) -> str:
        """What changed in the graph, in commit order per group (the change stream)."""
        return f"{self.prefix}.changes"

    def all(self) -> list[str]:
        return [self.episodes, self.extracted, self.entities_new, self.dlq, self.changes]

    def named(self, topic: str) -> str:
        """A topic's full name from its short one (``extracted``: ``<prefix>.extracted``)."""
        return {"episodes": self.episodes, "extracted": self.extracted,
                "entities.new": self.entities_new, "dlq": self.dlq,
                "changes": self.changes}[topic]  # fmt: skip
