"""A store that is down stops the line, not the record (docs/streaming.md "When the store is
down").

A record whose stage failed for a reason the store may be behind (``STORE_MAY_BE_DOWN``)
asks ``StoreOutage.held`` before the failure counts. The store is probed: when it answers,
the failure is the record's own (it counts, and a record that keeps failing ends as a dead
letter with its reason); when it does not, every caller waits for the same outage to end
(one warning when it starts, one line when it ends, metrics meanwhile) and then tries its
record again, from a fresh budget, with no attempt counted. Nothing is dead-lettered for the
store's fault, and since each group's records run in order, no later record of a group is
written while an earlier one waits.

While the store is down, the time budgets opened through ``budget`` (a record's, a unit's, a
worker job's) are stopped, and start over when it answers again, so that the records waiting
for the store do not run out of time. A failure of an attempt during which an outage began
is the store's too (``held(since=outages)``), even when the store answers by the time it is
looked at.
A caller waits at most ``hold_seconds`` from the outage's start; past it ``held`` raises
``StoreUnreachable``: the worker then stops without committing anything more (the records
come again to its successor), ``tidegraph ingest`` stops with one line, the servers answer
503 with ``Retry-After`` (their ``hold_seconds`` is 0: a client request does not wait).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from tidegraph.metrics import STORE_HELD, STORE_UNREACHABLE, STORE_UNREACHABLE_SECONDS
from tidegraph.stores.base import GraphStore
from tidegraph.stores.errors import StoreUnreachable

log = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[object]]
Listener = Callable[[bool], None]  # called with True when the store goes down, False when up

PROBE_GROUP = "tidegraph-health"  # read by the probe, never written
PROBE_TIMEOUT_SECONDS = 5.0
PROBE_BACKOFF_SECONDS = 0.5
PROBE_BACKOFF_MAX_SECONDS = 5.0


class StoreOutage:
    """The store's availability as this process sees it (see the module docstring); one per
    process, shared by every runner, hop, relay and timer of the process."""

    def __init__(
        self,
        probe: Probe,
        *,
        hold_seconds: float,
        probe_timeout: float = PROBE_TIMEOUT_SECONDS,
        backoff: float = PROBE_BACKOFF_SECONDS,
        backoff_max: float = PROBE_BACKOFF_MAX_SECONDS,
        what: str = "the graph store",
    ) -> None:
        self.probe = probe
        self.hold_seconds = hold_seconds
        self.probe_timeout = probe_timeout
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.what = what
        self._down_since: float | None = None
        self._up = asyncio.Event()
        self._up.set()
        self._prober: asyncio.Task[None] | None = None
        # Each open budget: its length, and whether the outage stopped it.
        self._budgets: dict[asyncio.Timeout, tuple[float, bool]] = {}
        self.outages = 0  # outages started so far (``held(since=...)``)
        self._listeners: list[Listener] = []
        self.last_error = ""

    # ------------------------------------------------------------------ state
    @property
    def down(self) -> bool:
        return self._down_since is not None

    def down_for(self) -> float:
        """Seconds since the store stopped answering (0 while it answers)."""
        return 0.0 if self._down_since is None else time.monotonic() - self._down_since

    def retry_after(self) -> int:
        """Seconds a client is told to wait before trying again (``Retry-After``)."""
        return max(1, round(min(self.backoff_max, max(self.backoff, self.down_for() / 4))))

    def listen(self, listener: Listener) -> None:
        """``listener(True)`` when an outage starts, ``listener(False)`` when it ends."""
        self._listeners.append(listener)

    # ------------------------------------------------------------------ callers
    async def held(self, since: int | None = None) -> bool:
        """After a failure the store may be behind: False when the store answers (the
        failure is the caller's own); else wait for the store (the outage every caller
        shares) and True once it answers again (try again, counting nothing). ``since``:
        ``outages`` when the failed attempt began; an outage since then (even one already
        over) makes the failure the store's too. Raises ``StoreUnreachable`` past
        ``hold_seconds`` of outage."""
        if not self.down:
            if since is not None and since != self.outages:
                return True
            if await self.answers():
                return False
            self._start()
        STORE_HELD.inc()
        try:
            await self._wait_up()
        finally:
            STORE_HELD.dec()
        return True

    async def check(self) -> bool:
        """Probe the store now (the worker's health timer); starts an outage when it does not
        answer, so that the budgets of records stuck on a frozen store stop at once. True
        when it answers."""
        if self.down:
            return False
        if await self.answers():
            return True
        self._start()
        return False

    def refuse_while_down(self) -> None:
        """Raise ``StoreUnreachable`` at once while an outage lasts (a server's write: the
        client is told to come back rather than held)."""
        if self.down:
            raise self._unreachable()

    async def wait_up(self) -> None:
        """Wait, without a limit, until the store answers (background loops: the relay,
        the community processor, the retention timer)."""
        await self._up.wait()

    @asynccontextmanager
    async def budget(self, seconds: float) -> AsyncIterator[asyncio.Timeout]:
        """``asyncio.timeout(seconds)`` that stops while the store is down (see the module
        docstring); the caller tells its expiry apart with ``expired()`` as usual."""
        async with asyncio.timeout(seconds) as limit:
            self._budgets[limit] = (seconds, False)
            if self.down:
                self._freeze(limit)
            try:
                yield limit
            finally:
                del self._budgets[limit]

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
            self._prober = None

    # ------------------------------------------------------------------ inside
    async def answers(self) -> bool:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation that
        # arrives as the probe finishes (https://github.com/python/cpython/issues/86296), and
        # then the prober would never stop.
        try:
            async with asyncio.timeout(self.probe_timeout):
                await self.probe()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure of the probe: the store does not answer
            self.last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return False
        return True

    async def _wait_up(self) -> None:
        assert self._down_since is not None or self._up.is_set()
        left = self.hold_seconds - self.down_for()
        if self._up.is_set():
            return
        if left <= 0:
            raise self._unreachable()
        try:
            async with asyncio.timeout(left):
                await self._up.wait()
        except TimeoutError:
            raise self._unreachable() from None

    def _unreachable(self) -> StoreUnreachable:
        return StoreUnreachable(
            f"{self.what} has not answered for {self.down_for():.0f} s ({self.last_error}); "
            f"nothing after the last written record was written",
            retry_after=self.retry_after(),
        )

    def _start(self) -> None:
        if self.down:
            return
        self._down_since = time.monotonic()
        self.outages += 1
        self._up.clear()
        STORE_UNREACHABLE.set(1)
        log.warning(
            "%s does not answer (%s): holding every record at the head of its group until it "
            "does (up to %.0f s, TIDEGRAPH_STORE_OUTAGE_LIMIT_SECONDS); nothing is "
            "dead-lettered for it",
            self.what, self.last_error, self.hold_seconds,
        )  # fmt: skip
        for limit in self._budgets:
            self._freeze(limit)
        self._tell(True)
        self._prober = asyncio.create_task(self._probe_until_up(), name="tidegraph-store-probe")

    async def _probe_until_up(self) -> None:
        delay = self.backoff
        while True:
            await asyncio.sleep(delay)  # backoff between probes, not a synchronisation
            if await self.answers():
                break
            delay = min(self.backoff_max, delay * 2)
        self._end()

    def _end(self) -> None:
        down = self.down_for()
        self._down_since = None
        self._prober = None
        STORE_UNREACHABLE.set(0)
        STORE_UNREACHABLE_SECONDS.inc(down)
        # A stopped budget starts over: what it had left may be too little for a store that
        # has just come back (and a query that waited through the outage).
        now = asyncio.get_running_loop().time()
        for limit, (length, stopped) in list(self._budgets.items()):
            if stopped:
                limit.reschedule(now + length)
                self._budgets[limit] = (length, False)
        log.info("%s answers again after %.1f s: going on in order", self.what, down)
        self._up.set()
        self._tell(False)

    def _freeze(self, limit: asyncio.Timeout) -> None:
        seconds, stopped = self._budgets[limit]
        if not stopped and limit.when() is not None and not limit.expired():
            self._budgets[limit] = (seconds, True)
            limit.reschedule(None)

    def _tell(self, down: bool) -> None:
        for listener in self._listeners:
            try:
                listener(down)
            except Exception:
                log.exception("an outage listener failed")


def budget(
    outage: StoreOutage | None, seconds: float
) -> AbstractAsyncContextManager[asyncio.Timeout]:
    """``outage.budget(seconds)``, or a plain ``asyncio.timeout`` without an outage tracker."""
    return outage.budget(seconds) if outage is not None else asyncio.timeout(seconds)


def store_outage(
    store: GraphStore, *, hold_seconds: float, what: str = "the graph store"
) -> StoreOutage:
    """The outage tracker of ``store`` (``what``: how the logs name it): its probe is one
    small read (whether a marker episode of a group of its own was processed)."""

    async def probe() -> None:
        await store.episode_processed(PROBE_GROUP, "probe")

    return StoreOutage(probe, hold_seconds=hold_seconds, what=what)
