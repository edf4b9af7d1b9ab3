"""Episodes sealed with their group's data key, so that forgetting a group with ``purge``
makes its records on the input topic unreadable without rewriting the topic
(crypto-shredding; docs/streaming.md "Sealed episodes").

A sealed envelope keeps in clear what routing and idempotency need (``id``, ``group_id``,
``source``, ``reference_time``: the key, the episode uuid, the partition) and holds the rest
(``content``, ``name``, ``source_description``: what the episode says) in ``sealed``:

    {"id": "chat-1", "group_id": "acme", "source": "message", "reference_time": "…",
     "sealed": {"key": "<key id>", "nonce": "<base64>", "data": "<base64>"}}

``data`` is the JSON object of the sealed fields encrypted with AES-256-GCM (the
``cryptography`` package's ``AESGCM``) under the group's data key ``key``, with the group and
the id as associated data: a sealed body moved to another group or episode does not open.
A group may have several keys (rotation: the newest seals, any opens); a record whose key
is gone (the group was purged) or whose body does not open is refused with a dead-letter
reason (``key_erased``, ``seal_broken``), never with its content.
"""

from __future__ import annotations

import base64
import binascii
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tidegraph.records.errors import InvalidEpisode

SEALED = "sealed"
SEALED_FIELDS = ("content", "name", "source_description")
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # GCM's standard nonce, random per record


@dataclass(frozen=True)
class DataKey:
    """One data key of a group: its id (named by the records it sealed), the secret and
    when it was made (the newest seals)."""

    key_id: str
    secret: bytes
    created_at: datetime


def new_key(now: datetime) -> DataKey:
    """A fresh random key."""
    return DataKey(uuid.uuid4().hex, AESGCM.generate_key(bit_length=KEY_BYTES * 8), now)


def newest(keys: list[DataKey]) -> DataKey | None:
    return max(keys, key=lambda k: (k.created_at, k.key_id)) if keys else None


def sealed_group(envelope: Any) -> str | None:
    """The group of a sealed envelope (None: not sealed, or no group to look a key up by)."""
    if not isinstance(envelope, dict) or SEALED not in envelope:
        return None
    group = envelope.get("group_id")
    return group if isinstance(group, str) and group else ""


def is_sealed(value: bytes | None) -> bool:
    """Whether a consumed record is a sealed envelope."""
    if not value or b'"sealed"' not in value:
        return False
    try:
        return sealed_group(orjson.loads(value)) is not None
    except orjson.JSONDecodeError:
        return False


def _associated(envelope: Mapping[str, Any]) -> bytes:
    return orjson.dumps([envelope.get("group_id"), envelope.get("id")])


def seal(envelope: Mapping[str, Any], key: DataKey) -> dict[str, Any]:
    """``envelope`` with its sealed fields encrypted under ``key``."""
    body = {f: envelope[f] for f in SEALED_FIELDS if f in envelope}
    nonce = os.urandom(NONCE_BYTES)
    data = AESGCM(key.secret).encrypt(nonce, orjson.dumps(body), _associated(envelope))
    sealed = {k: v for k, v in envelope.items() if k not in SEALED_FIELDS}
    sealed[SEALED] = {
        "key": key.key_id,
        "nonce": base64.b64encode(nonce).decode(),
        "data": base64.b64encode(data).decode(),
    }
    return sealed


def unseal(envelope: Mapping[str, Any], keys: Mapping[str, DataKey]) -> dict[str, Any]:
    """The envelope as it was produced; ``InvalidEpisode`` (``key_erased``: its key is not
    among ``keys``; ``seal_broken``: its body does not open with it)."""
    sealed = envelope.get(SEALED)
    if not isinstance(sealed, dict) or not isinstance(sealed.get("key"), str):
        raise InvalidEpisode("sealed: not an object naming its key", reason="seal_broken")
    key = keys.get(sealed["key"])
    if key is None:
        raise InvalidEpisode(
            f"the data key {sealed['key']} of group {envelope.get('group_id')!r} is erased (the "
            "group was forgotten with purge): this record can no longer be read",
            reason="key_erased",
        )
    try:
        nonce = base64.b64decode(str(sealed.get("nonce")), validate=True)
        data = base64.b64decode(str(sealed.get("data")), validate=True)
        body = orjson.loads(AESGCM(key.secret).decrypt(nonce, data, _associated(envelope)))
    except (InvalidTag, ValueError, binascii.Error, orjson.JSONDecodeError):
        raise InvalidEpisode(
            f"sealed: the body does not open with key {key.key_id} of its group (altered, or "
            "moved from another group or episode)",
            reason="seal_broken",
        ) from None
    if not isinstance(body, dict):
        raise InvalidEpisode("sealed: the body is not an object", reason="seal_broken")
    opened = {k: v for k, v in envelope.items() if k != SEALED}
    opened.update({f: body[f] for f in SEALED_FIELDS if f in body})
    return opened
