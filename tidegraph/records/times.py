"""Time values: every datetime tidegraph keeps is aware UTC."""

from __future__ import annotations

from datetime import UTC, datetime


def utc(dt: datetime) -> datetime:
    """Aware UTC datetime (naive input is taken as UTC), truncated to microseconds."""
    if dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(dt: datetime | None) -> str | None:
    return None if dt is None else utc(dt).isoformat().replace("+00:00", "Z")


def now_for(_: object) -> datetime:
    """The ingestion time (T') of a write about anything: now. A forget's replay writes at
    each episode's original time instead (``Components.clock``)."""
    return utcnow()
