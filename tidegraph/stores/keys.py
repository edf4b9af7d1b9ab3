"""The groups' data keys that seal their episodes on the input topic (crypto-shredding:
``tidegraph.records.sealed``, docs/streaming.md "Sealed episodes"), held in the graph store
beside the group's graph: ``forget --all --purge`` erases them, and the records they sealed
can no longer be read.

Every store implements ``GroupKeys`` (a mixin of its own: ``sqlite/keys.py``,
``neo4j/keys.py``, ``memory/keys.py``). ``sealing_key`` is the key a producer seals with (the
group's newest, made at first use), ``rotate_key`` adds a newer one; older keys stay until
the group is purged, so the records they sealed still open.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tidegraph.records.sealed import DataKey, new_key, newest
from tidegraph.records.times import utcnow


@runtime_checkable
class GroupKeys(Protocol):
    async def group_keys(self, group_id: str) -> list[DataKey]:
        """The group's keys, oldest first."""
        ...

    async def add_group_key(self, group_id: str, key: DataKey) -> None:
        """Keep ``key`` for the group (a key id already kept is left as it is)."""
        ...

    async def erase_group_keys(self, group_id: str) -> int:
        """Erase every key of the group; how many there were."""
        ...


async def sealing_key(store: GroupKeys, group_id: str) -> DataKey:
    """The group's newest key; a new one when it has none. Two producers that make one at
    once each keep theirs: a record names its key, so both open."""
    found = newest(await store.group_keys(group_id))
    if found is not None:
        return found
    key = new_key(utcnow())
    await store.add_group_key(group_id, key)
    return key


async def rotate_key(store: GroupKeys, group_id: str) -> DataKey:
    """A new key for the group: the records produced from now on are sealed with it; the
    older keys stay, so what they sealed still opens, until the group is purged."""
    key = new_key(utcnow())
    await store.add_group_key(group_id, key)
    return key
