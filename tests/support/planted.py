"""Distinctive strings planted in a group through the Memory API, to check that a forget
takes every copy of them (tests/unit/test_forget_leaves_no_bytes.py on the embedded store's
files, tests/integration/test_forget_neo4j_remains.py on what Neo4j answers).

A contact (the demo's CRM mapping: ``contact.joined``) and three chat messages carry a name,
a phone number and a street. ``needles`` are the strings, their words and identifier words
and the tokens a fulltext index keeps of them, lower-cased; ``forget_planted`` forgets the
contact as a subject and the messages by their ids, as a person asking to be erased would.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from tidegraph.app.memory import Memory
from tidegraph.records.forget import ForgetRequest
from tidegraph.stores.search_text import identifier_words
from tidegraph.stores.sqlite.driver import sqlite3

GROUP = "northwind"
AT = datetime(2025, 10, 1, 9, 0, tzinfo=UTC)
NAME, PHONE, STREET = "Zephyrine Quillfeather", "+44 7700 900461", "Brackenwhistle Lane"
CONTACT_ID = "crm:contact-77"
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
QUERY = "Quillfeather Brackenwhistle 900461"
# Words of the planted strings that nothing else holds by chance (short numbers and common
# words such as "lane" do appear in other records).
MIN_NEEDLE = 7
PORTER = "tokenize = 'porter unicode61'"


def needles(tokenizer: str = PORTER) -> set[str]:
    """The planted strings, their words and identifier words, and the tokens an FTS5 index
    with ``tokenizer`` keeps of them (read from a scratch table), lower-cased."""
    texts = [NAME, PHONE, STREET]
    words = {w for t in texts for w in re.split(r"[\s+]+", t)}
    idents = {w for t in texts for w in identifier_words(t)}
    scratch = sqlite3.connect(":memory:")
    scratch.execute(f"CREATE VIRTUAL TABLE t USING fts5(text, {tokenizer})")
    scratch.executemany("INSERT INTO t (text) VALUES (?)", [(x,) for x in [*texts, *idents]])
    scratch.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'row')")
    tokens = {term for (term,) in scratch.execute("SELECT term FROM v")}
    scratch.close()
    found = {*texts, *words, *idents, *tokens}
    return {n.lower() for n in found if len(n) >= MIN_NEEDLE}


async def plant(memory: Memory, group: str = GROUP) -> None:
    """The contact and the messages, each written."""
    added = await memory.add_episode(
        group_id=group, content=CONTACT, reference_time=AT, episode_id=CONTACT_ID
    )
    assert added.status == "written", added
    for n, (episode_id, text) in enumerate(MESSAGES.items()):
        added = await memory.add_episode(
            group_id=group,
            content=text,
            source="message",
            source_description="Zendesk ticket NW-1077",
            reference_time=AT + timedelta(hours=1, minutes=n),
            episode_id=episode_id,
        )
        assert added.status == "written", added


async def forget_planted(memory: Memory, group: str = GROUP) -> None:
    """The contact forgotten as a subject (by name), the messages by their ids."""
    subject = await memory.forget(ForgetRequest(group_id=group, subject=NAME))
    assert subject.episodes == [CONTACT_ID], subject
    messages = await memory.forget(ForgetRequest(group_id=group, episode_ids=list(MESSAGES)))
    assert sorted(messages.episodes) == sorted(MESSAGES), messages
