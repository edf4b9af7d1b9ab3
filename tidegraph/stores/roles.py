"""The store's roles besides the write path (``base.GraphStore``): one interface each, which
every backend implements with one small class over its shared executor or database
(``neo4j/``, ``sqlite/``, ``memory/``: one module per role). A store holds them as attributes:
``store.outbox``, ``store.forget``, ``store.browse``, ``store.communities``, ``store.search``,
``store.keys``. Each role's callers read it through a
narrower protocol of their own (docs/architecture.md "Store roles").

Every method is group-scoped and keeps the rules of ``tidegraph.stores.base``.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Sequence
from datetime import datetime

from tidegraph.records.asof import AsOf
from tidegraph.records.changes import Change, PublishedChange
from tidegraph.records.graph import (
    ChangeLog,
    CommunityRecord,
    EntityRecord,
    EpisodeDetail,
    EpisodeEntry,
    FactView,
    GroupHistory,
    GroupProfile,
    Rebuild,
    WeightedEdge,
)
from tidegraph.records.sealed import DataKey
from tidegraph.records.search import Hit, Kind, MethodSearch, SearchScope


class Outbox(abc.ABC):
    """The change stream's outbox (docs/streaming.md "Change stream"). A committed episode
    write appends its changes (``EpisodeWrite.changes``) to its group's outbox in the same
    transaction, numbered in commit order (``Change.seq``), and bumps the group's write
    version; the outbox keeps the changes one transaction commits for a group as one row
    (``tidegraph.stores.rows.outbox_row``), which its readers split into the changes. The
    group's log names the deployment of its first writer (``ChangeLog.deployment``; a log
    without one takes the writer's at its next write): only that deployment's relay
    publishes it."""

    @abc.abstractmethod
    async def changes(self, group_id: str, after: int, limit: int) -> list[Change]:
        """The group's changes with ``seq > after``, in ``seq`` order, at most ``limit``."""

    @abc.abstractmethod
    async def change_logs(
        self, group_ids: list[str] | None = None, *, unpublished: bool = False, own: bool = False
    ) -> list[ChangeLog]:
        """The outbox state of these groups (None: of every group with a log), by group;
        ``unpublished``: only those with changes the relay has not published; ``own``: only
        those of this store's ``deployment``."""

    @abc.abstractmethod
    async def unpublished_changes(
        self, group_ids: list[str], per_group: int
    ) -> list[PublishedChange]:
        """Each group's changes after its relay cursor (``ChangeLog.published``), at most
        ``per_group`` of each, by group then ``seq``, as the relay produces them (the JSON of
        ``changes`` without decoding it): one read for a relay round. Only the groups of this
        store's ``deployment``."""

    @abc.abstractmethod
    async def mark_published(self, acknowledged: Sequence[PublishedChange]) -> None:
        """The relay published each group's changes up to ``acknowledged`` (its last change
        Kafka acknowledged, one per group), in one write: the group's cursor moves to that
        change's ``seq`` when the change stored there is still that one (``change_id``; a
        group purged and written anew since keeps its cursor), and never back. Only the
        groups of this store's ``deployment``: the others are left alone."""

    @abc.abstractmethod
    async def prune_changes(
        self, group_id: str, before: datetime, *, published_only: bool = True
    ) -> int:
        """Drop the group's changes committed before ``before`` (the outbox's retention), a
        write's together once the last of them is; ``published_only``: only those the relay
        has published. How many went. Unpublished
        changes dropped right after the relay's cursor move it past them, in the same
        transaction: the relay moves a cursor only past changes Kafka acknowledged, and never
        waits for one that is gone."""


