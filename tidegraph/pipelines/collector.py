"""The garbage collector of a long-running process: a server, a worker, ``tidegraph ingest``.

Its default thresholds suit short scripts. A process that holds many objects for a long time
(the modules, the store's caches, an ingest's episodes read at once) and allocates and frees
many more per request or record pays for them in every full collection, which walks every
object the collector sees: about 160 ms at 10,000 episodes in a server (most of the p99 of
search), and about a sixth of the client's CPU of an in-process ingest (profiled, 3,000 mapped
records: 1.1 of 6.7 CPU-seconds; docs/performance.md).
"""

from __future__ import annotations

import gc

# Container objects allocated (net) between young collections once settled. A search or a
# unit of records allocates thousands and frees nearly all by reference counting, so the
# default (700) ran a young collection every few searches or records.
GEN0_THRESHOLD = 20_000


def settle_collector() -> None:
    """Once a process has started, and again as it starts its main work: what it has
    allocated so far is moved out of the collector's sight (``gc.freeze``) and young
    collections are made rarer. Cycles are still collected. Only for a process that runs
    tidegraph as its own (never from a library call: it changes the whole process)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, older, oldest)
