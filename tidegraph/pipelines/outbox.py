"""The store's change outbox kept to its retention (docs/streaming.md "Change stream").

Every committed write appends its changes to its group's outbox; readers page through it
(``GET /v1/changes``, ``tidegraph changes``) and the workers' relay publishes it to
``{prefix}.changes``. A change is kept ``TIDEGRAPH_CHANGES_RETENTION_HOURS`` after it was
committed (a reader can catch up that far back) and, where a relay publishes the outbox, until
it has been published: ``prune_outbox`` drops the rest. The worker runs it for the groups it
relays; ``tidegraph serve`` for the groups it writes in-process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from tidegraph.metrics import CHANGES_PRUNED
from tidegraph.records.changes import Change, PublishedChange
from tidegraph.records.graph import ChangeLog
from tidegraph.records.times import utcnow

log = logging.getLogger(__name__)

PRUNE_EVERY_SECONDS = 600.0  # how often the worker and the server prune


class ChangeOutbox(Protocol):
    """What the change stream's readers, its relay (``streaming.relay``) and its retention
    read and write: a store's ``outbox`` (``tidegraph.stores.roles.Outbox`` says what each
    method does)."""

    async def changes(self, group_id: str, after: int, limit: int) -> list[Change]: ...

    async def change_logs(
        self, group_ids: list[str] | None = None, *, unpublished: bool = False, own: bool = False
    ) -> list[ChangeLog]: ...

    async def unpublished_changes(
        self, group_ids: list[str], per_group: int
    ) -> list[PublishedChange]: ...

    async def mark_published(self, acknowledged: Sequence[PublishedChange]) -> None: ...

    async def prune_changes(
        self, group_id: str, before: datetime, *, published_only: bool = True
    ) -> int: ...


async def prune_outbox(
    outbox: ChangeOutbox,
    groups: Iterable[str],
    retention_hours: float,
    *,
    published_only: bool,
    now: datetime | None = None,
) -> int:
    """Drop the changes of ``groups`` committed more than ``retention_hours`` ago
    (``published_only``: and published by the relay); how many went. A retention of 0 keeps
    every change."""
    if retention_hours <= 0:
        return 0
    before = (now or utcnow()) - timedelta(hours=retention_hours)
    pruned = 0
    for group_id in groups:
        pruned += await outbox.prune_changes(group_id, before, published_only=published_only)
    if pruned:
        CHANGES_PRUNED.inc(pruned)
        log.info("outbox pruned changes=%d before=%s", pruned, before.isoformat())
    return pruned
