"""Sealed episodes on the input topic (``tidegraph.records.sealed``; docs/streaming.md
"Sealed episodes"): ``Sealer`` seals what tidegraph's own producers write when
``TIDEGRAPH_ENCRYPT_EPISODES`` is on (``produce_lines``: ``tidegraph produce``, ``ingest --via
kafka``, the Memory API, HTTP and MCP writes through Kafka; the worker's pending sweep), and
``open_sealed`` opens them at the start of the chain (the extraction hop), with the keys the
store holds (``tidegraph/stores/keys.py``). Records of other producers are not sealed and
pass through as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidegraph.records import jsontext
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.sealed import DataKey, seal, sealed_group, unseal
from tidegraph.settings import Settings
from tidegraph.stores.keys import GroupKeys, sealing_key


class Sealer:
    """Seals envelopes with their group's newest key (read once per group)."""

    def __init__(self, store: GroupKeys) -> None:
        self.store = store
        self._keys: dict[str, DataKey] = {}

    async def seal(self, raw: bytes, group_id: str) -> bytes:
        """The envelope ``raw`` (a valid episode of ``group_id``) sealed."""
        key = self._keys.get(group_id)
        if key is None:
            key = self._keys[group_id] = await sealing_key(self.store, group_id)
        return jsontext.dumps(seal(jsontext.loads(raw), key))


def sealer_for(settings: Settings, store: object) -> Sealer | None:
    """The sealer of a producer on ``store`` when ``TIDEGRAPH_ENCRYPT_EPISODES`` is on."""
    if settings.encrypt_episodes and isinstance(store, GroupKeys):
        return Sealer(store)
    return None


async def open_sealed(
    store: GroupKeys | None, values: Sequence[bytes | None]
) -> list[bytes | InvalidEpisode | None]:
    """For each consumed value: None when it is not sealed (it is read as it is), the
    envelope it seals, or why it cannot be opened (``key_erased``, ``seal_broken``). The
    keys are read from the store once per group, at every call: a key erased by a purge is
    never used again."""
    keys: dict[str, dict[str, DataKey]] = {}
    opened: list[bytes | InvalidEpisode | None] = []
    for value in values:
        try:
            data = jsontext.loads(value) if value and b'"sealed"' in value else None
        except ValueError:
            data = None  # not JSON: the envelope checks say why
        group = sealed_group(data)
        if group is None or data is None:
            opened.append(None)
            continue
        if not group:
            opened.append(InvalidEpisode("a sealed record names no group_id", reason="seal_broken"))
            continue
        if group not in keys:
            found = await store.group_keys(group) if store is not None else []
            keys[group] = {k.key_id: k for k in found}
        try:
            opened.append(jsontext.dumps(unseal(data, keys[group])))
        except InvalidEpisode as exc:
            opened.append(exc)
    return opened
