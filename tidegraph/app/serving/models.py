"""Request and response bodies of ``tidegraph serve`` (docs/serving.md "Serving memory to agents").

Times are strings: ISO 8601 (a time without an offset is UTC), epoch seconds, or a phrase
read relative to now ("2024-03-01", "yesterday"); a time that cannot be read is a 400 naming
the field. Group ids default to the caller's: a key bound to one group needs none.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tidegraph.app.serving.settings import MAX_WAIT_SECONDS
from tidegraph.recall.recipes import DEFAULT_RECIPE, RECIPES

MAX_QUERY_CHARS = 2000
MAX_LIMIT = 100
MAX_TOKENS = 32


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AddEpisodeIn(Body):
    """One episode to remember."""

    content: str | dict[str, Any] = Field(
        description="What happened: text (source message/text) or a JSON object (source json)."
    )
    reference_time: str = Field(
        description="When it happened (ISO 8601, e.g. 2024-06-01T12:30:00Z). Required: facts "
        "are dated by it, so a missing time would silently date them to their arrival.",
        min_length=1,
        max_length=100,
    )
    group_id: str | None = Field(
        None, description="Whose memory (tenant); default: the key's group when it has one."
    )
    source: Literal["message", "text", "json"] = Field(
        "message", description="message (a chat turn), text or json."
    )
    name: str = Field("", max_length=256, description="A short name for the episode.")
    source_description: str = Field("", max_length=1024, description="Where it came from.")
    episode_id: str | None = Field(
        None,
        max_length=256,
        description="Your id for it; adding the same id again is a no-op (safe retries).",
    )


class AddEpisodeOut(BaseModel):
    status: Literal["written", "skipped", "queued", "failed"]
    group_id: str
    episode_id: str
    episode_uuid: str
    token: str = Field(description="Pass it as wait_for to read your write.")
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    reason: str | None = None
    message: str | None = None


class ReadIn(Body):
    """What every read may carry: whose memory, and the writes it must see."""

    group_ids: list[str] | None = Field(
        None, max_length=64, description="Groups to read; default: every group of the key."
    )
    wait_for: list[str] = Field(
        default_factory=list,
        max_length=MAX_TOKENS,
        description="Tokens of added episodes: the read waits until they are queryable.",
    )
    wait_timeout_seconds: float | None = Field(
        None, gt=0, le=MAX_WAIT_SECONDS, description="Longest wait for wait_for (default 10)."
    )


class SearchIn(ReadIn):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="What to recall.")
    valid_at: str | None = Field(None, description="Valid at this time (default: now).")
    known_at: str | None = Field(None, description="As known at this time (default: now).")
    recipe: str = Field(DEFAULT_RECIPE, description="Search recipe: " + ", ".join(RECIPES))
    limit: int | None = Field(None, ge=1, le=MAX_LIMIT, description="Results per kind.")
    include_invalid: bool = Field(False, description="Also facts that have ended.")
    centre: str | None = Field(None, description="Entity uuid the distance recipes rank from.")

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, value: str) -> str:
        if value not in RECIPES:
            raise ValueError(f"unknown recipe {value!r}; choose one of: {', '.join(RECIPES)}")
        return value


class ContextIn(SearchIn):
    max_chars: int = Field(4000, ge=200, le=100_000, description="Budget of the context text.")
    episodes: bool = Field(True, description="Include episode excerpts.")


class SearchOut(BaseModel):
    query: str
    recipe: str
    group_ids: list[str]
    valid_at: str | None
    known_at: str
    time_phrase: str | None = Field(None, description="The time phrase that set valid_at.")
    results: list[dict[str, Any]]


class ContextOut(BaseModel):
    context: str
    results: int


class EpisodeStatusOut(BaseModel):
    group_id: str
    episode_id: str
    episode_uuid: str
    status: Literal["written", "not_extracted", "queued", "dead_lettered", "failed", "unknown"]
    detail: str
    reason: str | None = None
    message: str | None = None
    stage: str | None = None


class ErrorOut(BaseModel):
    error: str
    message: str
    field: str | None = None
    group_id: str | None = None
    episodes: list[dict[str, Any]] | None = None


async def send_error(
    send: Any, status: int, error: str, message: str, headers: list[tuple[bytes, bytes]]
) -> None:
    """A JSON error answered straight from ASGI middleware (before any route runs): the same
    ``{"error", "message"}`` body the routes answer with."""
    body = orjson.dumps({"error": error, "message": message})
    start = [(b"content-type", b"application/json"), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})
