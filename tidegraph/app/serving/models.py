"""Request and response bodies of ``tidegraph serve`` and the MCP tools (docs/serving.md
"Serving memory to agents").

A search travels as ``SearchIn`` (the caller's words: time text, groups optional) until the
service resolves it into the one ``SearchRequest`` the searcher takes. Times are strings: ISO
8601 (a time without an offset is UTC), epoch seconds, or a phrase read relative to now
("2024-03-01", "yesterday"); a time that cannot be read is a 400 naming the field. Group ids
default to the caller's: a key bound to one group needs none. Errors have one shape,
``ErrorOut``.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal, get_args

import orjson
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from tidegraph.app.browse import MAX_PAGE, EpisodeStatus
from tidegraph.app.serving.settings import MAX_WAIT_SECONDS
from tidegraph.recall.recipes import RECIPES
from tidegraph.records.episode import MAX_ID_CHARS, GroupId
from tidegraph.records.forget import MAX_EPISODE_IDS, ForgetRequest
from tidegraph.records.ids import SURROGATE, id_problem
from tidegraph.records.search import DEFAULT_RECIPE, MAX_GROUPS, SearchQuery, SearchRequest

MAX_TOKENS = 32
MAX_TIME_CHARS = 100  # a longer text is no time (tidegraph/processors/temporal.py: MAX_TIME_TEXT)
MAX_CURSOR_CHARS = 2048  # an episode cursor (tidegraph/app/browse.py) is far shorter
MAX_SEQ = 2**63 - 1  # a change cursor is a seq: a 64-bit integer in both stores


# A number sent as text (a query string, or a JSON string) is read only when written as the
# docs write numbers: digits, a minus sign before them, a decimal point in a float. Pydantic
# alone also reads "+5", " 5" and "5_0" as 5.
_INTEGER_TEXT = re.compile(r"-?[0-9]+")
_FLOAT_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?")


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _plain_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        problems = []
        for name, field in cls.model_fields.items():
            value, kind = data.get(name), number_kind(field.annotation)
            if kind is not None and (problem := number_text_problem(kind, value)) is not None:
                error = PydanticCustomError(f"{kind.__name__}_parsing", problem)
                problems.append(InitErrorDetails(type=error, loc=(name,), input=value))
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, problems)
        return data


def number_kind(annotation: Any) -> type | None:
    """int or float when a field holds that number (possibly optional), else None."""
    for kind in get_args(annotation) or (annotation,):
        if kind is int or kind is float:
            return kind
    return None


def number_text_problem(kind: type, value: Any) -> str | None:
    """Why ``value``, sent as text for a number of ``kind``, is not read (None: it is read,
    or it is no text)."""
    if not isinstance(value, str):
        return None
    plain = _INTEGER_TEXT if kind is int else _FLOAT_TEXT
    if plain.fullmatch(value):
        return None
    what = "an integer" if kind is int else "a number (e.g. 2.5)"
    return (
        f"{value[:40]!r} is not {what} written in digits (no '+', spaces, underscores or exponent)"
    )


class AddEpisodeIn(Body):
    """One episode to remember: the envelope of ``tidegraph ingest`` and the input topic
    (docs/streaming.md "Topics"), with ``group_id`` defaulting to the key's group and the id
    optional."""

    content: str | dict[str, Any] = Field(
        description="What happened: text (source message/text) or a JSON object (source json)."
    )
    reference_time: str = Field(
        description="When it happened (ISO 8601, e.g. 2024-06-01T12:30:00Z). Required: facts "
        "are dated by it, so a missing time would silently date them to their arrival.",
        min_length=1,
        max_length=MAX_TIME_CHARS,
    )
    group_id: GroupId | None = Field(
        None,
        description="Whose memory (tenant), exactly as sent; default: the key's group when it "
        "has one.",
    )
    source: Literal["message", "text", "json"] | None = Field(
        None, description="message (a chat turn), text or json; default: json for an object, "
        "message for text.",
    )  # fmt: skip
    name: str = Field("", max_length=256, description="A short name for the episode.")
    source_description: str = Field("", max_length=1024, description="Where it came from.")
    episode_id: str | None = Field(
        None,
        max_length=256,
        validation_alias=AliasChoices("episode_id", "id"),
        description="Your id for it (also accepted as `id`, the envelope's name); adding the "
        "same id again is a no-op (safe retries). Default: a new one.",
    )


class AddEpisodeOut(BaseModel):
    """An add's answer; a failed one (422) is also the error shape (``error``,
    ``message``)."""

    error: str | None = Field(None, description="episode_failed when status is failed.")
    status: Literal["written", "skipped", "queued", "failed"]
    group_id: str
    episode_id: str
    episode_uuid: str
    token: str = Field(description="Pass it as wait_for to read your write.")
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    reason: str | None = Field(None, description="Why it failed (its dead-letter reason).")
    not_extracted: str | None = Field(
        None,
        description="Written as an episode (searchable) but no entities or facts come from "
        "it yet, and why (no_llm: text needs an LLM); message says what to do.",
    )
    message: str | None = None


class Waits(Body):
    """The writes a read must see first."""

    wait_for: list[str] = Field(
        default_factory=list,
        max_length=MAX_TOKENS,
        description="Tokens of added episodes (repeat the parameter in a query string): the "
        "read waits until they are queryable.",
    )
    wait_timeout_seconds: float | None = Field(
        None, gt=0, le=MAX_WAIT_SECONDS, description="Longest wait for wait_for (default 10)."
    )


class Times(Body):
    """The moment of a read, as text (ISO 8601, epoch seconds or a phrase)."""

    valid_at: str | None = Field(
        None, max_length=MAX_TIME_CHARS, description="Valid at this time (default: now)."
    )
    known_at: str | None = Field(
        None, max_length=MAX_TIME_CHARS, description="As known at this time (default: now)."
    )


class GroupIn(Body):
    """A read of one group."""

    group_id: GroupId | None = Field(None, description="Whose memory; default: the key's group.")


class GroupsIn(Body):
    """A read of several groups."""

    group_ids: list[GroupId] | None = Field(
        None,
        max_length=MAX_GROUPS,
        description="Groups to read (repeat the parameter in a query string); default: every "
        "group of the key.",
    )


def _exact_id(value: str) -> str:
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(f"episode id {value[:80]!r} {problem}; send it exactly as it was added")
    return value


def _text_only(value: str) -> str:
    if SURROGATE.search(value) or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
        raise ValueError("has control characters or a lone UTF-16 surrogate (not text)")
    return value


# An episode's id (the producer's, or its uuid) as every lifecycle route and tool takes it:
# 1-512 characters, kept exactly as sent (``id_problem``, the rule of every way in).
EpisodeId = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS), AfterValidator(_exact_id)]


class FactsIn(GroupIn, Waits, Times):
    """Facts of one group as of a time."""

    include_invalid: bool = Field(False, description="Every fact, valid or not.")


class SearchIn(GroupsIn, Waits, Times, SearchQuery):
    """A search as the caller sends it: ``SearchQuery`` with time text and optional groups."""

    recipe: str = Field(DEFAULT_RECIPE, description="Search recipe: " + ", ".join(RECIPES))

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, value: str) -> str:
        if value not in RECIPES:
            raise ValueError(f"unknown recipe {value!r}; choose one of: {', '.join(RECIPES)}")
        return value

    def request(
        self, group_ids: list[str], valid_at: datetime | None, known_at: datetime | None
    ) -> SearchRequest:
        """The ``SearchRequest`` of this search, once its groups and times are resolved."""
        asked = self.model_dump(include=set(SearchQuery.model_fields))
        return SearchRequest(**asked, group_ids=group_ids, valid_at=valid_at, known_at=known_at)


class ContextIn(SearchIn):
    max_chars: int = Field(4000, ge=200, le=100_000, description="Budget of the context text.")
    episodes: bool = Field(
        True, description="Include episode excerpts (true or false; false: facts, entities "
        "and communities only).",
    )  # fmt: skip


# ----------------------------------------------------------------------------- lifecycle
class ForgetIn(GroupIn):
    """What to forget in one group: the fields of ``ForgetRequest`` (the one spelling of the
    CLI, HTTP, MCP and the input topic; docs/architecture.md "Forgetting"), the group defaulting
    to the key's, and ``dry_run``. Exactly one of ``episode_ids``, ``subject`` and ``group``."""

    episode_ids: list[EpisodeId] = Field(
        default_factory=list,
        max_length=MAX_EPISODE_IDS,
        description="The episodes to forget, by the episode_id they were added with.",
    )
    subject: (
        Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS), AfterValidator(_text_only)]
        | None
    ) = Field(
        None,
        description="Every episode that mentions this entity (a person asking to be erased): "
        "its uuid, its key (a mapping's, e.g. crm:contact:7) or its exact name (letter case "
        "and spacing aside).",
    )
    group: bool = Field(False, description="The whole group (a tenant leaving).")
    purge: bool = Field(
        False,
        description="With group: the tombstones and the group's data keys too (a replay of "
        "the group's old records would then bring back those in clear; sealed ones can no "
        "longer be read).",
    )
    dry_run: bool = Field(
        False,
        description="Say what would go and write nothing (the MCP tool forget_memory "
        "defaults to true).",
    )

    def request(self, group_id: str) -> ForgetRequest:
        """The ``ForgetRequest`` of this body for ``group_id`` (its rules: ``ValidationError``
        when it names not exactly one target)."""
        return ForgetRequest(
            group_id=group_id,
            episode_ids=tuple(self.episode_ids),
            subject=self.subject,
            group=self.group,
            purge=self.purge,
        )


