"""A downstream consumer that follows docs/streaming.md "What a consumer does with a forget"
keeps a copy that, after a forget, is the graph's and holds nothing of what was forgotten.

The consumer reads the change stream through the Memory API (as ``GET /v1/changes`` and the
MCP ``list_changes`` tool serve it) into its own copy, one record per uuid: a change with
``after`` replaces the record whole, a ``*.forgotten`` change deletes it (and the consumer's
own log of changes drops that uuid's earlier ones). The strings of ``tests/support/planted.py``
go in, the consumer reads, they are forgotten, it reads again: its copy has exactly the
group's entities and facts, and neither the copy nor its log holds a planted string.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.planted import GROUP, forget_planted, needles, plant
from tidegraph.app.demo import MAPPING_FILE
from tidegraph.app.memory import Memory
from tidegraph.settings import Settings


class Consumer:
    """What the docs tell a consumer to keep and drop."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.log: list[dict[str, Any]] = []  # the consumer's own log of the changes it read
        self.cursor = 0
        self.seen: set[str] = set()

    async def read(self, memory: Memory) -> None:
        while True:
            page = await memory.changes(GROUP, after=self.cursor, limit=100)
            for change in page.changes:
                if change.change_id in self.seen:  # idempotent by change_id
                    continue
                self.seen.add(change.change_id)
                self.apply(change.model_dump(mode="json"))
            if page.cursor == self.cursor:
                return
            self.cursor = page.cursor

    def apply(self, change: dict[str, Any]) -> None:
        uuid, kind = change["uuid"], change["kind"]
        if kind.endswith(".forgotten"):
            self.records.pop(uuid, None)
            self.log = [c for c in self.log if c["uuid"] != uuid]
        elif change["after"] is not None:
            self.records[uuid] = change["after"]  # whole, never merged
            if change["episode_id"] is None:  # a forget's change: earlier states go
                self.log = [c for c in self.log if c["uuid"] != uuid]
        self.log.append(change)


async def test_a_consumer_that_follows_the_docs_keeps_nothing_of_a_forget(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=tmp_path / "data", embedder="hashing", mappings=MAPPING_FILE)
    consumer = Consumer()
    async with await Memory.open(settings) as memory:
        await plant(memory)
        await consumer.read(memory)
        wanted = needles()
        assert any(n in repr(consumer.records).lower() for n in wanted)  # it had them
        await forget_planted(memory)
        await consumer.read(memory)
        entities = {e.uuid for e in await memory.entities(GROUP)}
        facts = {f.uuid for f in await memory.store.browse.query_facts(GROUP, include_invalid=True)}
    kept = repr([consumer.records, consumer.log]).lower()
    assert [n for n in wanted if n in kept] == []
    assert set(consumer.records) == entities | facts
