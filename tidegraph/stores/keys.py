"""The groups' data keys that seal their episodes on the input topic (crypto-shredding:
``tidegraph.records.sealed``, docs/streaming.md "Sealed episodes"), held in the graph store
beside the group's graph: ``forget --all --purge`` erases them, and the records they sealed
can no longer be read.

Every store holds them as its ``keys`` role (``roles.Keys``: ``sqlite/keys.py``,
``neo4j/keys.py``, ``memory/keys.py``). ``sealing_key`` is the key a producer seals with (the
group's newest, made at first use), ``rotate_key`` adds a newer one; older keys stay until
the group is purged, so the records they sealed still open.
"""

from __future__ import annotations

from tidegraph.records.sealed import DataKey, new_key, newest
from tidegraph.records.times import utcnow
from tidegraph.stores.roles import Keys


async def sealing_key(keys: Keys, group_id: str) -> DataKey:
    """The group's newest key; a new one when it has none. Two producers that make one at
    once each keep theirs: a record names its key, so both open."""
    found = newest(await keys.group_keys(group_id))
    if found is not None:
        return found
    key = new_key(utcnow())
    await keys.add_group_key(group_id, key)
    return key


async def rotate_key(keys: Keys, group_id: str) -> DataKey:
    """A new key for the group: the records produced from now on are sealed with it; the
    older keys stay, so what they sealed still opens, until the group is purged."""
    key = new_key(utcnow())
    await keys.add_group_key(group_id, key)
    return key
