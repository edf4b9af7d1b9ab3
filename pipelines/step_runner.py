"""Running steps on one record: what the Faust hops (``tidegraph.pipelines.streaming.handlers``) and
the in-process
chain (``tidegraph.pipelines.inprocess``) share, so that both count, retry and give up alike.

Each step runs with its metrics (``timed``), its transient failures retried with backoff
(``tidegraph.pipelines.retry``), and a time budget for all its attempts
(``TIDEGRAPH_RECORD_TIMEOUT_SECONDS``): a step that runs out of it fails as ``timeout``. The
first failure stops the record, unless the step has a ``fallback`` for it (extraction: an
episode the LLM failed on is stored unextracted, README "Episodes without an LLM"); a step
that answers ``Processed`` (already processed) ends it too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tidegraph.metrics import IN_FLIGHT, STAGE_EVENTS, STAGE_LATENCY
from tidegraph.pipelines.retry import Attempted, RetryPolicy, with_retries
from tidegraph.processors.failures import StageError, Verdict, root_cause
from tidegraph.processors.steps import Step
from tidegraph.records.stages import Processed

T = TypeVar("T")


@dataclass(frozen=True)
class StepFailure:
    """The step a record failed at, its error (the root cause), and why."""

    stage: str
    error: BaseException
    reason: str
    attempts: int


@dataclass
class ChainResult:
    """What running steps on one record gave: the last step's output, or the ``Processed``
    answer of the step that found the episode processed, or the failure."""

    value: Any = None
    processed: Processed | None = None
    failure: StepFailure | None = None


async def timed(stage: str, call: Callable[[], Awaitable[T]], events: int = 1) -> T:
    """One attempt of a stage with its metrics; failures wrapped in StageError (the stage
    names the dead letter). An answer of ``Processed`` counts as skipped, not ok; ``events``:
    how many records the attempt covers (counted once it succeeds)."""
    started = time.perf_counter()
    IN_FLIGHT.labels(stage).inc()
    try:
        result = await call()
    except Exception as exc:
        STAGE_EVENTS.labels(stage, "error").inc()
        raise StageError(stage, exc) from exc
    finally:
        IN_FLIGHT.labels(stage).dec()
        STAGE_LATENCY.labels(stage).observe(time.perf_counter() - started)
    STAGE_EVENTS.labels(stage, "skipped" if isinstance(result, Processed) else "ok").inc(events)
    return result


async def run_step(
    step: Step[Any, Any], item: Any, *, policy: RetryPolicy, budget: float, what: str = ""
) -> Attempted[Any]:
    """``step.run(item)`` with retries, within ``budget`` seconds for all its attempts."""
    limit = asyncio.timeout(budget)
    try:
        async with limit:
            return await with_retries(
                step.stage, lambda: timed(step.stage, lambda: step.run(item)), policy, what=what
            )
    except TimeoutError:
        if not limit.expired():
            raise
        error = TimeoutError(
            f"stage {step.stage} took longer than {budget:g} s on this record "
            "(TIDEGRAPH_RECORD_TIMEOUT_SECONDS)"
        )
        STAGE_EVENTS.labels(step.stage, "error").inc()
        return Attempted(error=error, verdict=Verdict(False, "timeout"), attempts=1)


async def run_steps(
    steps: Sequence[Step[Any, Any]],
    item: Any,
    *,
    policy: RetryPolicy,
    budget: float,
    what: str = "",
) -> ChainResult:
    """``item`` through ``steps`` in order, each as ``run_step``."""
    for step in steps:
        outcome = await run_step(step, item, policy=policy, budget=budget, what=what)
        if not outcome.ok:
            assert outcome.error is not None and outcome.verdict is not None
            fallback = getattr(step, "fallback", None)
            value = fallback(item, outcome.verdict.reason) if fallback is not None else None
            if value is not None:
                STAGE_EVENTS.labels(step.stage, "fallback").inc()
                item = value
                continue
            failure = StepFailure(
                step.stage, root_cause(outcome.error), outcome.verdict.reason, outcome.attempts
            )
            return ChainResult(failure=failure)
        if isinstance(outcome.value, Processed):
            return ChainResult(processed=outcome.value)
        item = outcome.value
    return ChainResult(value=item)
