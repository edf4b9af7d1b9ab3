"""Where a keyed record goes: Kafka's default partitioner, its hash remembered per key.

Every topic of the topology is keyed by group id, and a worker produces several records per
episode (the hop's record, and with the change stream about three changes), all with keys of
a few groups. aiokafka's ``DefaultPartitioner`` hashes each key again in pure Python (murmur2,
about 10-20 µs a record on the development machine); ``KeyPartitioner`` gives the same
partition from the hash it keeps for the key (docs/performance.md "Change stream").
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from aiokafka.partitioner import murmur2

MAX_KEYS = 100_000  # hashes kept; past it they are forgotten at once and kept again as used


def key_hash(key: bytes) -> int:
    """Kafka's default partitioner's hash of ``key`` (murmur2, positive, as Java clients)."""
    return int(murmur2(key)) & 0x7FFFFFFF


class KeyPartitioner:
    """``DefaultPartitioner``'s partition for every key (a record without a key goes to a
    random available partition, as there), the key's hash computed once. A producer's
    ``partitioner``: called with the key's bytes, the topic's partitions sorted by id, and the
    available ones."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.max_keys = max_keys
        self._hashes: dict[bytes, int] = {}

    def __call__(
        self, key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]
    ) -> int:
        if key is None:
            return random.choice(available or all_partitions)
        hashed = self._hashes.get(key)
        if hashed is None:
            if len(self._hashes) >= self.max_keys:
                self._hashes.clear()
            hashed = self._hashes[key] = key_hash(key)
        return all_partitions[hashed % len(all_partitions)]