class Forgetting(abc.ABC):
    """What a forget reads and writes (docs/architecture.md "Forgetting"): a forget replays the
    group's remaining episodes into a scratch store and writes the difference."""

    @abc.abstractmethod
    async def group_history(self, group_id: str) -> GroupHistory:
        """What a rebuild starts from (``GroupHistory``): the group's episodes but the
        forgotten ones, in the order their effects were written (``extracted_at``, else
        ``created_at``, then uuid), its entities and facts with their embeddings, each
        episode's mentions and created entities, and its write version."""

    @abc.abstractmethod
    async def history_part(
        self,
        group_id: str,
        episodes: list[str],
        mentioning: list[str],
        creating: list[str] | None = None,
    ) -> GroupHistory:
        """Part of ``group_history`` (what an incremental forget reads): the episodes named
        (uuids), those mentioning an entity of ``mentioning`` and those that created an
        entity of ``creating`` (its ``created`` list holds it), forgotten ones left out, in
        the same order and with their extractions, mentions and created entities; the
        group's write version; no entities or facts (``GraphStore.entities_by_uuids``,
        ``fact_candidates`` read those)."""

    @abc.abstractmethod
    async def group_profile(self, group_id: str) -> GroupProfile:
        """Whether a live extracted episode of the group was extracted by the LLM, or keeps
        no extraction (``GroupProfile``); without reading every episode of the group."""

    @abc.abstractmethod
    async def extracted_episodes(self, group_id: str, up_to: int) -> int:
        """How many live episodes of the group are extracted, counted up to ``up_to`` (no
        more than that many are read: a forget only needs to know whether the part it
        reaches is most of the group)."""

    @abc.abstractmethod
    async def apply_rebuild(self, group_id: str, rebuild: Rebuild) -> None:
        """One transaction: RebuildConflict when the group's write version moved; else the
        forgotten episodes become tombstones (uuid and group only: no content, name,
        embedding or mentions; a write of them is skipped from then on, as of a processed
        episode), the deleted facts and entities go (entities with their mentions and
        memberships), the entities and facts given are written in full (created or
        overwritten, including ends set back to null), the episodes named in ``mentions`` get
        exactly those mentions and those in ``created`` those created entities, the outbox
        loses the changes of ``purged`` records (the relay's cursor moves past those right
        after it, as ``prune_changes`` does) and gains ``changes``, and the version moves."""

    @abc.abstractmethod
    async def forget_group(self, group_id: str, at: datetime, *, purge: bool = False) -> int:
        """Every record of the group goes: its entities, facts, mentions, communities and
        their index entries, and its episodes' content: each episode stays a tombstone (so
        that a replay of its records never brings it back) unless ``purge``, which takes the
        tombstones and the change log too. The outbox keeps one ``group.forgotten`` change
        (none with ``purge``). Returns how many episodes were forgotten. No other group is
        touched. Re-running it finishes one that was cut off."""

    @abc.abstractmethod
    async def delete_group(self, group_id: str) -> None:
        """Remove every node and relationship of the group."""


class Browsing(abc.ABC):
    """Reading a group as it is stored: its episodes, facts as of a time, entities, counts."""

    @abc.abstractmethod
    async def list_episodes(
        self,
        group_id: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        status: str | None = None,
        after: tuple[datetime, str] | None = None,
        limit: int = 100,
    ) -> list[EpisodeEntry]:
        """The group's episodes by ``valid_at`` then uuid, from after the ``after`` position
        (the last entry's (valid_at, uuid) of the previous page), ``since <= valid_at <
        until``, of one ``status`` (written, not_extracted) or both, at most ``limit``.
        ``status="forgotten"`` lists the tombstones instead, by when they were forgotten
        (their ``forgotten_at`` stands for ``valid_at`` in the range and the position)."""

    @abc.abstractmethod
    async def episode_detail(self, group_id: str, episode_uuid: str) -> EpisodeDetail | None:
        """The group's episode (or its tombstone) and the entities it mentions; None when the
        group holds no such episode."""

    @abc.abstractmethod
    async def counts(self, group_id: str) -> dict[str, int]:
        """{"episodes", "entities", "facts", "mentions"} for the group."""

    async def query_facts(
        self,
        group_id: str,
        *,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        include_invalid: bool = False,
        entity_uuid: str | None = None,
    ) -> list[FactView]:
        """Facts as docs/architecture.md "Two timelines" defines them (the rules:
        ``tidegraph.records.asof``):
        - believed at ``known_at`` (None = now): only facts with ``created_at <= known_at``,
          and ``invalid_at`` counts only when ``expired_at <= known_at``;
        - valid at ``valid_at`` (None = now): ``valid_at <= t < invalid_at`` (open end when
          null); ``include_invalid`` skips this filter (a fact's whole history);
        - ``entity_uuid`` keeps facts with that entity as source or target.
        Ordered by subject, relation, valid_at, uuid. ``episodes`` holds producer ids."""
        asof = AsOf.resolve(valid_at, known_at, include_invalid, entity_uuid)
        return await self.facts_as_of(group_id, asof)

    @abc.abstractmethod
    async def facts_as_of(self, group_id: str, asof: AsOf) -> list[FactView]:
        """``query_facts`` of a resolved question."""

    @abc.abstractmethod
    async def list_entities(self, group_id: str) -> list[EntityRecord]:
        """All entities of the group, ordered by name then uuid."""


