"""What the HTTP server and the MCP server both do, each call scoped to the caller's groups
(docs/serving.md "Serving memory to agents").

Every method takes the ``Principal`` (the groups its API key may use) first and refuses any
other group with ``Forbidden`` naming the group. Errors are ``ServiceError``s carrying the HTTP
status, a machine-readable code and a message that says what to do; the HTTP layer turns them
into JSON bodies, the MCP layer into tool errors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from tidegraph.app.memory import AddResult, Memory, new_episode_id
from tidegraph.app.serving.models import AddEpisodeIn, ContextIn, FactsIn, SearchIn
from tidegraph.app.serving.settings import MAX_WAIT_SECONDS, Principal
from tidegraph.app.serving.tokens import BadToken, EpisodeState, Token, Tracker, episode_uuid_of
from tidegraph.recall.search import SearchResults
from tidegraph.records.episode import parse_episode
from tidegraph.records.errors import BadTime, InvalidEpisode
from tidegraph.records.ids import id_problem
from tidegraph.records.search import SearchRequest
from tidegraph.records.times import utc, utcnow

log = logging.getLogger("tidegraph.serve")

PENDING_SCAN = 1000  # not-yet-extracted episodes read to tell one apart


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


class MemoryService:
    """The memory of one store, served to many callers (see the module docstring)."""

    def __init__(
        self, memory: Memory, *, wait_seconds: float = 10.0, waits_per_key: int = 8
    ) -> None:
        self.memory = memory
        self.store = memory.store
        self.settings = memory.settings
        self.wait_seconds = wait_seconds
        self.waits_per_key = waits_per_key
        self.tracker = Tracker(self.store, self.settings, kafka=memory.via == "kafka")
        self._waiting: Counter[str] = Counter()  # reads waiting for tokens, by key

    # ------------------------------------------------------------------ scope
    def groups(
        self, principal: Principal, asked: list[str] | None, field: str = "group_ids"
    ) -> list[str]:
        """The groups a read uses: those asked (each a valid group id, allowed to the
        caller), kept exactly as sent; default every group of the key."""
        if asked:
            wanted = list(dict.fromkeys(asked))
            for group_id in wanted:
                problem = id_problem(group_id) if group_id else "is empty"
                if problem is not None:
                    raise Invalid(f"{field}: group id {group_id[:80]!r} {problem}", field=field)
            if refused := principal.refused(wanted):
                raise Forbidden(principal.refusal(refused), group_id=refused)
            return wanted
        if principal.groups is None:
            raise Invalid(f"name the group ids to read ({field})", field=field)
        return sorted(principal.groups)

    def group(self, principal: Principal, asked: str | None, field: str = "group_id") -> str:
        if asked is not None:
            return self.groups(principal, [asked], field)[0]
        if principal.groups is not None and len(principal.groups) == 1:
            return next(iter(principal.groups))
        if principal.groups is None:
            raise Invalid(f"name the group to use ({field})", field=field)
        choices = ", ".join(sorted(principal.groups))
        raise Invalid(f"name the group ({field}); this key may use {choices}", field=field)

    # ------------------------------------------------------------------ writing
    async def add(self, principal: Principal, body: AddEpisodeIn) -> tuple[AddResult, str]:
        group_id = self.group(principal, body.group_id)
        reference_time = await when(body.reference_time, "reference_time")
        if reference_time is None:
            raise Invalid("reference_time: say when it happened (ISO 8601)", field="reference_time")
        sent_at = utcnow()
        fields = body.model_dump(exclude_none=True, exclude={"episode_id"})
        record = {
            **fields,
            "id": body.episode_id or new_episode_id(),
            "group_id": group_id,
            "reference_time": reference_time.isoformat(),
        }
        try:
            result = await self.memory.add(parse_episode(record))
        except InvalidEpisode as exc:
            raise Invalid(f"not a valid episode ({exc.reason}): {exc}", field=_field(exc)) from None
        except RuntimeError as exc:  # Kafka refused it (too large, not authorised, ...)
            raise ServiceUnavailable(f"could not queue the episode: {exc}") from exc
        if result.status == "failed":
            self.tracker.failed(
                group_id,
                result.episode_uuid,
                "chain",
                result.reason or "error",
                result.message or "",
            )
        token = Token(
            group_id,
            result.episode_uuid,
            result.topic,
            result.partition,
            result.offset,
            int(sent_at.timestamp() * 1000) if result.topic else None,
        )
        log.info(
            "episode added group_id=%s status=%s key=%s",
            group_id,
            result.status,
            principal.key_id,
        )
        return result, token.encode()

    # ------------------------------------------------------------------ reading
    async def await_tokens(
        self, principal: Principal, tokens: list[str], timeout: float | None
    ) -> list[EpisodeState]:
        """Wait for the wait_for tokens (each of an allowed group); NotQueryable unless every
        one is written."""
        if not tokens:
            return []
        decoded = []
        for text in tokens:
            try:
                token = Token.decode(text)
            except BadToken as exc:
                raise BadRequest(f"wait_for: {exc}", field="wait_for") from None
            if not principal.may_use(token.group_id):
                raise Forbidden(principal.refusal(token.group_id), group_id=token.group_id)
            decoded.append(token)
        if all(await self.tracker.written(decoded)):  # the usual case: no wait, no slot
            return [EpisodeState(token, "written") for token in dict.fromkeys(decoded)]
        key = principal.key_id
        if self._waiting[key] >= self.waits_per_key:
            raise TooManyWaits(
                f"{self._waiting[key]} reads of this caller already wait for their wait_for "
                "episodes (TIDEGRAPH_SERVE_WAITS_PER_KEY): retry once one has answered"
            )
        limit = min(timeout or self.wait_seconds, MAX_WAIT_SECONDS)
        started = time.monotonic()
        self._waiting[key] += 1
        try:
            states = await self.tracker.wait(decoded, limit)
        finally:
            self._waiting[key] -= 1
        if any(s.state != "written" for s in states):
            raise NotQueryable(states, time.monotonic() - started, kafka=self.tracker.kafka)
        return states

    async def search(self, principal: Principal, body: SearchIn) -> dict[str, Any]:
        results = await self._search(principal, body)
        asof = results.scope.asof
        return {
            "query": results.query,
            "recipe": results.recipe,
            "group_ids": list(results.scope.group_ids),
            "valid_at": None if asof.include_invalid else asof.valid_at.isoformat(),
            "known_at": asof.known_at.isoformat(),
            "time_phrase": results.time_words.phrase if results.time_words else None,
            "results": [hit.as_json(rank) for rank, hit in enumerate(results.all(), 1)],
            "note": await self.memory.missing_facts_note(results),
        }

    async def context(self, principal: Principal, body: ContextIn) -> dict[str, Any]:
        from tidegraph.recall.context import build_context

        results = await self._search(principal, body)
        text = build_context(results, max_chars=body.max_chars, episodes=body.episodes)
        if note := await self.memory.missing_facts_note(results):
            text = f"{text}\nNOTE: {note}"
        return {"context": text, "results": len(results)}

    async def _search(self, principal: Principal, body: SearchIn) -> SearchResults:
        request = await self.request(principal, body)
        await self.await_tokens(principal, body.wait_for, body.wait_timeout_seconds)
        try:
            return await self.memory.search(request)
        except ValueError as exc:  # a blank query, a recipe needing a centre or a cross-encoder
            raise BadRequest(str(exc)) from None

    async def request(self, principal: Principal, body: SearchIn) -> SearchRequest:
        """The ``SearchRequest`` of a search body: its groups checked, its times read."""
        groups = self.groups(principal, body.group_ids)
        valid_at = await when(body.valid_at, "valid_at")
        known_at = await when(body.known_at, "known_at")
        return body.request(groups, valid_at, known_at)

    async def facts(self, principal: Principal, body: FactsIn) -> list[dict[str, Any]]:
        group = self.group(principal, body.group_id)
        valid_at = await when(body.valid_at, "valid_at")
        known_at = await when(body.known_at, "known_at")
        await self.await_tokens(principal, body.wait_for, body.wait_timeout_seconds)
        views = await self.memory.facts(
            group, valid_at=valid_at, known_at=known_at, include_invalid=body.include_invalid
        )
        return [view.model_dump() for view in views]

    async def entities(self, principal: Principal, group_id: str | None) -> list[dict[str, Any]]:
        group = self.group(principal, group_id)
        records = await self.memory.entities(group)
        return [
            {
                "uuid": r.uuid,
                "name": r.name,
                "labels": r.labels,
                "summary": r.summary,
                "key": r.key,
                "created_at": r.created_at.isoformat() if r.created_at else None,
            }
            for r in records
        ]

    async def episode_status(
        self, principal: Principal, group_id: str | None, episode_id: str
    ) -> dict[str, Any]:
        """Where an added episode stands (``episode_id``: your id, or its uuid)."""
        group = self.group(principal, group_id)
        candidates = [episode_uuid_of(group, episode_id), episode_id]
        tokens = [Token(group, uuid) for uuid in candidates]
        written = await self.tracker.written(tokens)
        base = {"group_id": group, "episode_id": episode_id}
        for token, done in zip(tokens, written, strict=True):
            if done:
                pending = await self._not_extracted(group, token.episode_uuid)
                if pending is not None:
                    return {
                        **base,
                        "episode_uuid": token.episode_uuid,
                        "status": "not_extracted",
                        "reason": pending,
                        "detail": "stored and searchable as an episode; its entities and facts "
                        "wait for an LLM or a mapping (tidegraph extract --pending)",
                    }
                return {
                    **base,
                    "episode_uuid": token.episode_uuid,
                    "status": "written",
                    "detail": "stored and queryable",
                }
        for token in tokens:
            failure = self.tracker.local_failure(token)
            if failure is not None:
                return {**base, **_failed(failure)}
        dead = await self.tracker.dead_letters(tokens)
        for token in tokens:
            if token in dead:
                return {**base, **_failed(dead[token])}
        uuid = candidates[0]
        if self.tracker.kafka:
            return {
                **base,
                "episode_uuid": uuid,
                "status": "queued",
                "detail": "not written yet and no dead letter names it: in Kafka for the "
                "workers (is a worker running?), or never added",
            }
        raise NotFound(
            f"no episode {episode_id!r} in group {group!r}: it was never added, or was added "
            "under another id",
            group_id=group,
        )

    async def _not_extracted(self, group_id: str, episode_uuid: str) -> str | None:
        """Why the episode waits for extraction, or None when it is processed."""
        if await self.store.episode_status(group_id, episode_uuid) != "not_extracted":
            return None
        for record in await self.store.pending_episodes(group_id, PENDING_SCAN):
            if record.uuid == episode_uuid:
                return str(record.not_extracted)
        return "not extracted"

    async def dead_letter_counts(
        self, principal: Principal, group_ids: list[str] | None
    ) -> dict[str, Any]:
        groups = self.groups(principal, group_ids)
        counts: Counter[tuple[str, str, str]] = Counter()
        if self.tracker.kafka:
            from tidegraph.topics.client import read_dead_letters

            for stored in await read_dead_letters(self.settings, groups=groups):
                letter = stored.letter
                counts[letter.group_id or "", letter.stage, letter.reason] += 1
            source = f"Kafka topic {self.settings.topic_prefix}.dlq"
        else:
            counts.update(self.tracker.failures(groups))
            source = "episodes that failed in this server process since it started"
        return {
            "source": source,
            "group_ids": groups,
            "total": sum(counts.values()),
            "counts": [
                {"group_id": g, "stage": s, "reason": r, "count": n}
                for (g, s, r), n in sorted(counts.items())
            ],
        }

    async def ready(self) -> None:
        """Raises when the store does not answer (``/readyz``)."""
        await self.store.episode_processed("tidegraph-readyz", "00000000-readyz")


class ServiceUnavailable(ServiceError):
    status, code = 503, "unavailable"


# Time phrases are read by dateparser (~50 ms for 100 characters) one at a time, off the event
# loop: a tenant sending many never holds the loop (/healthz, other tenants' reads).
_TIME_PHRASES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidegraph-times")


async def when(value: str | None, field: str) -> datetime | None:
    """A time field of a request (ISO 8601 read at once, a phrase off the event loop), or a
    400 naming the field."""
    from tidegraph.processors.temporal import read_when

    if value is None:
        return None
    try:
        return utc(datetime.fromisoformat(value.strip().replace("Z", "+00:00")))
    except (ValueError, OverflowError):
        pass  # not ISO 8601: epoch seconds or a phrase
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


def _failed(state: EpisodeState) -> dict[str, Any]:
    return {
        "episode_uuid": state.token.episode_uuid,
        "status": state.state,
        "reason": state.reason,
        "message": state.message,
        "stage": state.stage,
        "detail": f"failed at {state.stage} ({state.reason}); it will not be queryable until "
        "the cause is fixed and it is added again (or replayed: tidegraph dlq replay)",
    }


def _field(exc: InvalidEpisode) -> str:
    reason = getattr(exc, "reason", "")
    return {
        "invalid_id": "episode_id",
        "invalid_group_id": "group_id",
        "bad_timestamp": "reference_time",
    }.get(reason, "content")
