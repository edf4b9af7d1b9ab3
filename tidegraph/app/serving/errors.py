"""The errors of the serving layer, one type for every refusal: each carries its HTTP status, a
machine-readable code and a message that says what to do. The HTTP layer turns them into the
one error body (docs/serving.md "Errors"), the MCP layer into tool errors."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from tidegraph.app.serving.tokens import EpisodeState
from tidegraph.records.episode import MAX_ID_CHARS
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.ids import id_problem
from tidegraph.stores.errors import StoreUnreachable


class ServiceError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = {k: v for k, v in extra.items() if v is not None}

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, **self.extra}


class BadRequest(ServiceError):
    status, code = 400, "bad_request"


class Invalid(ServiceError):
    status, code = 422, "invalid"


class Forbidden(ServiceError):
    status, code = 403, "forbidden"


class NotFound(ServiceError):
    status, code = 404, "not_found"


class TooManyWaits(ServiceError):
    status, code = 429, "too_many_waits"


class ForgetRefused(ServiceError):
    """A forget the memory cannot do as asked (``ForgetError``: no such subject, several
    entities of that name, the LLM needed to replay, the group kept being written)."""

    status, code = 409, "forget_refused"


class NotQueryable(ServiceError):
    """A read's wait_for episodes are not all queryable (still queued, or never will be)."""

    status = 409

    def __init__(self, states: list[EpisodeState], waited: float, *, kafka: bool) -> None:
        dead = [s for s in states if s.state in ("dead_lettered", "failed")]
        self.code = "episode_dead_lettered" if dead else "episode_pending"
        pending = sum(s.state == "queued" for s in states)
        if dead:
            first = dead[0]
            message = (
                f"episode {first.token.episode_uuid} of group {first.token.group_id} will not "
                f"be queryable: it failed at {first.stage} ({first.reason}): {first.message}"
            )
        elif kafka:
            message = (
                f"{pending} episode(s) not queryable after waiting {waited:.1f}s: still "
                "queued for the workers; retry the read, or wait longer "
                "(wait_timeout_seconds, at most 60)"
            )
        else:
            message = (
                f"{pending} episode(s) are not in the store: this server writes in-process "
                "and its adds are queryable as soon as they answer, so these tokens are of "
                "episodes never added here (or of another store)"
            )
        super().__init__(message, episodes=[s.as_json() for s in states])


class ServiceUnavailable(ServiceError):
    """503; with ``retry_after_seconds`` (in the body) the ``Retry-After`` header too."""

    status, code = 503, "unavailable"


def store_down(exc: StoreUnreachable) -> ServiceUnavailable:
    """The 503 of a request the store cannot answer now (a write or forget: nothing of it
    was written)."""
    return ServiceUnavailable(
        f"{exc}: nothing was written; send it again in {exc.retry_after} s",
        retry_after_seconds=exc.retry_after,
    )


def check_episode_id(episode_id: str) -> None:
    problem = id_problem(episode_id) if episode_id else "is empty"
    if problem is None and len(episode_id) > MAX_ID_CHARS:
        problem = f"is over {MAX_ID_CHARS} characters"
    if problem is not None:
        raise Invalid(f"episode id {episode_id[:80]!r} {problem}", field="episode_id")


def invalid_from(exc: ValidationError) -> Invalid:
    """A 422 of a request's rules (``ForgetRequest``'s), field by field."""
    problems = [
        {
            "field": ".".join(str(p) for p in e["loc"]) or "body",
            "message": str(e["msg"]).removeprefix("Value error, "),
        }
        for e in exc.errors(include_url=False, include_input=False)
    ]
    first = problems[0]
    return Invalid(f"{first['field']}: {first['message']}", field=first["field"], problems=problems)


def field_of(exc: InvalidEpisode) -> str:
    reason = getattr(exc, "reason", "")
    return {
        "invalid_id": "episode_id",
        "invalid_group_id": "group_id",
        "bad_timestamp": "reference_time",
    }.get(reason, "content")