class Communities(abc.ABC):
    """The group's communities (docs/communities.md): the valid-fact graph the label
    propagation reads, neighbour weights for a new entity's assignment, and the communities
    with their memberships."""

    @abc.abstractmethod
    async def entity_graph(
        self, group_id: str, at: datetime | None = None
    ) -> tuple[list[str], list[WeightedEdge]]:
        """The group's entity graph over facts valid at ``at`` (None = now, as believed
        now): every entity uuid (sorted) and one undirected edge per connected pair
        (``source < target``, no self-loops) weighted by its number of valid facts, sorted.
        A fixed number of queries, whatever the size of the group."""

    @abc.abstractmethod
    async def neighbour_weights_many(
        self, group_id: str, entity_uuids: list[str], at: datetime | None = None
    ) -> list[dict[str, int]]:
        """For each entity, in order: {neighbour uuid: number of facts valid at ``at`` (None =
        now) between it and the entity}, in one read where the store can."""

    @abc.abstractmethod
    async def communities_of(self, group_id: str, entity_uuids: list[str]) -> dict[str, str | None]:
        """{entity uuid: the uuid of the community it is a member of, or None} for the group's
        entities among these (a light read: no names, summaries nor embeddings)."""

    @abc.abstractmethod
    async def list_communities(self, group_id: str) -> list[CommunityRecord]:
        """The group's communities ordered by uuid, members sorted (empty ones included)."""

    @abc.abstractmethod
    async def write_communities(
        self, group_id: str, upserts: list[CommunityRecord], deletes: list[str]
    ) -> None:
        """One transaction: delete the ``deletes`` communities (of this group), then MERGE
        each upsert by uuid (name, summary and, when given, name_embedding set) and replace
        its HAS_MEMBER edges by ``members``, removing those members from any other community
        of the group. Communities not named are left alone. Idempotent."""

    @abc.abstractmethod
    async def assign_members(self, group_id: str, assignments: list[tuple[str, str]]) -> None:
        """For each ``(community_uuid, entity_uuid)`` in order, in one transaction: the entity
        becomes a member of that (existing) community and of no other. Idempotent; an
        assignment whose community or entity is not in the group is skipped."""


class Search(abc.ABC):
    """Memory retrieval's reads (docs/retrieval.md "Memory retrieval"). Every search reads only
    ``scope.group_ids`` (each hit is of one of them, and so is everything it carries); facts
    are those ``Browsing.query_facts`` answers for ``scope.asof``, each as believed then;
    entities and communities those created by its known-at time, episodes also happened by
    its valid-at time (``tidegraph.stores.hits``)."""

    @abc.abstractmethod
    async def fulltext_search(
        self, scope: SearchScope, kind: Kind, text: str, limit: int
    ) -> list[Hit]:
        """The ``kind`` records matching ``text`` (plain user text): facts on their sentence,
        entities and communities on name and summary, episodes on content. Best first, scored
        by the engine (BM25-like)."""

    @abc.abstractmethod
    async def vector_search(
        self, scope: SearchScope, kind: Kind, embedding: list[float], limit: int
    ) -> list[Hit]:
        """The nearest ``kind`` records (fact, entity name, episode content, community name
        embeddings), scored ``(1 + cos) / 2``, best first."""

    async def search_lists(
        self, scope: SearchScope, searches: Sequence[MethodSearch]
    ) -> list[list[Hit]]:
        """Each search's hits, in order (``fulltext_search`` for a text, ``vector_search``
        for an embedding). By default they run side by side; a store that answers several
        reads at once more cheaply overrides it (the embedded store: one hand-off to its
        thread)."""
        return list(await asyncio.gather(*(self._method_search(scope, s) for s in searches)))

    async def _method_search(self, scope: SearchScope, search: MethodSearch) -> list[Hit]:
        if search.text is not None:
            return await self.fulltext_search(scope, search.kind, search.text, search.limit)
        assert search.embedding is not None  # MethodSearch has one or the other
        return await self.vector_search(scope, search.kind, search.embedding, search.limit)

    async def complete_hits(self, scope: SearchScope, hits: Sequence[Hit]) -> list[Hit]:
        """``hits`` read with ``scope.details`` off, with their details (a fact's end names
        and episodes' producer ids, an entity's mentioning episodes). By default a store's
        hits always carry them and come back as they are; a store that reads them only when
        asked (the embedded store; Neo4j, an entity's producers) overrides it."""
        return list(hits)

    @abc.abstractmethod
    async def expand_facts(
        self, scope: SearchScope, seeds: list[str], hops: int, limit: int
    ) -> list[Hit]:
        """The facts within ``hops`` of the ``seeds`` entities, breadth first over the
        scope's facts: ``distance`` the hop each was reached at (1: touches a seed), score
        ``1 / distance``; nearest first, at most ``limit``."""

    @abc.abstractmethod
    async def recent_episode_entities(self, scope: SearchScope, episodes: int) -> list[str]:
        """The entities mentioned by each group's ``episodes`` latest episodes (by valid_at),
        most recent episode first, each uuid once."""

    @abc.abstractmethod
    async def entity_distances(
        self, scope: SearchScope, centre: str, uuids: list[str], max_hops: int
    ) -> dict[str, int]:
        """Hops from ``centre`` to each of ``uuids`` over the scope's facts (0 for the centre
        itself); a uuid farther than ``max_hops`` or unreachable is left out."""


class Keys(abc.ABC):
    """The groups' data keys that seal their episodes on the input topic
    (``tidegraph.stores.keys``, docs/streaming.md "Sealed episodes")."""

    @abc.abstractmethod
    async def group_keys(self, group_id: str) -> list[DataKey]:
        """The group's keys, oldest first."""

    @abc.abstractmethod
    async def add_group_key(self, group_id: str, key: DataKey) -> None:
        """Keep ``key`` for the group (a key id already kept is left as it is)."""

    @abc.abstractmethod
    async def erase_group_keys(self, group_id: str) -> int:
        """Erase every key of the group; how many there were."""
