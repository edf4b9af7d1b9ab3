"""``roles.Keys`` in a dictionary (``tidegraph/stores/keys.py``), for the in-memory store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidegraph.records.sealed import DataKey
from tidegraph.stores.roles import Keys

if TYPE_CHECKING:
    from tidegraph.stores.memory.store import MemoryStore


class MemoryKeys(Keys):
    """``Keys`` in a dictionary of the in-memory store's."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self._group_keys: dict[str, dict[str, DataKey]] = {}

    def _keys_of(self, group_id: str) -> dict[str, DataKey]:
        return self._group_keys.setdefault(group_id, {})

    async def group_keys(self, group_id: str) -> list[DataKey]:
        return sorted(self._keys_of(group_id).values(), key=lambda k: (k.created_at, k.key_id))

    async def add_group_key(self, group_id: str, key: DataKey) -> None:
        self._keys_of(group_id).setdefault(key.key_id, key)

    async def erase_group_keys(self, group_id: str) -> int:
        keys = self._keys_of(group_id)
        erased = len(keys)
        keys.clear()
        return erased
