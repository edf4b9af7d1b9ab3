"""How long a fetch of the worker's consumer may wait at the broker for new records, and for
how much.

faust-streaming 0.15 builds the worker's aiokafka consumer with ``fetch_max_wait_ms=1500``,
fixed in its driver. aiokafka sends one fetch at a time to a broker, and leaves out of it
every partition whose records it already holds and the worker has not taken yet. A fetch made
up only of partitions that have nothing new (an idle input topic, a partition whose records
were all read) is held by the broker for that whole wait; the partitions left out meanwhile
are not fetched again until it returns, even once their records have been taken. The worker
reads several topics through that one consumer (its input topic, ``{prefix}.extracted``,
declared sources), so its stages ran out of records for up to 1.5 s at a time while Kafka held
more for them (docs/performance.md "Sources": the write hop idle, the records of
``{prefix}.extracted`` waiting behind a fetch of the idle ``{prefix}.episodes``).

``bound_fetch`` sets the consumer's wait to ``TIDEGRAPH_FETCH_MAX_WAIT_SECONDS`` before it
starts: a fetch of idle partitions returns after that, and the next one takes in the
partitions read meanwhile. An idle worker sends a fetch that often instead of every 1.5 s.

It also sets how many bytes a fetch waits for (``TIDEGRAPH_FETCH_MIN_BYTES``, Kafka's
``fetch.min.bytes``, 16 KiB). With aiokafka's default of 1 the broker answers as soon as one
record is there, so under a steady feed the worker sent a fetch for every few records. With
more, the broker holds a fetch until that much arrived or the wait above passed: fewer fetches
for the same records, and a record of a quiet feed up to that wait later per hop
(docs/performance.md "Fewer fetches (thirteenth stop)").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def bound_fetch(consumer: Any, max_wait_seconds: float, min_bytes: int) -> None:
    """Wrap the Faust consumer's creation of its aiokafka consumer (``_create_consumer`` of
    its consumer thread, called once when the thread starts) so that the fetches it sends
    wait at the broker for ``min_bytes``, at most ``max_wait_seconds``."""
    thread = consumer._thread
    create: Callable[..., Any] = thread._create_consumer

    def create_consumer(*args: Any, **kwargs: Any) -> Any:
        kafka_consumer = create(*args, **kwargs)
        # aiokafka reads it when the consumer starts (its Fetcher), right after this
        kafka_consumer._fetch_max_wait_ms = max(1, round(max_wait_seconds * 1000))
        kafka_consumer._fetch_min_bytes = min_bytes
        return kafka_consumer

    thread._create_consumer = create_consumer
