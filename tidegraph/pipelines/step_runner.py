"""Running one step on one record with its metrics, retries and time budget.

A step's transient failures are retried with backoff (``tidegraph.pipelines.retry``), all its
attempts within one time budget (``TIDEGRAPH_RECORD_TIMEOUT_SECONDS``): a step that runs out of
it fails as ``timeout``. When the step gives up, its ``fallback`` (if it has one) says what the
chain goes on with (extraction: a text episode the LLM failed on is stored unextracted, docs
"Episodes without an LLM"); else the record fails with the reason of its last error.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tidegraph.metrics import IN_FLIGHT, STAGE_EVENTS, STAGE_LATENCY
from tidegraph.pipelines.outage import StoreOutage
from tidegraph.pipelines.outage import budget as outage_budget
from tidegraph.pipelines.retry import Attempted, RetryPolicy, with_retries
from tidegraph.processors.failures import STORE_MAY_BE_DOWN, Verdict
from tidegraph.processors.steps import Step
from tidegraph.records.episode import Episode
from tidegraph.records.outcome import Failure, Outcome
from tidegraph.records.stages import Processed

T = TypeVar("T")


async def timed(stage: str, call: Callable[[], Awaitable[T]], events: int = 1) -> T:
    """One attempt of a stage with its metrics. An answer of ``Processed`` counts as skipped,
    not ok; ``events``: how many records the attempt covers (counted once it succeeds)."""
    started = time.perf_counter()
    IN_FLIGHT.labels(stage).inc()
    try:
        result = await call()
    except Exception:
        STAGE_EVENTS.labels(stage, "error").inc()
        raise
    finally:
        IN_FLIGHT.labels(stage).dec()
        STAGE_LATENCY.labels(stage).observe(time.perf_counter() - started)
    STAGE_EVENTS.labels(stage, "skipped" if isinstance(result, Processed) else "ok").inc(events)
    return result


async def attempts(
    stage: str,
    call: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    budget: float,
    what: str = "",
    outage: StoreOutage | None = None,
) -> Attempted[T]:
    """``call`` with retries (``with_retries``), within ``budget`` seconds for all attempts
    (stopped while ``outage`` says the store is down)."""
    try:
        async with outage_budget(outage, budget) as limit:
            return await with_retries(stage, call, policy, what=what, outage=outage)
    except TimeoutError:
        if not limit.expired():
            raise
        error = TimeoutError(
            f"stage {stage} took longer than {budget:g} s on this record "
            "(TIDEGRAPH_RECORD_TIMEOUT_SECONDS)"
        )
        STAGE_EVENTS.labels(stage, "error").inc()
        return Attempted(error=error, verdict=Verdict(False, "timeout"), attempts=1)


async def run_step(
    step: Step[Any, Any],
    item: Any,
    episode: Episode,
    *,
    policy: RetryPolicy,
    budget: float,
    outage: StoreOutage | None = None,
) -> Outcome[Any]:
    """``step.run(item)`` as the episode's outcome: its value, ``processed``, the step's
    fallback when it gives up, or the failure. A failure the store may be behind, while the
    store does not answer, is not one: the step waits for the store and goes again
    (``StoreOutage.held``)."""
    what = f"group={episode.group_id} episode={episode.id}"
    while True:
        since = outage.outages if outage is not None else 0
        done = await attempts(
            step.stage,
            lambda: timed(step.stage, lambda: step.run(item)),
            policy=policy,
            budget=budget,
            what=what,
            outage=outage,
        )
        if done.ok or outage is None:
            break
        assert done.verdict is not None
        if done.verdict.reason not in STORE_MAY_BE_DOWN or not await outage.held(since):
            break
    if done.ok:
        if isinstance(done.value, Processed):
            return Outcome.already(episode, done.value.created_entities)
        return Outcome(episode, done.value)
    assert done.error is not None and done.verdict is not None
    fallback = getattr(step, "fallback", None)
    value = fallback(item, done.verdict.reason) if fallback is not None else None
    if value is not None:
        STAGE_EVENTS.labels(step.stage, "fallback").inc()
        return Outcome(episode, value)
    return Outcome.failed(
        episode, Failure.of(step.stage, done.error, done.verdict.reason, done.attempts)
    )
