"""A request to forget, the one spelling the CLI, the HTTP and MCP servers and the input topic
share (docs/architecture.md "Forgetting").

On the input topic it is an object with one key, ``forget`` (keyed by its group like every
record there, so that it runs in the group's order):

    {"forget": {"group_id": "acme", "episode_ids": ["zendesk:ticket-88:comment-3"]}}
    {"forget": {"group_id": "acme", "subject": "<entity uuid>"}}
    {"forget": {"group_id": "acme", "group": true}}          # "purge": true: tombstones too

Exactly one of ``episode_ids`` (producer ids), ``subject`` (every episode that mentions the
entity) and ``group`` (the whole group) says what goes.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tidegraph.records.episode import (
    MAX_GROUP_ID_CHARS,
    MAX_ID_CHARS,
    Episode,
    parse_episode,
)
from tidegraph.records.errors import InvalidEpisode

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_EPISODE_IDS = 10_000


class ForgetRequest(BaseModel):
    """What to forget in one group (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group_id: str = Field(min_length=1, max_length=MAX_GROUP_ID_CHARS)
    episode_ids: tuple[str, ...] = Field(default=(), max_length=MAX_EPISODE_IDS)
    subject: str | None = Field(None, min_length=1, max_length=MAX_ID_CHARS)
    group: bool = False
    purge: bool = False

    @field_validator("group_id")
    @classmethod
    def _exact(cls, v: str) -> str:
        if v != v.strip() or _CONTROL.search(v):
            raise ValueError(
                "group_id has leading/trailing spaces or control characters; it is kept "
                "exactly as sent"
            )
        return v

    @field_validator("episode_ids")
    @classmethod
    def _ids(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for ident in v:
            if not ident or len(ident) > MAX_ID_CHARS:
                raise ValueError(f"episode ids are 1 to {MAX_ID_CHARS} characters")
        return tuple(dict.fromkeys(v))

    @model_validator(mode="after")
    def _one_target(self) -> ForgetRequest:
        named = sum([bool(self.episode_ids), self.subject is not None, self.group])
        if named != 1:
            raise ValueError("name exactly one of episode_ids, subject or group: true")
        if self.purge and not self.group:
            raise ValueError("purge applies to a whole group (group: true)")
        return self


def parse_record(raw: bytes | str) -> Episode | ForgetRequest:
    """A record of the input topic: an episode envelope, or a forget request. Raises
    InvalidEpisode with the dead-letter reason of the first problem found."""
    try:
        data: Any = orjson.loads(raw) if raw and raw.strip() else None
    except orjson.JSONDecodeError:
        data = None  # parse_episode says why
    if isinstance(data, dict) and set(data) == {"forget"}:
        try:
            return ForgetRequest.model_validate(data["forget"])
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'forget'}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False)
            )
            raise InvalidEpisode(
                f"invalid forget request: {problems}", reason="invalid_forget"
            ) from None
    return parse_episode(raw)
