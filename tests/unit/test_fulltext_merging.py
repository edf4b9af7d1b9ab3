"""The embedded store's fulltext indexes stay in few segments as writes go
(tidegraph/stores/sqlite/erasure.py ``merge_fulltext``; docs/performance.md "Forgetting"): a
forget's secure delete looks each deleted word up in every segment, so its cost is what it
deletes times the segments there are.

FTS5 writes every transaction's entries as a new segment; left to its defaults, one-episode
writes pile up as tiny segments (up to 16 are merged at once). With the store's merge step
after each write a level is merged as soon as it holds four, so each of the about log4(n)
levels of n transactions holds at most three.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import EpisodeRecord, EpisodeWrite
from tidegraph.records.ids import stable_uuid
from tidegraph.records.search import SearchScope
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.erasure import FULLTEXT_TABLES
from tidegraph.stores.sqlite.store import SqliteStore

WRITES = 300
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TOPICS = ["invoice", "password reset", "plan upgrade", "printer", "export", "refund"]


def message(n: int) -> EpisodeRecord:
    at = START + timedelta(minutes=n)
    return EpisodeRecord(
        uuid=stable_uuid("episode", "acme", f"m-{n}"),
        group_id="acme",
        name=f"message {n}",
        source="message",
        source_description=f"ticket {n // 4}",
        content=f"Agent {n % 5} (support): about the {TOPICS[n % 6]} of order ORD-{n:05d}, "
        f"note {n * 37 % 1000}",
        valid_at=at,
        created_at=at,
        producer_id=f"m-{n}",
    )


def segments(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(DISTINCT segid) FROM episode_search_idx").fetchone()[0])


async def test_one_episode_writes_leave_few_fulltext_segments(tmp_path: Path) -> None:
    """Counted every tenth write: FTS5's defaults left 3 to 18 segments over such a run, 10
    on average; the merge step 1 to 7, 4.2 on average."""
    store = SqliteStore(tmp_path / "graph")
    await store.setup(8)
    bound = 3 * math.ceil(math.log(WRITES, 4))
    seen = []
    scope = SearchScope(("acme",), AsOf.resolve(None, None, False, None))
    try:
        for n in range(WRITES):  # one write transaction each
            assert await store.write_episode("acme", EpisodeWrite(episode=message(n)))
            if n % 10 == 9:
                seen.append(await store.db.run(segments))
        assert max(seen) <= bound, seen
        assert sum(seen) / len(seen) <= 6, seen
        for n in (0, WRITES - 1):  # the merged segments still hold every row
            hits = await store.search.fulltext_search(scope, "episode", f"ORD-{n:05d}", 5)
            assert [h.uuid for h in hits][:1] == [message(n).uuid], hits

        def check(conn: sqlite3.Connection) -> None:
            for table in FULLTEXT_TABLES:
                conn.execute(f"INSERT INTO {table} ({table}) VALUES ('integrity-check')")

        await store.db.run(check)
    finally:
        await store.close()
