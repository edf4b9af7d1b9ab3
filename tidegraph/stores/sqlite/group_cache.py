"""What the embedded store's searches keep between calls, per connection (``db.kept``: each
connection keeps what it sees), and the vector comparison: each (group, kind)'s embeddings as
one matrix (``GroupVectors``, ``VectorScores``) and whether a group holds most of a kind's
rows (``GroupShares``, for the fulltext query), both dropped at any committed change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from tidegraph.records.search import Kind
from tidegraph.stores.sqlite.db import FULLTEXT, kept
from tidegraph.stores.sqlite.driver import sqlite3

Scored = list[tuple[str, float]]  # (uuid, score), best first

# Each kind's embeddings: (table, column).
_EMBEDDINGS = {
    "fact": ("fact", "fact_embedding"),
    "entity": ("entity", "name_embedding"),
    "episode": ("episode", "content_embedding"),
    "community": ("community", "name_embedding"),
}


def data_version(conn: sqlite3.Connection) -> tuple[int, int]:
    """Changes whenever a change is committed, by this connection (``total_changes``) or
    another process (``PRAGMA data_version``)."""
    return conn.total_changes, conn.execute("PRAGMA data_version").fetchone()[0]


class GroupShares:
    """Whether a group holds most of a kind's rows (``holds_most``), kept while the
    database is unchanged (at most ``entries``). The fulltext query then leaves out the
    group's token: the FTS5 index is shared by every group, and matching the token reads
    the group's whole posting list (1 ms a query at 10,000 facts), while the words' matches
    in other groups, which the join drops, are then few."""

    def __init__(self, entries: int = 64) -> None:
        self.entries = entries
        self._kept: OrderedDict[tuple[str, str], tuple[tuple[int, int], bool]] = OrderedDict()

    def holds_most(self, conn: sqlite3.Connection, group_id: str, kind: Kind) -> bool:
        version = data_version(conn)
        found = self._kept.get((group_id, kind))
        if found is not None and found[0] == version:
            return found[1]
        table = FULLTEXT[kind][1]
        (mine,) = conn.execute(
            f"SELECT count(*) FROM {table} WHERE group_id = ?", (group_id,)
        ).fetchone()
        # The largest id: never fewer than the rows (ids are distinct positive integers),
        # so a group is never thought to hold most when it does not.
        (every,) = conn.execute(f"SELECT coalesce(max(id), 0) FROM {table}").fetchone()
        most = mine * 2 > every
        self._kept[(group_id, kind)] = (version, most)
        self._kept.move_to_end((group_id, kind))
        while len(self._kept) > self.entries:
            self._kept.popitem(last=False)
        return most


class GroupVectors:
    """Each (group, kind)'s embeddings as one matrix (with their uuids and norms), kept while
    the database is unchanged: a search then compares the query with the matrix instead of
    reading and decoding every vector of the group. Any committed change, by this connection
    (``total_changes``) or another process (``PRAGMA data_version``), makes every entry stale.
    Used on the database's thread only; at most ``entries`` matrices are kept."""

    def __init__(self, entries: int = 8) -> None:
        self.entries = entries
        self._kept: OrderedDict[tuple[str, str], tuple[tuple[int, int], list[str], Any]] = (
            OrderedDict()
        )

    def of(self, conn: sqlite3.Connection, group_id: str, kind: Kind) -> tuple[list[str], Any]:
        """(uuids, matrix with one row per uuid whose norms are 1 or 0)."""
        version = data_version(conn)
        found = self._kept.get((group_id, kind))
        if found is not None and found[0] == version:
            self._kept.move_to_end((group_id, kind))
            return found[1], found[2]
        table, column = _EMBEDDINGS[kind]
        rows = conn.execute(
            f"SELECT uuid, {column} FROM {table} WHERE group_id = ? AND {column} IS NOT NULL "
            "ORDER BY uuid",
            (group_id,),
        ).fetchall()
        uuids = [r[0] for r in rows]
        matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float64)
        matrix = matrix.reshape(len(rows), -1) if rows else matrix.reshape(0, 0)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        # Compared in float32: a search reads the whole matrix, and half the bytes is half
        # the time (scores agree with float64 to about 1e-7).
        matrix = (matrix / np.where(norms == 0, 1.0, norms)).astype(np.float32)
        self._kept[(group_id, kind)] = (version, uuids, matrix)
        self._kept.move_to_end((group_id, kind))
        while len(self._kept) > self.entries:
            self._kept.popitem(last=False)
        return uuids, matrix


@cache
def one_blas_thread() -> None:
    """Run numpy's BLAS on one thread, for the process, from the first vector comparison on.
    A search's comparison is one matrix-vector product: BLAS threads make it slower, not
    faster (they spin waiting for work on cores that serve other searches: at 10,000
    vectors, 2.9 ms with OpenBLAS's two threads against 0.17 ms with one), and setting the
    thread count around each product cost more than the product (0.8 ms), so it is set once
    and kept. The store's other numpy work (MMR's small products) runs as well on one."""
    ThreadpoolController().limit(limits=1, user_api="blas")


def group_vectors(conn: sqlite3.Connection) -> GroupVectors:
    """The connection's ``GroupVectors`` (each connection keeps its own: what it sees)."""
    return kept(conn, "vectors", GroupVectors)


def group_shares(conn: sqlite3.Connection) -> GroupShares:
    return kept(conn, "shares", GroupShares)


class VectorScores:
    """Every record of ``kind`` of the group with an embedding, scored ``(1 + cos) / 2``
    against ``vector``; ``best(k)`` the best k, best first (ties by uuid). Only the best are
    ever sorted (a group of 10,000 embeddings is scored in one matrix product)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        vectors: GroupVectors,
        group_id: str,
        kind: Kind,
        vector: Sequence[float],
    ) -> None:
        self.uuids, matrix = vectors.of(conn, group_id, kind)  # the uuids in order
        self.kept = len(self.uuids)  # how many are scored (``keep_only``)
        self.scores = np.zeros(0)
        if self.uuids:
            query = np.asarray(vector, dtype=np.float64)
            unit = (query / (np.linalg.norm(query) or 1.0)).astype(np.float32)
            one_blas_thread()
            cos = (matrix @ unit).astype(np.float64)
            self.scores = np.clip((1.0 + cos) / 2.0, 0.0, 1.0)

    def keep_only(self, uuids: set[str]) -> None:
        """Score only these records from now on (the others are never among the best)."""
        kept = np.fromiter((u in uuids for u in self.uuids), dtype=bool, count=len(self.uuids))
        self.scores = np.where(kept, self.scores, -np.inf)
        self.kept = int(kept.sum())

    def best(self, k: int) -> Scored:
        k = min(k, self.kept)
        if k <= 0:
            return []
        # Every score at least the k-th best (so ties at the cut are ordered by uuid too).
        kth = -np.partition(-self.scores, k - 1)[k - 1]
        candidates = np.flatnonzero(self.scores >= kth)
        best = self.scores[candidates]
        order = candidates[np.lexsort((candidates, -best))][:k]  # best first, ties by uuid
        uuids = [self.uuids[i] for i in order.tolist()]
        return list(zip(uuids, self.scores[order].tolist(), strict=True))