class ForgetEpisodeIn(GroupIn):
    """The query of ``DELETE /v1/episodes/{episode_id}``."""

    dry_run: bool = Field(False, description="Say what would go and write nothing.")


class EpisodeIn(GroupIn):
    """One episode of a group."""

    episode_id: EpisodeId = Field(description="The episode_id it was added with, or its uuid.")


class EpisodesIn(GroupIn):
    """A page of a group's episodes."""

    since: str | None = Field(
        None, max_length=MAX_TIME_CHARS, description="From this time (its reference_time)."
    )
    until: str | None = Field(
        None, max_length=MAX_TIME_CHARS, description="Before this time (its reference_time)."
    )
    status: EpisodeStatus | None = Field(
        None,
        description="written, not_extracted (stored, facts pending an LLM), forgotten "
        "(tombstones) or dead_lettered (read from the dead-letter topic); default: the stored "
        "ones (written and not_extracted).",
    )
    cursor: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_CURSOR_CHARS,
        description="The previous page's next_cursor, unchanged.",
    )
    limit: int = Field(100, ge=1, le=MAX_PAGE, description="Episodes per page.")
    content: bool = Field(False, description="With each episode's content.")


class ChangesIn(GroupIn):
    """A group's changes after a cursor (docs/streaming.md "Change stream")."""

    after: int = Field(
        0,
        ge=0,
        le=MAX_SEQ,
        description="The cursor: the last seq seen (the previous answer's cursor); 0 from the "
        "start of what the outbox keeps.",
    )
    limit: int = Field(100, ge=1, le=MAX_PAGE, description="Changes per answer.")
    wait_seconds: float = Field(
        0.0,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="A long poll: wait up to this long for the first change after the cursor "
        "(answered as soon as one is committed).",
    )


