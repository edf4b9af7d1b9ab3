"""Extraction context that includes the group's episodes still in flight.

Extraction gives the LLM the group's previous episodes as context. In-process those are
already written when the next episode is extracted; in the topology an earlier episode may
still be between extraction and the writer. This source merges the store's episodes with the
ones this worker extracted recently (a group lives on one partition, hence one worker), so the
prompt is the same as in-process. After a rebalance the new owner starts with the store only.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from datetime import datetime
from typing import TYPE_CHECKING

from tidegraph.records.episode import Episode
from tidegraph.records.graph import EpisodeRecord
from tidegraph.records.times import utc

if TYPE_CHECKING:
    from tidegraph.processors.steps import ExtractionStore


class RecentEpisodes:
    """Stored episodes + recently extracted ones, for extraction's prompt."""

    def __init__(self, store: ExtractionStore, *, per_group: int = 16, max_groups: int = 10_000):
        self.store = store
        self.per_group = per_group
        self.max_groups = max_groups
        self._groups: OrderedDict[str, deque[Episode]] = OrderedDict()

    def remember(self, episode: Episode) -> None:
        """Keep ``episode`` as it is: its record (its content as text) is made only when a
        prompt reads it (``merged``), not for every mapped record that never meets one."""
        if self.per_group <= 0:
            return
        recent = self._groups.pop(episode.group_id, None)
        if recent is None:
            recent = deque(maxlen=self.per_group)
        uuid = episode.uuid
        if all(r.uuid != uuid for r in recent):
            recent.append(episode)
        self._groups[episode.group_id] = recent
        while len(self._groups) > self.max_groups:
            self._groups.popitem(last=False)

    def forget_all(self) -> None:
        """Drop what this worker remembers (its partitions were revoked)."""
        self._groups.clear()

    def merged(
        self, group_id: str, before: datetime, limit: int, stored: list[EpisodeRecord]
    ) -> list[EpisodeRecord]:
        """The ``limit`` latest episodes before ``before``: the store's answer ``stored``
        (``GraphStore.recent_episodes``, read earlier, maybe with other reads) merged with
        the remembered episodes as they are now."""
        if limit <= 0:
            return []
        merged = {r.uuid: r for r in stored}
        cutoff = utc(before)
        for episode in self._groups.get(group_id, ()):
            if episode.reference_time < cutoff and episode.uuid not in merged:
                merged[episode.uuid] = EpisodeRecord.of(episode)
        ordered = sorted(merged.values(), key=lambda r: (r.valid_at, r.uuid))
        return ordered[-limit:]
