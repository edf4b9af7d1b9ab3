"""The SQLite the embedded store runs on, chosen here only: every module of the store (and
its tests) imports ``sqlite3`` from this module.

It is sqlean.py's build (``import sqlean``: the standard library's ``sqlite3`` module over a
current SQLite with FTS5 compiled in, wheels for Linux, macOS and Windows), not the SQLite
Python links, which may be older than 3.44: FTS5's ``secure-delete`` option, which a forget
relies on to leave no word of the rows it deleted in the full-text indexes (``erasure.py``),
came in 3.44. The module's API is the standard library's, so the type checker reads that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import sqlite3
else:
    import sqlean as sqlite3

# FTS5's ``secure-delete`` option (erasure.py).
MINIMUM_VERSION = (3, 44, 0)

if sqlite3.sqlite_version_info < MINIMUM_VERSION:  # pragma: no cover - a wrong install only
    raise ImportError(
        f"the embedded store needs SQLite {'.'.join(map(str, MINIMUM_VERSION))} or later and "
        f"the installed sqlean.py has {sqlite3.sqlite_version}: run `pip install -U sqlean.py`"
    )

__all__ = ["MINIMUM_VERSION", "sqlite3"]
