"""The change stream's relay: what the graph's writes committed to their group's outbox,
produced to ``{prefix}.changes`` (docs/streaming.md "Change stream").

A write records its changes in the store in the same transaction as the graph (the outbox),
so a change that was not committed is never published, and one committed is never lost: the
relay publishes each group's changes after its cursor (``ChangeLog.published``), in ``seq``
order, waits for Kafka to acknowledge them, then moves the cursors, each only as far as its
group's last acknowledged change. A read that finds no change after a cursor moves nothing
(a store may show a group's log before the changes committed with it; where changes are
dropped unpublished, the store moves the cursor past them in that transaction). A worker
killed between the produce and the cursor's move publishes those changes again: consumers
drop what they have seen by ``change_id`` (each change also carries its ``seq``, the group's
commit order). Each worker relays the groups of its deployment (``GraphStore.deployment``,
its topic prefix) on the input partitions it owns, as its pending sweep does.

A round that fails raises what failed: the store's own error (a store outage is one the
failure classification calls ``store_unavailable``), or the first failed acknowledgement
(the cursors of the others moved first).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from tidegraph.metrics import CHANGES_BEHIND, CHANGES_PUBLISHED
from tidegraph.pipelines.outbox import ChangeOutbox
from tidegraph.pipelines.pending import partition_of
from tidegraph.records.changes import PublishedChange

log = logging.getLogger(__name__)

# Produce one change (key, value) and give what resolves once Kafka acknowledged it.
Send = Callable[[bytes, bytes], Awaitable[Awaitable[object]]]


async def relay_changes(
    outbox: ChangeOutbox, send: Send, owned: set[int], partitions: int, batch: int = 500
) -> int:
    """Publish the unpublished changes of the deployment's groups on ``owned`` input
    partitions, up to ``batch`` per group; how many were published. A round is two reads and
    one write, whatever the number of groups: the outbox's state, the changes, the cursors
    (each moved only past its group's changes Kafka acknowledged)."""
    logs = {
        log_.group_id: log_
        for log_ in await outbox.change_logs(unpublished=True, own=True)
        if partition_of(log_.group_id, partitions) in owned
    }
    # Set before publishing, so a round that fails (broker down) still shows the backlog.
    behind = sum(log_.seq - log_.published for log_ in logs.values())
    CHANGES_BEHIND.set(behind)
    if not logs:
        return 0
    changes = await outbox.unpublished_changes(list(logs), batch)
    # As stored: the outbox keeps each change's JSON, published without decoding it.
    deliveries = [await send(change.group_id.encode(), change.value) for change in changes]
    # Kafka acknowledges a partition's records in order: each group's cursor moves to its
    # last acknowledged change; one that failed stops its group there (the next round sends
    # the rest again), the others still move.
    acked: dict[str, PublishedChange] = {}
    failed: dict[str, BaseException] = {}
    for change, delivery in zip(changes, deliveries, strict=True):
        try:
            await delivery
        except Exception as exc:  # noqa: BLE001 - raised below, once every cursor is kept
            failed.setdefault(change.group_id, exc)
            continue
        if change.group_id not in failed:
            acked[change.group_id] = change
    await outbox.mark_published(list(acked.values()))
    last = {group: change.seq for group, change in acked.items()}
    published = sum(1 for change in changes if change.seq <= last.get(change.group_id, 0))
    CHANGES_PUBLISHED.inc(published)
    CHANGES_BEHIND.set(
        behind - sum(min(seq, logs[g].seq) - logs[g].published for g, seq in last.items())
    )
    if failed:
        raise next(iter(failed.values()))
    return published
