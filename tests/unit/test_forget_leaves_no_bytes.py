"""A forget leaves no byte of what it erased in the embedded store's files
(docs/operations.md "What a forget leaves behind").

A contact and three chat messages carrying a name, a phone number and a street go in through
the Memory API with the demo's CRM mapping; search finds them; the contact is forgotten as a
subject and the messages by their ids; then no file under the data folder holds any of the
strings, while the store is still open and once it is closed: not as written, not in lower
case, not as the words the fulltext index keeps (the identifier words and the Porter stems
FTS5 stores, read from a scratch FTS5 table with the store's own tokenizer). On a fresh
store, and on a long-lived one (the demo's feeds and a few hundred other messages before the
planted ones, more after the forget). Before the forget the same scan finds every string, so
the scan can see them.
"""

from __future__ import annotations

import re
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from tidegraph.app.demo import FEED_FILE, MAPPING_FILE, MESSAGES_FILE
from tidegraph.app.memory import Memory
from tidegraph.pipelines.ingest import read_jsonl
from tidegraph.records.forget import ForgetRequest
from tidegraph.records.search import SearchRequest
from tidegraph.settings import Settings
from tidegraph.stores.search_text import identifier_words
from tidegraph.stores.sqlite.db import DB_FILE

GROUP = "northwind"
AT = datetime(2025, 10, 1, 9, 0, tzinfo=UTC)
NAME, PHONE, STREET = "Zephyrine Quillfeather", "+44 7700 900461", "Brackenwhistle Lane"
CONTACT = {
    "type": "contact.joined",
    "contact": {"id": "nw-c-77", "name": NAME, "title": "Head of Facilities", "phone": PHONE},
    "company": {"id": "nw-a-001", "name": "Acme Corp"},
    "joined_at": AT.isoformat(),
}
MESSAGES = {
    "chat-1": f"{NAME} (Acme Corp): the badge printer is down again, call me on {PHONE}",
    "chat-2": f"Owen Park (Northwind support): Thanks Zephyrine, a courier brings a new one "
    f"to 12 {STREET} tomorrow",
    "chat-3": f"{NAME} (Acme Corp): 12 {STREET} is right, ask for {NAME} at the gate",
}
# Words of the planted strings that nothing else in the store holds by chance (short numbers
# and common words such as "lane" do appear in other records).
MIN_NEEDLE = 7


def needles(store_file: Path) -> set[str]:
    """The planted strings, their words and identifier words, and the tokens the store's
    fulltext index keeps for them (its own tokenizer, read from its schema), lower-cased."""
    texts = [NAME, PHONE, STREET]
    words = {w for t in texts for w in re.split(r"[\s+]+", t)}
    idents = {w for t in texts for w in identifier_words(t)}
    with sqlite3.connect(store_file) as conn:
        [schema] = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'episode_search'"
        ).fetchone()
    tokenizer = re.search(r"tokenize\s*=\s*'[^']*'", schema)
    assert tokenizer is not None, schema
    scratch = sqlite3.connect(":memory:")
    scratch.execute(f"CREATE VIRTUAL TABLE t USING fts5(text, {tokenizer.group(0)})")
    scratch.executemany("INSERT INTO t (text) VALUES (?)", [(x,) for x in [*texts, *idents]])
    scratch.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'row')")
    tokens = {term for (term,) in scratch.execute("SELECT term FROM v")}
    found = {*texts, *words, *idents, *tokens}
    return {n.lower() for n in found if len(n) >= MIN_NEEDLE}


def files_holding(folder: Path, wanted: set[str]) -> dict[str, list[str]]:
    """For each file under ``folder``, the needles its bytes hold (compared in lower case)."""
    held: dict[str, list[str]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes().lower()
        hits = sorted(n for n in wanted if n.encode() in data)
        if hits:
            held[str(path.relative_to(folder))] = hits
    return held


def chatter(prefix: str, count: int, start: datetime) -> list[dict[str, Any]]:
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
        added = await memory.add_episode(
            group_id=GROUP, content=CONTACT, reference_time=AT, episode_id="crm:contact-77"
        )
        assert added.status == "written", added
        for n, (episode_id, text) in enumerate(MESSAGES.items()):
            added = await memory.add_episode(
                group_id=GROUP,
                content=text,
                source="message",
                source_description="Zendesk ticket NW-1077",
                reference_time=AT + timedelta(hours=1, minutes=n),
                episode_id=episode_id,
            )
            assert added.status == "written", added

        query = SearchRequest(query="Quillfeather Brackenwhistle 900461", group_ids=[GROUP])
        found = await memory.search(query)
        assert any(NAME == h.subject for h in found.facts)
        assert any(NAME in repr(h.record) for h in found.entities)
        assert {h.episodes[0] for h in found.episodes} == set(MESSAGES)

        wanted = needles(data / "graph" / DB_FILE)
        assert {"quillfeather", "brackenwhistle", "447700900461"} <= wanted
        seen = {n for hits in files_holding(data, wanted).values() for n in hits}
        assert seen == wanted  # the scan sees every needle while they are stored

        subject = await memory.forget(ForgetRequest(group_id=GROUP, subject=NAME))
        assert subject.episodes == ["crm:contact-77"], subject
        messages = await memory.forget(ForgetRequest(group_id=GROUP, episode_ids=list(MESSAGES)))
        assert sorted(messages.episodes) == sorted(MESSAGES), messages
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
