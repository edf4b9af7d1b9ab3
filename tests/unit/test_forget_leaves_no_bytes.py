"""A forget leaves no byte of what it erased in the embedded store's files
(docs/operations.md "What a forget leaves behind").

A contact and three chat messages carrying a name, a phone number and a street go in through
the Memory API with the demo's CRM mapping (``tests/support/planted.py``); search finds them;
the contact is forgotten as a subject and the messages by their ids; then no file under the
data folder holds any of the strings, while the store is still open and once it is closed:
not as written, not in lower case, not as the words the fulltext index keeps (the identifier
words and the Porter stems FTS5 stores, read from a scratch FTS5 table with the store's own
tokenizer). On a fresh store, and on a long-lived one (the demo's feeds and a few hundred
other messages before the planted ones, more after the forget). Before the forget the same
scan finds every string, so the scan can see them. Forgetting the whole group, with or
without purge, leaves none either.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.planted import AT, GROUP, NAME, QUERY, forget_planted, needles, plant
from tidegraph.app.demo import FEED_FILE, MAPPING_FILE, MESSAGES_FILE
from tidegraph.app.memory import Memory
from tidegraph.pipelines.ingest import read_jsonl
from tidegraph.records.forget import ForgetRequest
from tidegraph.records.search import SearchRequest
from tidegraph.settings import Settings
from tidegraph.stores.sqlite.db import DB_FILE
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.erasure import FULLTEXT_TABLES
from tidegraph.stores.sqlite.store import SqliteStore


def store_tokenizer(store_file: Path) -> str:
    """The ``tokenize = '...'`` option of the store's episode index, from its schema."""
    with sqlite3.connect(store_file) as conn:
        [schema] = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'episode_search'"
        ).fetchone()
    found = re.search(r"tokenize\s*=\s*'[^']*'", schema)
    assert found is not None, schema
    return found.group(0)


def files_holding(folder: Path, wanted: set[str]) -> dict[str, list[str]]:
    """For each file under ``folder``, the needles its bytes hold (compared in lower case)."""
    held: dict[str, list[str]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes().lower()
        hits = sorted(n for n in wanted if n.encode() in data)
        if hits:
            held[str(path.relative_to(folder))] = hits
    return held


def chatter(prefix: str, count: int, start: Any) -> list[dict[str, Any]]:
    """``count`` ordinary support messages spread over four groups."""
    topics = ["invoice", "password reset", "plan upgrade", "printer", "SSO", "export"]
    return [
        {
            "id": f"{prefix}-{n}",
            "group_id": [GROUP, "bluebird", "harbor", "other"][n % 4],
            "source": "message",
            "name": f"{prefix} {n}",
            "source_description": f"ticket {prefix}-{n // 5}",
            "content": f"Agent {n % 7} (support): about the {topics[n % 6]} of order "
            f"ORD-{n:05d}, see note {n * 37 % 1000}",
            "reference_time": (start + timedelta(minutes=n)).isoformat(),
        }
        for n in range(count)
    ]


async def add_all(memory: Memory, records: list[dict[str, Any]] | bytes) -> None:
    lines = records if isinstance(records, bytes) else b"\n".join(map(orjson.dumps, records))
    episodes, failures = read_jsonl(lines.splitlines())
    assert not failures, failures
    for episode in episodes:
        added = await memory.add(episode)
        assert added.status == "written", added


@pytest.mark.parametrize("history", ["fresh", "long-lived"])
async def test_a_forget_leaves_no_byte_of_what_it_erased(tmp_path: Path, history: str) -> None:
    data = tmp_path / "data"
    settings = Settings(data_dir=data, embedder="hashing", mappings=MAPPING_FILE)
    memory = await Memory.open(settings)
    try:
        if history == "long-lived":
            await add_all(memory, FEED_FILE.read_bytes())
            await add_all(memory, MESSAGES_FILE.read_bytes())
            await add_all(memory, chatter("before", 300, AT - timedelta(days=30)))
        await plant(memory)

        query = SearchRequest(query=QUERY, group_ids=[GROUP])
        found = await memory.search(query)
        assert any(NAME == h.subject for h in found.facts)
        assert any(NAME in repr(h.record) for h in found.entities)
        assert len(found.episodes) == 3

        wanted = needles(store_tokenizer(data / "graph" / DB_FILE))
        assert {"quillfeather", "brackenwhistle", "447700900461"} <= wanted
        seen = {n for hits in files_holding(data, wanted).values() for n in hits}
        assert seen == wanted  # the scan sees every needle while they are stored

        await forget_planted(memory)
        if history == "long-lived":
            await add_all(memory, chatter("after", 200, AT + timedelta(days=1)))
        after = await memory.search(query)
        hits = repr([after.entities, after.facts, after.episodes, after.communities]).lower()
        assert not [n for n in wanted if n in hits], hits
        # While the store is open too: its write-ahead log was truncated by the forget.
        assert files_holding(data, wanted) == {}
    finally:
        await memory.close()

    assert files_holding(data, wanted) == {}


@pytest.mark.parametrize("purge", [False, True])
async def test_forgetting_the_whole_group_leaves_no_byte_of_it(tmp_path: Path, purge: bool) -> None:
    data = tmp_path / "data"
    settings = Settings(data_dir=data, embedder="hashing", mappings=MAPPING_FILE)
    async with await Memory.open(settings) as memory:
        await add_all(memory, chatter("other", 40, AT))  # other groups stay
        await plant(memory)
        wanted = needles(store_tokenizer(data / "graph" / DB_FILE))
        done = await memory.forget(ForgetRequest(group_id=GROUP, group=True, purge=purge))
        assert done.forgotten > 0
        assert files_holding(data, wanted) == {}
    assert files_holding(data, wanted) == {}


async def test_a_store_written_before_deletes_securely_once_opened(tmp_path: Path) -> None:
    """A file whose fulltext indexes lack FTS5's secure-delete option (written before it was
    set) keeps a deleted row's words in its index segments; opened by this version, its
    indexes are merged once and delete securely from then on: the words are gone."""
    folder = tmp_path / "graph"
    word = "zanzibarquuxword"

    def written_before(conn: sqlite3.Connection) -> None:
        for table in FULLTEXT_TABLES:
            conn.execute(f"INSERT INTO {table} ({table}, rank) VALUES ('secure-delete', 0)")
        conn.execute("INSERT INTO fact_text (rowid, group_id, text) VALUES (-1, 'g', ?)", (word,))
        conn.execute("DELETE FROM fact_text WHERE rowid = -1")

    store = SqliteStore(folder)
    await store.setup(8)
    await store.db.run(written_before)
    await store.close()
    assert files_holding(folder, {word}), "the older file keeps the deleted row's word"
    store = SqliteStore(folder)
    await store.setup(8)

    def option(conn: sqlite3.Connection) -> list[int]:
        return [
            conn.execute(f"SELECT v FROM {t}_config WHERE k = 'secure-delete'").fetchone()[0]
            for t in FULLTEXT_TABLES
        ]

    assert await store.db.run(option) == [1] * len(FULLTEXT_TABLES)
    await store.close()
    assert not files_holding(folder, {word})
