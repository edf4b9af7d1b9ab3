"""Bounded retries with jittered exponential backoff, per record and stage."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from tidegraph.metrics import RETRIES, STAGE_EVENTS
from tidegraph.pipelines.outage import StoreOutage
from tidegraph.processors.failures import STORE_MAY_BE_DOWN, Verdict, classify

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    backoff: float = 0.5
    backoff_max: float = 8.0

    def delay(self, attempt: int) -> float:
        """Wait after failed attempt ``attempt`` (1-based): half fixed, half jitter."""
        ceiling = min(self.backoff_max, self.backoff * 2 ** (attempt - 1))
        return ceiling / 2 + random.uniform(0, ceiling / 2)


@dataclass
class Attempted(Generic[T]):
    """The outcome of a retried call: ``value``, or the last ``error`` with its verdict."""

    value: T | None = None
    error: BaseException | None = None
    verdict: Verdict | None = None
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


async def with_retries(
    stage: str,
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    what: str = "",
    outage: StoreOutage | None = None,
) -> Attempted[T]:
    """Run ``call``; retry transient failures up to ``policy.max_attempts`` attempts.
    Never raises (except cancellation): the caller dead-letters a failed outcome. With
    ``outage``, a failure the store may be behind ends the retries at once when the store
    does not answer (the caller waits for it: ``StoreOutage.held``)."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return Attempted(value=await call(), attempts=attempt)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            verdict = classify(exc)
            if (
                outage is not None
                and verdict.reason in STORE_MAY_BE_DOWN
                and not await outage.check()
            ):
                return Attempted(error=exc, verdict=verdict, attempts=attempt)
            if not verdict.transient or attempt >= policy.max_attempts:
                return Attempted(error=exc, verdict=verdict, attempts=attempt)
            wait = policy.delay(attempt)
            RETRIES.labels(stage, verdict.reason).inc()
            STAGE_EVENTS.labels(stage, "retried").inc()
            log.warning(
                "retry stage=%s %s reason=%s attempt=%d/%d wait=%.2fs error=%s: %s",
                stage, what, verdict.reason, attempt, policy.max_attempts, wait,
                type(exc).__name__, exc,
            )  # fmt: skip
            await asyncio.sleep(wait)