class SearchOut(BaseModel):
    query: str
    recipe: str
    group_ids: list[str]
    valid_at: str | None
    known_at: str
    time_phrase: str | None = Field(None, description="The time phrase that set valid_at.")
    results: list[dict[str, Any]]
    note: str | None = Field(
        None, description="Why facts may be missing (episodes waiting for an LLM)."
    )


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


class Problem(BaseModel):
    field: str
    message: str


class ErrorOut(BaseModel):
    """Every 4xx and 5xx answer has this shape, the server's own (malformed HTTP, a body over
    the limit or too slow, an unknown route, invalid JSON or UTF-8) included: 400 a time that
    cannot be read, a damaged token or a cursor this server did not give out, 401 no known
    key, 403 another tenant's group (named, never the key), 404, 405, 408 headers or body too
    slow, 409 read-your-writes (episode_pending, episode_dead_lettered) or a forget the memory
    cannot do as asked (forget_refused: no such subject, the LLM needed), 413 a body over
    TIDEGRAPH_SERVE_MAX_BODY_BYTES, 422 a field that is not valid (or a failed add: error
    episode_failed with the episode's fields), 429 too many waiting requests of one key, 503
    unavailable: the store could not answer now (a transient error such as Neo4j out of
    transaction memory, tried twice), with a Retry-After header."""

    error: str = Field(description="A stable code: invalid, forbidden, too_large, ...")
    message: str = Field(description="What is wrong and what to do, for a person.")
    field: str | None = Field(None, description="The request field at fault (dotted).")
    problems: list[Problem] | None = Field(None, description="A 422's every field problem.")
    group_id: str | None = Field(None, description="The group a 403 refused.")
    episodes: list[dict[str, Any]] | None = Field(
        None, description="A 409's episodes and their states (queued, dead_lettered, failed)."
    )
    retry_after_seconds: int | None = Field(
        None, description="A 503's wait before asking again (also its Retry-After header)."
    )


def error_body(error: str, message: str, **extra: Any) -> bytes:
    """The JSON of an ``ErrorOut``."""
    return orjson.dumps(
        {"error": error, "message": message, **{k: v for k, v in extra.items() if v is not None}}
    )


async def send_error(
    send: Any, status: int, error: str, message: str, headers: list[tuple[bytes, bytes]]
) -> None:
    """An ``ErrorOut`` answered straight from ASGI middleware (before any route runs)."""
    body = error_body(error, message)
    start = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})
