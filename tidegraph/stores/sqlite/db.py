"""The embedded store's database (``store.SqliteStore``): one SQLite file in WAL mode and one
connection, used from one thread of its own. Every call runs there, one at a time, so
the event loop never waits on the disk and one call's transaction never interleaves with
another's. Searches (``read``) run instead on ``READERS`` read-only connections of their own
threads: WAL lets them read beside the writer and beside each other, each seeing what was
committed when its statement began, and SQLite's own work (FTS5, the b-trees, numpy's
comparisons) runs without the GIL, so two searches overlap.

How values are stored (and read back by ``rows``' record builders, as for Neo4j):
- times: INTEGER microseconds since the epoch, UTC (``rows.to_utc`` reads an int that way);
- lists (labels, aliases, episode uuids, a fact's end and start history): JSON text;
- embeddings: BLOBs of float64, the exact numbers written (both other stores return them so).

The schema (``SCHEMA``): one table per node kind with its uuid unique and its group indexed,
``entity_name`` (each entity's normalised name and aliases, for resolution's lookups),
``mention`` and ``member`` for the MENTIONS and HAS_MEMBER edges, and an FTS5 table per kind
(Porter-stemmed words, BM25; the row's group is a column of it, so a search matches one
tenant's rows) whose rowid is the record's ``id``: an episode's has its conversation fields
(``episode_search``: body, speaker, context, said_on), with ``speaker_word`` the words of each
group's speakers.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import struct
import threading
from array import array
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import orjson

from tidegraph.records.graph import MAPPED
from tidegraph.records.times import utc
from tidegraph.stores.executor import count_errors
from tidegraph.stores.sqlite.driver import sqlite3

T = TypeVar("T")
P = ParamSpec("P")

DB_FILE = "graph.sqlite"
# 2: episodes are searched by their conversation fields (``episode_search``, docs/retrieval.md
# "Conversation-aware episode search"); 3: texts are indexed with their identifier words
# (docs/retrieval.md "Identifiers"). A store of an earlier version is migrated at setup.
SCHEMA_VERSION = "3"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The fulltext tables: kind -> (table, the record table its rowid is an id of).
FULLTEXT = {
    "fact": ("fact_text", "fact"),
    "entity": ("entity_text", "entity"),
    "episode": ("episode_search", "episode"),
    "community": ("community_text", "community"),
}
# Each fulltext table's BM25 column weights (its group column weighs 0). An episode's words
# weigh 1, the speaker's name, the turns it answers and its date in words less: they say
# what the turn is about, not what it says (tidegraph/records/conversation.py).
BM25_WEIGHTS = {
    "fact_text": "0.0, 1.0",
    "entity_text": "0.0, 1.0",
    "episode_search": "0.0, 1.0, 0.3, 0.3, 0.5",
    "community_text": "0.0, 1.0",
}

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    """CREATE TABLE IF NOT EXISTS episode (
        id INTEGER PRIMARY KEY,
        uuid TEXT NOT NULL UNIQUE,
        group_id TEXT NOT NULL,
        name TEXT NOT NULL,
        source TEXT NOT NULL,
        source_description TEXT NOT NULL,
        content TEXT NOT NULL,
        valid_at INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        producer_id TEXT,
        content_hash TEXT,
        created_entities TEXT NOT NULL,
        not_extracted TEXT,
        content_embedding BLOB,
        extraction TEXT,
        extracted_at INTEGER,
        forgotten_at INTEGER)""",
    "CREATE INDEX IF NOT EXISTS episode_group_valid ON episode (group_id, valid_at)",
    "CREATE INDEX IF NOT EXISTS episode_pending ON episode (group_id, valid_at, producer_id) "
    "WHERE not_extracted IS NOT NULL",
    # What a search reads of an episode by its uuid for the entities it mentions and the
    # producer ids of hits, without reading the row (its content and embedding): the
    # ``INDEXED BY episode_said`` of search.py and rows.py.
    "CREATE INDEX IF NOT EXISTS episode_said ON episode "
    "(uuid, group_id, created_at, valid_at, producer_id)",
    """CREATE TABLE IF NOT EXISTS entity (
        id INTEGER PRIMARY KEY,
        uuid TEXT NOT NULL UNIQUE,
        group_id TEXT NOT NULL,
        name TEXT NOT NULL,
        labels TEXT NOT NULL,
        summary TEXT,
        key TEXT,
        aliases TEXT NOT NULL,
        name_embedding BLOB,
        created_at INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS entity_group_name ON entity (group_id, name, uuid)",
    "CREATE INDEX IF NOT EXISTS entity_group_key ON entity (group_id, key) WHERE key IS NOT NULL",
    """CREATE TABLE IF NOT EXISTS entity_name (
        group_id TEXT NOT NULL,
        name TEXT NOT NULL,
        uuid TEXT NOT NULL,
        PRIMARY KEY (group_id, name, uuid)) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS entity_name_uuid ON entity_name (uuid)",
    """CREATE TABLE IF NOT EXISTS fact (
        id INTEGER PRIMARY KEY,
        uuid TEXT NOT NULL UNIQUE,
        group_id TEXT NOT NULL,
        source_uuid TEXT NOT NULL,
        target_uuid TEXT NOT NULL,
        name TEXT NOT NULL,
        fact TEXT NOT NULL,
        fact_embedding BLOB,
        episodes TEXT NOT NULL,
        valid_at INTEGER,
        invalid_at INTEGER,
        created_at INTEGER NOT NULL,
        expired_at INTEGER,
        cardinality TEXT,
        prior_ends TEXT,
        prior_ends_learned_at TEXT,
        end_learned_at INTEGER,
        prior_starts TEXT,
        prior_starts_learned_at TEXT,
        start_learned_at INTEGER)""",
    "CREATE INDEX IF NOT EXISTS fact_source ON fact (group_id, source_uuid, name)",
    "CREATE INDEX IF NOT EXISTS fact_target ON fact (group_id, target_uuid)",
    # What decides whether a question as of some time may see a fact (``rows.believed_sql``),
    # read without the facts' rows (their embeddings): the candidates of a search on a long
    # history are narrowed to those (sqlite/search.py ``seen``). Keyed by an expression of the
    # group (``BELIEVED_GROUP``) that only those reads name: on the group id itself, the
    # planner took it over fact_source and fact_target for the walk's reads.
    "CREATE INDEX IF NOT EXISTS fact_believed ON fact (('' || group_id), created_at, "
    "valid_at, invalid_at, expired_at, start_learned_at, prior_ends, uuid)",
    """CREATE TABLE IF NOT EXISTS mention (
        episode_uuid TEXT NOT NULL,
        entity_uuid TEXT NOT NULL,
        group_id TEXT NOT NULL,
        PRIMARY KEY (episode_uuid, entity_uuid)) WITHOUT ROWID""",
    # An entity's mentions with their group (and the key's episode uuid): read without the
    # table. Replaces ``mention_entity (entity_uuid)`` of earlier stores.
    "DROP INDEX IF EXISTS mention_entity",
    "CREATE INDEX IF NOT EXISTS mention_entity_group ON mention (entity_uuid, group_id)",
    "CREATE INDEX IF NOT EXISTS mention_group ON mention (group_id)",
    """CREATE TABLE IF NOT EXISTS community (
        id INTEGER PRIMARY KEY,
        uuid TEXT NOT NULL UNIQUE,
        group_id TEXT NOT NULL,
        name TEXT NOT NULL,
        summary TEXT NOT NULL,
        name_embedding BLOB,
        created_at INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS community_group ON community (group_id)",
    """CREATE TABLE IF NOT EXISTS member (
        community_uuid TEXT NOT NULL,
        entity_uuid TEXT NOT NULL,
        group_id TEXT NOT NULL,
        PRIMARY KEY (community_uuid, entity_uuid)) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS member_entity ON member (entity_uuid)",
    # the change stream's outbox: per group the last seq, what is published and the write
    # version; a row per write, its changes numbered seq to last (``rows.outbox_row``),
    # found by (group, last): ``OUTBOX_ROWS``. A rowid table: a row's JSON is kilobytes,
    # and rows that large in a WITHOUT ROWID table (its b-tree keyed by group and seq,
    # groups interleaved) took three times their size in pages (``migrate_outbox``).
    """CREATE TABLE IF NOT EXISTS change_log (
        group_id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL,
        published INTEGER NOT NULL,
        version INTEGER NOT NULL,
        deployment TEXT) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS change (
        group_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        change_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        uuid TEXT NOT NULL,
        body TEXT NOT NULL,
        committed_at INTEGER,
        last INTEGER)""",
    "CREATE INDEX IF NOT EXISTS member_group ON member (group_id)",
    *(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING fts5("
        "group_id, text, tokenize = 'porter unicode61')"
        for table, _ in FULLTEXT.values()
        if table != "episode_search"
    ),
    # An episode's conversation fields (tidegraph/records/conversation.py).
    "CREATE VIRTUAL TABLE IF NOT EXISTS episode_search USING fts5("
    "group_id, body, speaker, context, said_on, tokenize = 'porter unicode61')",
    # The words of each group's speakers' names: a query word that is one is searched in the
    # speaker column only.
    """CREATE TABLE IF NOT EXISTS speaker_word (
        group_id TEXT NOT NULL,
        word TEXT NOT NULL,
        PRIMARY KEY (group_id, word)) WITHOUT ROWID""",
)
# The group of a fact as the fact_believed index is keyed (see SCHEMA).
BELIEVED_GROUP = "('' || f.group_id)"
# Tables of earlier schema versions, dropped once migrated (``SqliteStore._setup``).
DROPPED = ("DROP TABLE IF EXISTS episode_text",)


def outbox_before_migration(conn: sqlite3.Connection) -> bool:
    """Set aside the outbox of a file written before it was a rowid table (a WITHOUT ROWID
    one, keyed by group and seq), to be moved into the current table by ``migrate_outbox``
    once the schema is created; True when there was one."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'change'")
    found = row.fetchone()
    if found is None or "WITHOUT ROWID" not in found[0].upper():
        return False
    conn.execute("ALTER TABLE change RENAME TO change_before")
    conn.execute("DROP INDEX IF EXISTS change_uuid")  # its name is the current table's
    return True


def migrate_outbox(conn: sqlite3.Connection) -> int:
    """The changes set aside by ``outbox_before_migration``, in the current table (the same
    columns; ``committed_at`` 0 where the file predates it); how many."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(change_before)")}
    columns = ["group_id", "seq", "change_id", "kind", "uuid", "body", "committed_at"]
    picked = ", ".join(c if c in have else "0" for c in columns)
    moved = conn.execute(
        f"INSERT INTO change ({', '.join(columns)}) "  # noqa: S608 - constant column names
        f"SELECT {picked} FROM change_before ORDER BY group_id, seq"
    ).rowcount
    conn.execute("DROP TABLE change_before")
    return moved


# What a forget asks of a group before it works out its reach (``lifecycle.group_profile``,
# ``lifecycle.extracted_episodes``), each answered from a partial index without reading the
# group's episodes: its live extracted episodes, and those of them no mapping made (the LLM
# extracted them, or they keep no extraction). The conditions are spelled here once: a query
# must repeat them word for word for SQLite to use the index.
EPISODE_LIVE = "forgotten_at IS NULL AND not_extracted IS NULL"
EPISODE_UNMAPPED = f"{EPISODE_LIVE} AND (extraction IS NULL OR instr(extraction, '{MAPPED}') = 0)"
# Indexes on columns ``ADDED_COLUMNS`` may add: created after them.
ADDED_INDEXES = (
    f"CREATE INDEX IF NOT EXISTS episode_live ON episode (group_id) WHERE {EPISODE_LIVE}",
    f"CREATE INDEX IF NOT EXISTS episode_unmapped ON episode (group_id) WHERE {EPISODE_UNMAPPED}",
    # The entities each episode created, read without the episode's row (a forget asks which
    # of an entity's mentions created it: ``lifecycle.history_part``; an entity such as a
    # plan is mentioned by a large part of its group, and an episode's row is kilobytes).
    "CREATE INDEX IF NOT EXISTS episode_created ON episode (uuid, created_entities)",
)

# The outbox as a row per write, indexed by (group, last): on a file whose rows were one
# change each (indexed by (group, seq) and by uuid), each becomes a row of one (run by setup
# while the index is missing).
OUTBOX_INDEX = "change_group_last"
OUTBOX_ROWS = (
    "UPDATE change SET last = seq WHERE last IS NULL",
    "DROP INDEX IF EXISTS change_group_seq",
    "DROP INDEX IF EXISTS change_uuid",
    f"CREATE UNIQUE INDEX IF NOT EXISTS {OUTBOX_INDEX} ON change (group_id, last)",
)

# Each record's outbox rows: (group, the record's uuid, the row's last) per record a row
# holds changes of, so that a forget reads only the rows of what it purges
# (``writes.purge_changes``). Created, and filled from the rows there are, by setup while
# it is missing (``writes.index_outbox_records``).
OUTBOX_RECORDS = "change_record"
OUTBOX_RECORDS_TABLE = f"""CREATE TABLE {OUTBOX_RECORDS} (
    group_id TEXT NOT NULL,
    uuid TEXT NOT NULL,
    last INTEGER NOT NULL,
    PRIMARY KEY (group_id, uuid, last)) WITHOUT ROWID"""


# Columns added to tables of older files (``ADDED_COLUMNS``: table -> column definitions),
# added by setup when missing.
ADDED_COLUMNS = {
    "episode": ("extraction TEXT", "extracted_at INTEGER", "forgotten_at INTEGER"),
    "change": ("committed_at INTEGER", "last INTEGER"),
    "change_log": ("deployment TEXT",),
}


# ----------------------------------------------------------------------------- values
def micros(value: datetime | None) -> int | None:
    """An aware datetime as microseconds since the epoch (None stays None)."""
    if value is None:
        return None
    since = utc(value) - _EPOCH
    return (since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds


def time_of(value: int | None) -> datetime | None:
    """A stored time (``micros``) as an aware UTC datetime (None stays None)."""
    return None if value is None else _EPOCH + timedelta(microseconds=value)


def times_of(text: str | None) -> list[datetime]:
    """A stored list of times (``micros_list``; NULL: none)."""
    return [] if text is None else [_EPOCH + timedelta(microseconds=v) for v in orjson.loads(text)]


def micros_list(values: Sequence[datetime] | None) -> str | None:
    """A list of datetimes as JSON microseconds; None (or empty: "no history") stays None."""
    return json_text([micros(v) for v in values]) if values else None


def json_text(values: Iterable[Any]) -> str:
    return orjson.dumps(list(values)).decode()


def json_list(text: str | None) -> list[Any]:
    """A JSON list column's values (NULL: none)."""
    return [] if text is None else list(orjson.loads(text))


def vector_blob(values: Sequence[float] | None) -> bytes | None:
    """A vector as its native doubles (``array("d", values).tobytes()``), packed by a struct of
    its length: a third of the time for 384 numbers."""
    return None if values is None else _doubles(len(values)).pack(*values)


@functools.lru_cache(maxsize=16)  # the store's one dimension, in practice
def _doubles(count: int) -> struct.Struct:
    return struct.Struct(f"{count}d")


def vector_of(blob: bytes | None) -> list[float] | None:
    if blob is None:
        return None
    values = array("d")
    values.frombytes(blob)
    return values.tolist()


def fulltext_phrase(text: str) -> str:
    """``text`` as one FTS5 string (a phrase of its words): quoted, inner quotes doubled, so
    nothing in it is query syntax."""
    return '"' + text.replace('"', '""') + '"'


# ----------------------------------------------------------------------------- database
# Read-only connections (and threads) for searches: one per core of the machine this is
# measured on (docs/performance.md "Serving over HTTP").
READERS = 2


class Connection(sqlite3.Connection):
    """A connection with ``kept``: what its reads keep between calls (search.py's matrices),
    valid for what this connection sees."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept: dict[str, Any] = {}


def kept(conn: sqlite3.Connection, name: str, make: Callable[[], T]) -> T:
    """The connection's ``name`` (made at first use)."""
    assert isinstance(conn, Connection)  # every connection is opened by ``_open``
    found = conn.kept.get(name)
    if found is None:
        found = conn.kept[name] = make()
    return found


class SqliteDatabase:
    """The file, opened on first use on the database's thread; ``run`` calls a function
    with the connection there, ``read`` with one of the read-only connections."""

    def __init__(self, folder: Path, cache_mb: int) -> None:
        self.folder = folder
        self.path = folder / DB_FILE
        self._cache_kib = max(cache_mb, 1) * 1024
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidegraph-sqlite")
        self._read_threads = ThreadPoolExecutor(
            max_workers=READERS, thread_name_prefix="tidegraph-sqlite-read"
        )
        self._free_readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()

    def _open(self, cache_kib: int | None = None) -> sqlite3.Connection:
        # isolation_level None: no implicit transactions; ``transaction`` opens them.
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, factory=Connection
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")  # durable at each WAL checkpoint
        conn.execute(f"PRAGMA cache_size = -{cache_kib or self._cache_kib}")
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("PRAGMA secure_delete = ON")  # deleted bytes zeroed (erasure.py)
        return conn

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            if self._closed:
                raise RuntimeError("the embedded store is closed")
            self.folder.mkdir(parents=True, exist_ok=True)
            self._conn = self._open()
        return self._conn

    def _reader(self) -> sqlite3.Connection:
        """A free read-only connection (there are as many as reading threads)."""
        try:
            return self._free_readers.get_nowait()
        except queue.Empty:
            pass
        with self._readers_lock:
            if self._closed:
                raise RuntimeError("the embedded store is closed")
            # The readers share one page cache's worth (the setting bounds the searches'
            # pages as it did when they ran on the writer's connection).
            conn = self._open(max(self._cache_kib // READERS, 1024))
            conn.execute("PRAGMA query_only = ON")
            self._readers.append(conn)
            return conn

    async def read(
        self, work: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kw: P.kwargs
    ) -> T:
        """``work(connection, *args)`` on a reading thread with a read-only connection: it
        sees what was committed when each of its statements began (a search's reads)."""

        def call() -> T:
            conn = self._reader()
            try:
                with count_errors((sqlite3.OperationalError,)):
                    return work(conn, *args, **kw)
            finally:
                self._free_readers.put(conn)

        return await asyncio.get_running_loop().run_in_executor(self._read_threads, call)

    async def run(
        self, work: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kw: P.kwargs
    ) -> T:
        """``work(connection, *args)`` on the database's thread."""

        def call() -> T:
            with count_errors((sqlite3.OperationalError,)):
                return work(self._connection(), *args, **kw)

        return await asyncio.get_running_loop().run_in_executor(self._thread, call)

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._closed = True

        if not self._closed:
            await asyncio.get_running_loop().run_in_executor(self._thread, shut)
        self._thread.shutdown(wait=False)
        await asyncio.to_thread(self._read_threads.shutdown, True)  # reads in flight end
        with self._readers_lock:
            self._closed = True
            for conn in self._readers:
                conn.close()
            self._readers.clear()


class Transaction:
    """``with Transaction(conn):`` one write transaction (BEGIN IMMEDIATE: the writer's lock
    at once), committed on leaving, rolled back when the block raises."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")


def ids(conn: sqlite3.Connection, query: str, *params: Any) -> list[Any]:
    """The first column of a query's rows."""
    return [row[0] for row in conn.execute(query, params)]
