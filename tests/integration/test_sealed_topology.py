"""Sealed episodes through a real worker on the real broker and Neo4j (docs/streaming.md
"Sealed episodes"): with ``TIDEGRAPH_ENCRYPT_EPISODES`` on, what tidegraph's producer writes
to the input topic, and what the worker hands from one hop to the next, hold no content in
clear, and the worker writes the graph from it; a
``forget --all --purge`` of one group erases its data key, and replaying the whole input
topic into a fresh worker brings nothing of that group back: each of its records, on the
input topic and on the hop topic, is a dead letter ``key_erased`` (still sealed), and the
worker goes on with the other group."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from tests.integration.test_topology import extraction_answer, read_topic
from tests.integration.topology_harness import Topology, eventually
from tests.support.crm_feed import crm_feed
from tests.support.extraction_requests import on_extraction
from tests.support.fake_llm import ScriptedLLMServer
from tidegraph.records.sealed import is_sealed

pytestmark = pytest.mark.integration


async def test_a_purged_groups_records_on_the_topic_can_no_longer_be_read(
    topology: Topology,
) -> None:
    topology.extra_env["TIDEGRAPH_ENCRYPT_EPISODES"] = "true"
    topology.extra_settings["encrypt_episodes"] = True
    crm = crm_feed(30, 2, run=topology.run)
    purged, kept = sorted({e["group_id"] for e in crm})
    # Each group's feed behind a text record, all waiting before the worker starts: its
    # mapped records then take the hop behind it (docs/streaming.md "Why two hops"), so the
    # hop topic holds the group's records too.
    feed = [
        {"id": f"note:{gid}:0", "group_id": gid, "source": "text",
         "content": f"Company {k} uses Zendesk.", "reference_time": "2024-12-31T00:00:00Z"}
        for k, gid in enumerate((purged, kept))
    ] + crm  # fmt: skip
    purged_ids = {e["id"] for e in feed if e["group_id"] == purged}
    with ScriptedLLMServer() as llm:
        on_extraction(llm, extraction_answer)
        llm.on("EntityResolutionOutput", lambda _: {"matches": []})
        llm.on("FactResolutionOutput", lambda _: {"judgements": []})
        topology.extra_env.update(
            TIDEGRAPH_LLM_BASE_URL=llm.base_url,
            TIDEGRAPH_LLM_API_KEY="test",
            TIDEGRAPH_LLM_MODEL="fake-model",
        )
        report = await topology.produce(feed)
        worker = topology.start_worker(TIDEGRAPH_COMMUNITIES_ENABLED="false")
        await topology.wait_reflected(report)

        on_topic = await read_topic(topology, topology.names.episodes)
        assert len(on_topic) == len(feed)
        assert all(is_sealed(orjson.dumps(r)) and "content" not in r for r in on_topic)
        hops = await read_topic(topology, topology.names.extracted)  # the hop topic too
        assert all(set(r) == {"group_id", "sealed"} for r in hops)
        purged_hops = sum(1 for r in hops if r["group_id"] == purged)
        assert purged_hops >= 1  # its text record at least
        store = topology.store()
        try:
            assert (await store.browse.counts(purged))[
                "facts"
            ] > 0  # written from the sealed records
            kept_counts = await store.browse.counts(kept)

            forget = {"forget": {"group_id": purged, "group": True, "purge": True}}
            await topology.produce([forget])
            await eventually(
                lambda: store.keys.group_keys(purged),
                lambda keys: keys == [],
                timeout=90,
                what="the purge to erase the group's data key",
            )
            # The whole input topic again, into a fresh worker of another consumer group.
            worker.stop()
            replayer = topology.start_worker(
                TIDEGRAPH_COMMUNITIES_ENABLED="false",
                TIDEGRAPH_CONSUMER_GROUP=f"{topology.run}-again",
            )
            await topology.wait_assigned([replayer])
            after = [dict(e, id=f"{e['id']}-after") for e in feed if e["group_id"] == kept][:3]
            again = await topology.produce(after)  # behind the replay, in the kept group
            await topology.wait_reflected(again)

            assert await store.browse.counts(purged) == {
                "episodes": 0,
                "entities": 0,
                "facts": 0,
                "mentions": 0,
            }
            assert (await store.browse.counts(kept))["episodes"] == kept_counts["episodes"] + len(
                after
            )
            # Each of the group's records on the input topic and on the hop topic (the fresh
            # consumer group reads both from the start) is a dead letter, unread.
            letters = await eventually(
                topology.dead_letters,
                lambda got: (
                    len([d for d in got if d.reason == "key_erased"])
                    >= len(purged_ids) + purged_hops
                ),
                timeout=60,
                what="a key_erased dead letter for each of the purged group's records",
            )
            erased = [d for d in letters if d.reason == "key_erased"]
            assert Counter(d.consumed.topic for d in erased if d.consumed) == {
                topology.names.episodes: len(purged_ids),
                topology.names.extracted: purged_hops,
            }
            assert all(is_sealed(d.original_bytes()) for d in erased)  # still unreadable
            assert {d.reason for d in letters} == {"key_erased"}
            assert replayer.alive()
        finally:
            await store.keys.erase_group_keys(kept)
            await store.close()
