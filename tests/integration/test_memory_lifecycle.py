"""The memory's lifecycle through the Python API every surface uses (``Memory``): browsing a
group's episodes in pages, one episode with what it produced, the groups, forgetting a subject
named as a person would name it (with a dry run first), communities that carried a forgotten
member, and a change stream read with a long poll; on the embedded store and on Neo4j."""

from __future__ import annotations

import asyncio
import uuid as uuidlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from tests.support import crm_feed as crm
from tidegraph.app.browse import BadCursor
from tidegraph.app.memory import Memory
from tidegraph.pipelines.community_service import CommunityService
from tidegraph.pipelines.forget import ForgetError
from tidegraph.records.forget import ForgetRequest
from tidegraph.settings import Settings

pytestmark = pytest.mark.integration

AT = [crm.START + timedelta(days=d) for d in range(6)]
RECORDS = [
    crm.plan_record((1, "Acme Corp"), "Basic", AT[0]),
    crm.contact_record("joined", (7, "Dana Reyes"), (1, "Acme Corp"), AT[1]),
    crm.owner_record((1, "Acme Corp"), (3, "Sam Lee"), AT[2]),
    crm.contact_record("joined", (8, "Ravi Shah"), (1, "Acme Corp"), AT[3]),
    crm.plan_record((1, "Acme Corp"), "Pro", AT[4]),
    crm.contact_record("joined", (7, "Dana Reyes"), (1, "Acme Corp"), AT[5]),  # restated
]


@pytest.fixture(params=["embedded", "neo4j"])
async def memory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Memory]:
    mapping = tmp_path / "crm.yaml"
    mapping.write_text(crm.CRM_MAPPING)
    settings = Settings(data_dir=tmp_path / "data", embedder="hashing", mappings=mapping)
    if request.param == "neo4j":
        uri = str(request.getfixturevalue("neo4j_uri"))
        settings = settings.model_copy(update={"store": "neo4j", "neo4j_uri": uri})
    opened = await Memory.open(settings)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def group(memory: Memory) -> AsyncIterator[str]:
    group_id = f"life-{uuidlib.uuid4().hex[:12]}"
    for n, record in enumerate(RECORDS):
        added = await memory.add_episode(
            group_id=group_id, content=record, reference_time=AT[n], episode_id=f"rec-{n}"
        )
        assert added.status == "written", added
    yield group_id
    await memory.store.forget.delete_group(group_id)


async def test_episodes_are_listed_in_pages_and_shown_with_what_they_produced(
    memory: Memory, group: str
) -> None:
    seen, cursor = [], None
    while True:
        page = await memory.episodes(group, limit=4, cursor=cursor)
        seen += [e.episode_id for e in page.episodes]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [f"rec-{n}" for n in range(6)]
    ranged = await memory.episodes(group, since=AT[1], until=AT[3])
    assert [e.episode_id for e in ranged.episodes] == ["rec-1", "rec-2"]
    with pytest.raises(BadCursor):
        await memory.episodes(group, cursor="ep1.bm90IGEgY3Vyc29y")
    with pytest.raises(BadCursor):  # another group's cursor
        await memory.episodes("other-group", cursor=cursor)

    shown = await memory.episode(group, "rec-1")
    assert shown is not None and shown.episode.status == "written"
    assert {e.name for e in shown.entities} == {"Dana Reyes", "Acme Corp"}
    assert [f.fact for f in shown.facts] == ["Dana Reyes works at Acme Corp"]
    assert await memory.episode(group, "never-added") is None
    assert await memory.episode("other-group", "rec-1") is None

    [listed] = await memory.groups([group])
    assert (listed.group_id, listed.episodes) == (group, 6) and listed.changes > 0


async def test_a_subject_named_by_name_is_forgotten_after_a_dry_run(
    memory: Memory, group: str
) -> None:
    await CommunityService(memory.store, None, memory.runtime.embedder).refresh(group)
    before = await memory.store.communities.list_communities(group)
    assert any("Dana Reyes" in c.name + c.summary for c in before), before
    ask = ForgetRequest(group_id=group, subject="dana reyes")  # as a person would say it
    dry = await memory.forget(ask, dry_run=True)
    assert dry.status == "dry_run" and sorted(dry.episodes) == ["rec-1", "rec-5"]
    assert (await memory.episode(group, "rec-1")) is not None  # a dry run writes nothing

    done = await memory.forget(ask)
    assert done.status == "forgotten" and done.forgotten == 2 and done.entities_removed >= 1
    names = {e.name for e in await memory.entities(group)}
    assert "Dana Reyes" not in names and {"Acme Corp", "Ravi Shah", "Sam Lee"} <= names
    # No community keeps the forgotten member's name; the others are grouped again.
    communities = await memory.store.communities.list_communities(group)
    assert communities and all("Dana" not in c.name + c.summary for c in communities)
    forgotten = await memory.episodes(group, status="forgotten")
    assert len(forgotten.episodes) == 2 and all(not e.episode_id for e in forgotten.episodes)
    shown = await memory.episode(group, "rec-1")
    assert shown is not None and shown.episode.status == "forgotten" and not shown.entities
    with pytest.raises(ForgetError, match="no entity"):
        await memory.forget(ForgetRequest(group_id=group, subject="Dana Reyes"))


async def test_a_long_poll_answers_as_soon_as_a_change_is_committed(
    memory: Memory, group: str
) -> None:
    [log] = await memory.store.outbox.change_logs([group])
    first = await memory.changes(group, after=0, limit=3)
    assert [c.seq for c in first.changes] == [1, 2, 3] and first.cursor == 3
    caught_up = await memory.changes(group, after=log.seq)
    assert caught_up.changes == [] and caught_up.cursor == log.seq
    waiting = asyncio.create_task(memory.changes(group, after=log.seq, wait_seconds=30))
    await memory.add_episode(
        group_id=group,
        content=crm.plan_record((1, "Acme Corp"), "Enterprise", AT[5] + timedelta(days=1)),
        reference_time=AT[5] + timedelta(days=1),
        episode_id="rec-6",
    )
    page = await asyncio.wait_for(waiting, 30)
    assert page.changes and page.changes[0].seq == log.seq + 1
    assert {c.episode_id for c in page.changes} == {"rec-6"}
    assert "fact.invalidated" in {c.kind for c in page.changes}  # Pro closed by Enterprise


async def test_forgetting_an_episode_changes_nothing_it_did_not_touch(
    memory: Memory, group: str
) -> None:
    """Only what rec-3 (Ravi Shah joined Acme) brought goes: its new entity and fact. The
    replay gives every other entity and fact back exactly, their ingestion times included, so
    nothing else is rewritten or announced as changed."""
    request = ForgetRequest(group_id=group, episode_ids=["rec-3"])
    dry = await memory.forget(request, dry_run=True)
    assert (dry.entities_removed, dry.facts_removed) == (1, 1)
    assert (dry.entities_changed, dry.facts_changed) == (0, 0)
