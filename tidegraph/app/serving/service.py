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
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

from aiokafka.errors import KafkaError
from pydantic import ValidationError

from tidegraph.app.browse import BadCursor, ChangePage, EpisodePage, EpisodeView, ForgetResult
from tidegraph.app.memory import AddResult, Memory, new_episode_id
from tidegraph.app.serving.errors import (
    BadRequest,
    Forbidden,
    ForgetRefused,
    Invalid,
    NotFound,
    NotQueryable,
    ServiceUnavailable,
    TooManyWaits,
    check_episode_id,
    field_of,
    invalid_from,
    store_down,
)
from tidegraph.app.serving.models import (
    AddEpisodeIn,
    ChangesIn,
    ContextIn,
    EpisodesIn,
    FactsIn,
    ForgetIn,
    SearchIn,
)
from tidegraph.app.serving.settings import MAX_WAIT_SECONDS, Principal
from tidegraph.app.serving.times import when
from tidegraph.app.serving.tokens import BadToken, EpisodeState, Token, Tracker, episode_uuid_of
from tidegraph.metrics import SERVE_WAITS
from tidegraph.recall.search import SearchResults
from tidegraph.records.episode import parse_episode
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.forget import ForgetRequest
from tidegraph.records.ids import id_problem
from tidegraph.records.search import SearchRequest
from tidegraph.records.times import utcnow
from tidegraph.stores.errors import (
    RETRY_AFTER_SECONDS,
    StoreUnreachable,
    transient_store_error,
)

log = logging.getLogger("tidegraph.serve")

