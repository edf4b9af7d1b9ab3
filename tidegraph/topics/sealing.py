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
from dataclasses import dataclass

from tidegraph.records import jsontext
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.sealed import SEALED, DataKey, seal, sealed_group, unseal
from tidegraph.settings import Settings
from tidegraph.stores.base import GraphStore
from tidegraph.stores.keys import sealing_key
from tidegraph.stores.roles import Keys


class Sealer:
    """Seals envelopes with their group's newest key (read once per group)."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self._keys: dict[str, DataKey] = {}

    async def seal(self, raw: bytes, group_id: str) -> bytes:
        """The envelope ``raw`` (a valid episode of ``group_id``) sealed."""
        key = self._keys.get(group_id)
        if key is None:
            key = self._keys[group_id] = await sealing_key(self.keys, group_id)
        return jsontext.dumps(seal(jsontext.loads(raw), key))


def sealer_for(settings: Settings, store: GraphStore | None) -> Sealer | None:
    """The sealer of a producer on ``store`` when ``TIDEGRAPH_ENCRYPT_EPISODES`` is on."""
    if settings.encrypt_episodes and store is not None:
        return Sealer(store.keys)
    return None


@dataclass(frozen=True)
class Opened:
    """A sealed record opened: what it seals, and the key that sealed it (which seals what
    the hop makes of it)."""

    value: bytes
    key: DataKey


def seal_hop(data: bytes, group_id: str, key: DataKey) -> bytes:
    """A record of the hop topic (``{prefix}.extracted``) sealed like an envelope of its
    group (no id: it is bound to the group alone); ``hop_value`` reads it back."""
    return jsontext.dumps(seal({"group_id": group_id, "content": data.decode()}, key))


def hop_value(opened: Opened) -> bytes:
    """The hop record a sealed one (``seal_hop``) holds."""
    content = jsontext.loads(opened.value).get("content")
    if not isinstance(content, str):
        raise InvalidEpisode("a sealed hop record holds no record", reason="seal_broken")
    return content.encode()


async def open_sealed(
    keys: Keys | None, values: Sequence[bytes | None]
) -> list[Opened | InvalidEpisode | None]:
    """For each consumed value: None when it is not sealed (it is read as it is), what it
    seals with its key, or why it cannot be opened (``key_erased``, ``seal_broken``). The
    keys are read from the store once per group, at every call: a key erased by a purge is
    never used again."""
    by_group: dict[str, dict[str, DataKey]] = {}
    opened: list[Opened | InvalidEpisode | None] = []
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
        if group not in by_group:
            found = await keys.group_keys(group) if keys is not None else []
            by_group[group] = {k.key_id: k for k in found}
        try:
            envelope = unseal(data, by_group[group])  # it names a key of the group's
            opened.append(Opened(jsontext.dumps(envelope), by_group[group][data[SEALED]["key"]]))
        except InvalidEpisode as exc:
            opened.append(exc)
    return opened
