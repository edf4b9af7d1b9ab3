"""The change stream's relay: what the graph's writes committed to their group's outbox,
produced to ``{prefix}.changes`` (docs/streaming.md "Change stream").

A write records its changes in the store in the same transaction as the graph (the outbox),
so a change that was not committed is never published, and one committed is never lost: the
relay publishes a group's changes after its cursor (``ChangeLog.published``), in ``seq``
order, waits for Kafka to acknowledge them, then moves the cursor. A worker killed between the
produce and the cursor's move publishes those changes again: consumers drop what they have
seen by ``change_id`` (each change also carries its ``seq``, the group's commit order). Each
worker relays the groups of the input partitions it owns, as its pending sweep does.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from tidegraph.metrics import CHANGES_BEHIND, CHANGES_PUBLISHED
from tidegraph.pipelines.pending import partition_of
from tidegraph.stores.base import GraphStore

log = logging.getLogger(__name__)

# Produce one change (key, value) and give what resolves once Kafka acknowledged it.
Send = Callable[[bytes, bytes], Awaitable[Awaitable[object]]]


async def relay_changes(
    store: GraphStore, send: Send, owned: set[int], partitions: int, batch: int = 500
) -> int:
    """Publish the unpublished changes of the groups on ``owned`` input partitions; how many
    were published."""
    logs = [
        log_
        for log_ in await store.change_logs(unpublished=True)
        if partition_of(log_.group_id, partitions) in owned
    ]
    # Set before publishing, so a round that fails (broker down) still shows the backlog.
    behind = sum(log_.seq - log_.published for log_ in logs)
    CHANGES_BEHIND.set(behind)
    published = 0
    for log_ in logs:
        cursor = log_.published
        key = log_.group_id.encode()
        while cursor < log_.seq:
            changes = await store.changes(log_.group_id, cursor, batch)
            if not changes:  # the rest were purged by a forget: nothing left to publish
                await store.mark_published(log_.group_id, log_.seq)
                cursor = log_.seq
                break
            deliveries = [await send(key, change.model_dump_json().encode()) for change in changes]
            for delivery in deliveries:
                await delivery
            cursor = changes[-1].seq
            await store.mark_published(log_.group_id, cursor)
            CHANGES_PUBLISHED.inc(len(changes))
            published += len(changes)
        behind -= log_.seq - log_.published
        CHANGES_BEHIND.set(behind)
    return published
