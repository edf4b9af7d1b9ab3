"""Sealed episodes (tidegraph/records/sealed.py, docs/streaming.md "Sealed episodes"): what
stays in clear, what a sealed record reveals of its content (nothing), and why one that does
not open is refused."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from tidegraph.records.episode import parse_episode
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.sealed import is_sealed, new_key, newest, seal, unseal
from tidegraph.stores.memory.store import MemoryStore
from tidegraph.stores.sqlite.store import SqliteStore
from tidegraph.topics.sealing import Opened, Sealer, hop_value, open_sealed, seal_hop

AT = datetime(2026, 1, 1, tzinfo=UTC)
ENVELOPE = {
    "id": "chat-7",
    "group_id": "acme",
    "source": "message",
    "name": "Zephyrine on ticket 7",
    "source_description": "Zendesk ticket NW-1077",
    "content": "Zephyrine Quillfeather: call me on +44 7700 900461",
    "reference_time": "2025-10-01T09:00:00Z",
}


def test_a_sealed_envelope_keeps_routing_in_clear_and_nothing_of_the_content() -> None:
    key = new_key(AT)
    sealed = seal(ENVELOPE, key)
    assert {k: sealed[k] for k in ("id", "group_id", "source", "reference_time")} == {
        k: ENVELOPE[k] for k in ("id", "group_id", "source", "reference_time")
    }
    raw = orjson.dumps(sealed)
    assert b"Zephyrine" not in raw and b"900461" not in raw and b"Zendesk" not in raw
    assert is_sealed(raw) and not is_sealed(orjson.dumps(ENVELOPE))
    assert unseal(sealed, {key.key_id: key}) == ENVELOPE
    # The same episode, whoever opens it: the uuid and content hash are the producer's.
    opened = parse_episode(orjson.dumps(unseal(sealed, {key.key_id: key})))
    assert opened == parse_episode(orjson.dumps(ENVELOPE))


def test_a_record_whose_key_is_erased_or_whose_body_moved_does_not_open() -> None:
    key, other = new_key(AT), new_key(AT)
    sealed = seal(ENVELOPE, key)
    with pytest.raises(InvalidEpisode) as erased:
        unseal(sealed, {other.key_id: other})
    assert erased.value.reason == "key_erased" and "Zephyrine" not in str(erased.value)
    moved = {**sealed, "group_id": "globex"}  # the body moved to another tenant
    with pytest.raises(InvalidEpisode) as broken:
        unseal(moved, {key.key_id: key})
    assert broken.value.reason == "seal_broken"
    renamed = {**sealed, "id": "chat-8"}
    with pytest.raises(InvalidEpisode, match="does not open"):
        unseal(renamed, {key.key_id: key})


def test_the_newest_key_seals_and_every_kept_key_opens() -> None:
    old, new = new_key(AT), new_key(AT + timedelta(days=1))
    assert newest([new, old]) == new
    keys = {k.key_id: k for k in (old, new)}
    assert unseal(seal(ENVELOPE, old), keys) == unseal(seal(ENVELOPE, new), keys) == ENVELOPE


async def test_a_producer_seals_and_a_purge_leaves_its_records_unreadable() -> None:
    store = MemoryStore()
    raw = orjson.dumps(ENVELOPE)
    sealed = await Sealer(store.keys).seal(raw, "acme")
    plain = orjson.dumps({**ENVELOPE, "group_id": "globex", "id": "other"})
    [opened, untouched] = await open_sealed(store.keys, [sealed, plain])
    assert isinstance(opened, Opened) and orjson.loads(opened.value) == ENVELOPE
    assert untouched is None  # another producer's record is read as it is
    # What the extraction hop makes of it is sealed with the same key, and opens again.
    hop = b'{"v":1,"extraction":{"said":"Zephyrine Quillfeather"}}'
    sealed_hop = seal_hop(hop, "acme", opened.key)
    assert b"Zephyrine" not in sealed_hop
    [hop_opened] = await open_sealed(store.keys, [sealed_hop])
    assert isinstance(hop_opened, Opened) and hop_value(hop_opened) == hop
    assert await store.keys.erase_group_keys("acme") == 1
    [gone] = await open_sealed(store.keys, [sealed])
    assert isinstance(gone, InvalidEpisode) and gone.reason == "key_erased"


async def test_rotate_key_adds_a_newer_key_and_keeps_the_older(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "graph")
    await store.setup(384)
    first = await Sealer(store.keys).seal(orjson.dumps(ENVELOPE), "acme")
    await store.close()
    tidegraph = str(Path(sys.executable).with_name("tidegraph"))
    command = [tidegraph, "rotate-key", "--group", "acme", "--data-dir", str(tmp_path), "--json"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGRAPH_")}
    done = await asyncio.to_thread(
        subprocess.run,
        command,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "TIDEGRAPH_EMBEDDER": "hashing"},
    )
    assert done.returncode == 0, done.stderr
    rotated = orjson.loads(done.stdout)
    assert rotated["keys"] == 2
    store = SqliteStore(tmp_path / "graph")
    try:
        second = await Sealer(store.keys).seal(orjson.dumps(ENVELOPE), "acme")
        assert orjson.loads(second)["sealed"]["key"] == rotated["key_id"]  # the newest seals
        opened = await open_sealed(store.keys, [first, second])
        assert [orjson.loads(o.value) for o in opened if isinstance(o, Opened)] == [ENVELOPE] * 2
    finally:
        await store.close()