PENDING_SCAN = 1000  # not-yet-extracted episodes read to tell one apart
STORE_PROBE_SECONDS = 10.0  # how often an in-process server checks that its store answers
STREAM_ROUND_SECONDS = 15.0  # a change stream looks again whether its cursor still holds
WaitKind = Literal["wait_for", "changes", "stream"]


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
        if memory.via == "process" and not memory.read_only:
            # A client's write is never held while the store does not answer: it is answered
            # 503 with Retry-After at once (tidegraph.pipelines.outage).
            memory.runtime.outage.hold_seconds = 0.0
        self._waiting: Counter[str] = Counter()  # requests waiting (tokens, changes), by key
        self._upkeep: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Begin the server's upkeep: in-process, the outbox kept to its retention (docs/
        streaming.md "Change stream"; through Kafka the workers do it), pruned once now and
        then every ``PRUNE_EVERY_SECONDS``."""
        if self.memory.via == "process" and self._upkeep is None:
            await self.prune_changes()
            self._upkeep = asyncio.create_task(self._keep_outbox(), name="tidegraph-outbox")
            self._watch = asyncio.create_task(self._watch_store(), name="tidegraph-store-probe")

    async def close(self) -> None:
        for task in (self._upkeep, self._watch):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._upkeep = self._watch = None
        await self.memory.close()

    async def prune_changes(self) -> int:
        """One round of the outbox's retention (``Memory.prune_changes``); a store that fails
        is logged and tried again next round. How many changes went."""
        try:
            return await self.memory.prune_changes()
        except Exception:  # the store is down: the next round tries again
            log.warning("pruning the change outbox failed", exc_info=True)
            return 0

    async def _keep_outbox(self) -> None:
        from tidegraph.pipelines.outbox import PRUNE_EVERY_SECONDS

        while True:
            await asyncio.sleep(PRUNE_EVERY_SECONDS)  # a timer, not a synchronisation
            await self.prune_changes()

    async def _watch_store(self) -> None:
        """Probe the store every ``STORE_PROBE_SECONDS``: a store that stopped answering
        (even frozen, its connections hanging) is known at once, and writes are answered 503
        until it answers again (``tidegraph.pipelines.outage``)."""
        outage = self.memory.runtime.outage
        while True:
            await asyncio.sleep(STORE_PROBE_SECONDS)  # a timer, not a synchronisation
            await outage.check()

    # ------------------------------------------------------------------ waits
    def hold_wait(self, principal: Principal, kind: WaitKind) -> Callable[[], None]:
        """One of the caller's ``waits_per_key`` slots (``TooManyWaits`` when all are held),
        for a read that waits: a ``wait_for``, a long poll, a change stream. Returns its
        release."""
        key = principal.key_id
        if self._waiting[key] >= self.waits_per_key:
            raise TooManyWaits(
                f"{self._waiting[key]} requests of this caller already wait (wait_for reads, "
                "change polls and streams; TIDEGRAPH_SERVE_WAITS_PER_KEY): retry once one "
                "has answered"
            )
        self._waiting[key] += 1
        SERVE_WAITS.labels(kind).inc()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._waiting[key] -= 1
                SERVE_WAITS.labels(kind).dec()

        return release

    @asynccontextmanager
    async def waiting(self, principal: Principal, kind: WaitKind) -> AsyncIterator[None]:
        release = self.hold_wait(principal, kind)
        try:
            yield
        finally:
            release()

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
            self._refuse_while_store_down()
            result = await self.memory.add(parse_episode(record))
        except StoreUnreachable as exc:
            raise store_down(exc) from None
        except InvalidEpisode as exc:
            raise Invalid(
                f"not a valid episode ({exc.reason}): {exc}", field=field_of(exc)
            ) from None
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

    def _refuse_while_store_down(self) -> None:
        """In-process, while the store does not answer, a write is refused at once (a 503)
        rather than tried: ``StoreUnreachable``."""
        if self.memory.via == "process" and not self.memory.read_only:
            self.memory.runtime.outage.refuse_while_down()

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
        limit = min(timeout or self.wait_seconds, MAX_WAIT_SECONDS)
        started = time.monotonic()
        async with self.waiting(principal, "wait_for"):
            states = await self.tracker.wait(decoded, limit)
        if any(s.state != "written" for s in states):
            raise NotQueryable(states, time.monotonic() - started, kafka=self.tracker.kafka)
        return states

    async def search(self, principal: Principal, body: SearchIn) -> dict[str, Any]:
        """The answer of ``POST /v1/search``, exactly as ``SearchOut`` describes it (the route
        sends it as it is: validating it again against the model was a twentieth of the
        HTTP layer's CPU)."""
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
        except Exception as exc:
            if not transient_store_error(exc):
                raise
            raise ServiceUnavailable(
                f"the store could not answer this search now ({type(exc).__name__}, tried "
                f"twice): {' '.join(str(exc).split())[:300]}; retry shortly",
                retry_after_seconds=RETRY_AFTER_SECONDS,
            ) from None

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

    # ------------------------------------------------------------------ lifecycle
    async def forget(self, principal: Principal, body: ForgetIn) -> ForgetResult:
        """What ``body`` names in one of the caller's groups, forgotten (docs/architecture.md
        "Forgetting"), or with ``dry_run`` what would go."""
        group = self.group(principal, body.group_id)
        try:
            request = body.request(group)
        except ValidationError as exc:
            raise invalid_from(exc) from None
        return await self._forget(principal, request, dry_run=body.dry_run)

    async def forget_episode(
        self, principal: Principal, group_id: str | None, episode_id: str, *, dry_run: bool
    ) -> ForgetResult:
        """One episode of the group (its id or uuid) forgotten; ``NotFound`` when the group
        holds no such episode (or only its tombstone). Through Kafka an episode not written
        yet may still be on its way: its forget is queued behind it, in the group's order."""
        group = self.group(principal, group_id)
        check_episode_id(episode_id)
        shown = await self.memory.episode(group, episode_id)
        if shown is not None and shown.episode.status != "forgotten":
            producer_id = shown.episode.episode_id
        elif shown is None and self.tracker.kafka and not dry_run:
            producer_id = episode_id
        else:
            when_gone = f" (forgotten at {shown.episode.forgotten_at})" if shown else ""
            raise NotFound(
                f"group {group!r} holds no episode {episode_id!r}{when_gone}: list its "
                "episodes with GET /v1/episodes",
                group_id=group,
            )
        request = ForgetRequest(group_id=group, episode_ids=(producer_id,))
        return await self._forget(principal, request, dry_run=dry_run)

    async def _forget(
        self, principal: Principal, request: ForgetRequest, *, dry_run: bool
    ) -> ForgetResult:
        from tidegraph.pipelines.forget import ForgetError

        try:
            self._refuse_while_store_down()
            result = await self.memory.forget(request, dry_run=dry_run)
        except StoreUnreachable as exc:
            raise store_down(exc) from None
        except ForgetError as exc:
            raise ForgetRefused(str(exc)) from None
        except RuntimeError as exc:  # Kafka refused the forget record
            raise ServiceUnavailable(f"could not queue the forget: {exc}") from exc
        log.info(
            "forget group_id=%s status=%s episodes=%d key=%s",
            request.group_id,
            result.status,
            result.forgotten,
            principal.key_id,
        )
        return result

    async def episodes(self, principal: Principal, body: EpisodesIn) -> dict[str, Any]:
        """A page of the group's episodes (``Memory.episodes``)."""
        group = self.group(principal, body.group_id)
        since = await when(body.since, "since")
        until = await when(body.until, "until")
        if body.status == "dead_lettered" and not self.tracker.kafka:
            return self._failed_here(group, body.limit).as_json()
        try:
            page = await self.memory.episodes(
                group,
                since=since,
                until=until,
                status=body.status,
                cursor=body.cursor,
                limit=body.limit,
                content=body.content,
            )
        except BadCursor as exc:
            raise BadRequest(str(exc), field="cursor") from None
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        except KafkaError as exc:
            raise ServiceUnavailable(f"could not read the dead-letter topic: {exc}") from exc
        return page.as_json()

    def _failed_here(self, group_id: str, limit: int) -> EpisodePage:
        """An in-process server's dead letters: the adds of the group that failed in this
        process since it started (there is no dead-letter topic)."""
        views = [
            EpisodeView(uuid, "", "dead_lettered", reason=reason, stage=stage, message=message)
            for (group, uuid), (stage, reason, message) in self.tracker.failed_adds()
            if group == group_id
        ]
        return EpisodePage(
            group_id,
            "dead_lettered",
            views[-limit:],
            None,
            source="episodes that failed in this server process since it started",
        )

    async def episode(
        self, principal: Principal, group_id: str | None, episode_id: str
    ) -> dict[str, Any]:
        """One episode of the group and what it produced (``Memory.episode``)."""
        group = self.group(principal, group_id)
        check_episode_id(episode_id)
        shown = await self.memory.episode(group, episode_id)
        if shown is None:
            raise NotFound(
                f"group {group!r} holds no episode {episode_id!r} (one still queued or "
                "dead-lettered: GET /v1/episodes/{episode_id}/status)",
                group_id=group,
            )
        return {"group_id": group, **shown.as_json()}

    async def readable_groups(self, principal: Principal) -> dict[str, Any]:
        """The groups the caller may read, with what each holds (a caller of every group:
        every group the store has written)."""
        views = await self.memory.groups(principal.groups)
        return {"groups": [view.as_json() for view in views]}

    async def changes(self, principal: Principal, body: ChangesIn) -> dict[str, Any]:
        """The group's changes after the cursor; with ``wait_seconds`` a long poll (holding
        one of the caller's wait slots only when it has to wait)."""
        group = await self.change_cursor(principal, body.group_id, body.after)
        page = await self._changes(group, body.after, body.limit, 0.0)
        if page.changes or body.wait_seconds <= 0:
            return page.as_json()
        async with self.waiting(principal, "changes"):
            page = await self._changes(group, body.after, body.limit, body.wait_seconds)
        return page.as_json()

    async def latest_changes(
        self, principal: Principal, group_id: str | None, limit: int = 100
    ) -> dict[str, Any]:
        """The group's last ``limit`` changes and the cursor (the MCP changes resource)."""
        group = self.group(principal, group_id)
        logs = await self.store.outbox.change_logs([group])
        last = logs[0].seq if logs else 0
        page = await self._changes(group, max(0, last - limit), limit, 0.0)
        return page.as_json()

    async def change_cursor(self, principal: Principal, group_id: str | None, after: int) -> str:
        """The group of a change read, once its cursor is checked: a cursor past the group's
        last change was not given for this group (another group's, another store's, or the
        group was purged since), and is a 400 rather than a wait for changes that would
        never be served."""
        group = self.group(principal, group_id)
        if after > 0:
            logs = await self.store.outbox.change_logs([group])
            last = logs[0].seq if logs else 0
            if after > last:
                raise BadRequest(
                    f"after: {after} is past the last change of group {group!r} (seq {last}): "
                    "a cursor of another group or store, or the group was purged; read again "
                    "from 0",
                    field="after",
                )
        return group

    async def _changes(self, group: str, after: int, limit: int, wait: float) -> ChangePage:
        try:
            return await self.memory.changes(group, after=after, limit=limit, wait_seconds=wait)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    async def change_stream(
        self, principal: Principal, group: str, after: int, limit: int, release: Callable[[], None]
    ) -> AsyncIterator[ChangePage]:
        """The group's changes after ``after`` as they are committed, a page at a time, until
        the reader goes away (``release`` frees its wait slot then); a cursor that stops
        holding (the group purged) ends it with ``BadRequest``."""
        cursor = after
        try:
            while True:
                page = await self._changes(group, cursor, limit, STREAM_ROUND_SECONDS)
                if page.changes:
                    cursor = page.cursor
                    yield page
                else:
                    await self.change_cursor(principal, group, cursor)
        finally:
            release()

    async def ready(self) -> None:
        """Raises when the store does not answer (``/readyz``)."""
        await self.store.episode_processed("tidegraph-readyz", "00000000-readyz")


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
