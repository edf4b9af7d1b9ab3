"""Time fields of requests: ISO 8601 read at once, phrases ("last March") read by dateparser
(~50 ms for 100 characters) one at a time off the event loop, so a tenant sending many never
holds the loop (/healthz, other tenants' reads)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from tidegraph.app.serving.errors import BadRequest
from tidegraph.records.errors import BadTime
from tidegraph.records.times import utcnow, within_range

_TIME_PHRASES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidegraph-times")


async def when(value: str | None, field: str) -> datetime | None:
    """A time field of a request (ISO 8601 read at once, a phrase off the event loop), or a
    400 naming the field."""
    from tidegraph.processors.temporal import read_when

    if value is None:
        return None
    try:
        return within_range(datetime.fromisoformat(value.strip().replace("Z", "+00:00")))
    except ValueError:
        pass  # not ISO 8601 (epoch seconds or a phrase), or out of range: read_when says so
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(_TIME_PHRASES, read_when, value, utcnow())
    except BadTime as exc:
        raise BadRequest(
            f"{field}: {exc} (use ISO 8601, e.g. 2024-06-01T12:30:00Z)", field=field
        ) from None


async def warm_time_phrases() -> None:
    """Read phrases now (English, then one that needs dateparser's language detection), off
    the event loop, so that a first request's phrase does not load dateparser's data."""
    await when("yesterday", "warm-up")
    asyncio.get_running_loop().run_in_executor(
        _TIME_PHRASES, _read_quietly, "hace 3 días"
    )  # not awaited: the server answers meanwhile


def _read_quietly(text: str) -> None:
    from tidegraph.processors.temporal import parse_when

    parse_when(text, utcnow())
