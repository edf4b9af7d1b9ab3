"""Read-your-writes (docs/serving.md "Serving memory to agents"): the token an add returns, the
state of
an added episode, and the bounded wait until added episodes are queryable.

An episode is queryable once its processed marker is in the store
(``GraphStore.episode_processed``). Until then it is ``queued`` (in Kafka, or in no place this
server can see), unless a dead letter names it (``dead_lettered``, with the stage's reason) or
it failed in this process (``failed``). Nothing here sleeps as synchronisation: the wait polls
the store with backoff, and the dead-letter topic less often, until a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import orjson

from tidegraph.records.ids import id_problem, stable_uuid
from tidegraph.records.times import utcnow, within_range
from tidegraph.settings import Settings
from tidegraph.stores.base import GraphStore

TOKEN_PREFIX = "rw1."
CLOCK_SKEW = timedelta(minutes=2)  # between this server's clock and the workers'
REMEMBERED_FAILURES = 10_000

State = Literal["written", "queued", "dead_lettered", "failed"]


class BadToken(ValueError):
    """A wait_for value that is not a token an add returned."""


@dataclass(frozen=True)
class Token:
    """An added episode: its group and uuid; via Kafka also where it was sent and when."""

    group_id: str
    episode_uuid: str
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    sent_at_ms: int | None = None

    def encode(self) -> str:
        data: dict[str, Any] = {"g": self.group_id, "u": self.episode_uuid}
        if self.topic is not None:
            data.update(t=self.topic, p=self.partition, o=self.offset, s=self.sent_at_ms)
        return TOKEN_PREFIX + base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Token:
        if not isinstance(text, str) or not text.startswith(TOKEN_PREFIX):
            raise BadToken("not a token returned by POST /v1/episodes (they start with rw1.)")
        body = text[len(TOKEN_PREFIX) :]
        damaged = BadToken("a damaged token: pass it exactly as POST /v1/episodes returned it")
        try:
            data = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (ValueError, TypeError):
            raise damaged from None
        # A token is read back from the caller: every field is checked for its type (a
        # forged {"t": [1]} is as damaged as bad base64).
        if not isinstance(data, dict) or set(data) - {"g", "u", "t", "p", "o", "s"}:
            raise damaged
        group_id, uuid = data.get("g"), data.get("u")
        if not (isinstance(group_id, str) and isinstance(uuid, str)):
            raise damaged
        if not (_text(group_id) and _text(uuid)) or id_problem(group_id) is not None:
            raise damaged
        topic = data.get("t")
        numbers = [data.get(k) for k in ("p", "o", "s")]
        if topic is not None and not _text(topic):
            raise damaged
        if not all(n is None or (type(n) is int and 0 <= n < 2**63) for n in numbers):
            raise damaged
        if numbers[2] is not None:  # the send time (ms): a time like any a client sends
            try:
                within_range(datetime.fromtimestamp(numbers[2] / 1000, UTC))
            except (ValueError, OverflowError, OSError):
                raise damaged from None
        return cls(group_id, uuid, topic, *numbers)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"group_id": self.group_id, "episode_uuid": self.episode_uuid}
        if self.topic is not None:
            out.update(topic=self.topic, partition=self.partition, offset=self.offset)
        return out


def _text(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 512


def episode_uuid_of(group_id: str, episode_id: str) -> str:
    """The stored uuid of the episode a producer called ``episode_id`` (``Episode.uuid``)."""
    return stable_uuid("episode", group_id, episode_id)


@dataclass
class EpisodeState:
    token: Token
    state: State
    reason: str | None = None
    message: str | None = None
    stage: str | None = None

    def as_json(self) -> dict[str, Any]:
        out = {**self.token.as_json(), "state": self.state}
        for key in ("reason", "message", "stage"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class Tracker:
    """Where added episodes stand: the store's markers, this process's failures (in-process
    adds) and, via Kafka, the dead-letter topic."""

    def __init__(self, store: GraphStore, settings: Settings, *, kafka: bool) -> None:
        self.store = store
        self.settings = settings
        self.kafka = kafka
        self._failures: OrderedDict[tuple[str, str], tuple[str, str, str]] = OrderedDict()

    def failed(self, group_id: str, episode_uuid: str, stage: str, reason: str, message: str):
        self._failures[group_id, episode_uuid] = (stage, reason, message)
        while len(self._failures) > REMEMBERED_FAILURES:
            self._failures.popitem(last=False)

    def local_failure(self, token: Token) -> EpisodeState | None:
        found = self._failures.get((token.group_id, token.episode_uuid))
        if found is None:
            return None
        stage, reason, message = found
        return EpisodeState(token, "failed", reason=reason, message=message, stage=stage)

    def failures(self, groups: list[str]) -> list[tuple[str, str, str]]:
        """(group, stage, reason) of every remembered in-process failure of ``groups``."""
        return [(g, s, r) for (g, _), (s, r, _) in self._failures.items() if g in groups]

    def failed_adds(self) -> list[tuple[tuple[str, str], tuple[str, str, str]]]:
        """((group, episode uuid), (stage, reason, message)) of every remembered in-process
        failure, oldest first."""
        return list(self._failures.items())

    async def dead_letters(self, tokens: list[Token]) -> dict[Token, EpisodeState]:
        """The tokens a dead letter names (by input position, else group and uuid)."""
        if not self.kafka or not tokens:
            return {}
        from tidegraph.topics.client import read_dead_letters

        sent = [t.sent_at_ms for t in tokens if t.sent_at_ms is not None]
        since = None
        if len(sent) == len(tokens):
            since = datetime.fromtimestamp(min(sent) / 1000, utcnow().tzinfo) - CLOCK_SKEW
        groups = sorted({t.group_id for t in tokens})
        letters = await read_dead_letters(self.settings, since=since, groups=groups)
        found: dict[Token, EpisodeState] = {}
        for stored in letters:
            letter = stored.letter
            origin = letter.origin
            for token in tokens:
                at_position = (
                    origin is not None
                    and token.topic == origin.topic
                    and (token.partition, token.offset) == (origin.partition, origin.offset)
                )
                same = letter.group_id == token.group_id and letter.episode_uuid == (
                    token.episode_uuid
                )
                if at_position or same:
                    found[token] = EpisodeState(
                        token,
                        "dead_lettered",
                        reason=letter.reason,
                        message=letter.message,
                        stage=letter.stage,
                    )
        return found

    async def written(self, tokens: list[Token]) -> list[bool]:
        """Whether each episode is in the store: processed, or stored without extraction
        (searchable either way, docs/architecture.md "Episodes without an LLM")."""
        statuses = await asyncio.gather(
            *(self.store.episode_status(t.group_id, t.episode_uuid) for t in tokens)
        )
        return [status != "missing" for status in statuses]

    async def wait(self, tokens: list[Token], timeout: float) -> list[EpisodeState]:
        """Wait until each token's episode is written, failed or dead-lettered, at most
        ``timeout`` seconds; the states at the end (``queued`` for those still pending)."""
        deadline = time.monotonic() + timeout
        states: dict[Token, EpisodeState] = {}
        pending = list(dict.fromkeys(tokens))
        delay = 0.02
        dlq_at = time.monotonic() + 0.5
        dlq_every = 0.5
        while True:
            for token, done in zip(pending, await self.written(pending), strict=True):
                if done:
                    states[token] = EpisodeState(token, "written")
                elif (failure := self.local_failure(token)) is not None:
                    states[token] = failure
            pending = [t for t in pending if t not in states]
            now = time.monotonic()
            if pending and self.kafka and (now >= dlq_at or now >= deadline):
                states.update(await self.dead_letters(pending))
                pending = [t for t in pending if t not in states]
                dlq_every = min(dlq_every * 2, 4.0)
                dlq_at = time.monotonic() + dlq_every
            if not pending or time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0)))
            delay = min(delay * 2, 0.25)
        for token in pending:
            states[token] = EpisodeState(token, "queued")
        return [states[t] for t in dict.fromkeys(tokens)]
