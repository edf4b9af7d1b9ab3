"""``roles.Keys`` on Neo4j (``tidegraph/stores/keys.py``): one ``(:GroupKey {group_id,
key_id, secret, created_at})`` node per key (``created_at`` in microseconds since the epoch).
An erased key's node is deleted; its bytes may stay in Neo4j's store files and transaction
logs until they are reused or pruned (docs/operations.md "What a forget leaves behind")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from tidegraph.records.sealed import DataKey
from tidegraph.stores.executor import Tx
from tidegraph.stores.roles import Keys

if TYPE_CHECKING:
    from tidegraph.stores.neo4j.store import Neo4jStore

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Created with the first key a store adds (a group's keys are read by every micro-batch that
# holds its sealed records).
GROUP_KEY_INDEX = "CREATE INDEX group_key_group IF NOT EXISTS FOR (k:GroupKey) ON (k.group_id)"
GROUP_KEYS = (
    "MATCH (k:GroupKey {group_id: $group_id}) "
    "RETURN k.key_id AS key_id, k.secret AS secret, k.created_at AS created_at "
    "ORDER BY created_at, key_id"
)
ADD_GROUP_KEY = (
    "MERGE (k:GroupKey {group_id: $group_id, key_id: $key_id}) "
    "ON CREATE SET k.secret = $secret, k.created_at = $created_at"
)
ERASE_GROUP_KEYS = (
    "MATCH (k:GroupKey {group_id: $group_id}) DETACH DELETE k RETURN count(*) AS erased"
)


def _micros(at: datetime) -> int:
    return (at - _EPOCH) // timedelta(microseconds=1)


class Neo4jKeys(Keys):
    """``Keys`` over the Neo4j store's executor."""

    def __init__(self, store: Neo4jStore) -> None:
        self.store = store

    async def group_keys(self, group_id: str) -> list[DataKey]:
        rows = await self.store.ex.rows(GROUP_KEYS, {"group_id": group_id})
        return [
            DataKey(
                r["key_id"], bytes(r["secret"]), _EPOCH + timedelta(microseconds=r["created_at"])
            )
            for r in rows
        ]

    async def add_group_key(self, group_id: str, key: DataKey) -> None:
        params = {
            "group_id": group_id,
            "key_id": key.key_id,
            "secret": key.secret,
            "created_at": _micros(key.created_at),
        }

        async def work(tx: Tx) -> None:
            await tx.rows(ADD_GROUP_KEY, params)

        await self.store.ex.execute(GROUP_KEY_INDEX, {}, schema=True)
        await self.store.ex.write("add_group_key", 1, work)

    async def erase_group_keys(self, group_id: str) -> int:
        async def work(tx: Tx) -> int:
            [row] = await tx.rows(ERASE_GROUP_KEYS, {"group_id": group_id})
            return int(row["erased"])

        return await self.store.ex.write("erase_group_keys", 1, work)
