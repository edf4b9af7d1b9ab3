"""Response caches for the LLM client: replaying the same prompt costs nothing.

A cache maps a key (a hex digest computed by the client from model, schema and prompt) to the
raw content of a validated answer. Only successful, validated answers are stored.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path


class ResponseCache(ABC):
    """Key -> bytes store used by ``LLMClient``.

    ``blocking`` tells the client whether ``get``/``put`` may block (disk, network): blocking
    caches are called from a worker thread so the event loop never waits on them.
    """

    blocking: bool = True

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The stored value, or None."""

    @abstractmethod
    def put(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (replacing any previous value)."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release resources; the cache is not used afterwards."""


class MemoryResponseCache(ResponseCache):
    """An in-process dict; for tests and one-off runs."""

    blocking = False

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._data.get(key)

    def put(self, key: str, value: bytes) -> None:
        with self._lock:
            self._data[key] = value

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


class SqliteResponseCache(ResponseCache):
    """A SQLite file (WAL mode): survives restarts and can be shared by several processes.

    One connection guarded by a lock, so it is safe to call from worker threads (the client
    does so via ``asyncio.to_thread``). Every statement is a single short autocommit write or
    read; concurrent writers from other processes wait up to ``busy_timeout`` seconds.
    """

    def __init__(self, path: str | Path, *, busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS llm_responses ("
            " key TEXT PRIMARY KEY, value BLOB NOT NULL, created_at REAL NOT NULL"
            ") WITHOUT ROWID"
        )

    def get(self, key: str) -> bytes | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT value FROM llm_responses WHERE key = ?", (key,)
            ).fetchone()
        return bytes(row[0]) if row else None

    def put(self, key: str, value: bytes) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO llm_responses (key, value, created_at) VALUES (?, ?, ?)",
                (key, value, time.time()),
            )

    def __len__(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT count(*) FROM llm_responses").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()
