"""The source stage of the worker (tidegraph/pipelines/streaming/sources.py ``SourceHandler``)
with a real group runner's mapping (``GroupRunner.map_now``): a change a declared mapping
extracts goes straight to ``{prefix}.extracted`` for the write hop, one no rule matches to
``{prefix}.episodes`` for the extraction hop, and one a rule cannot map is a dead letter that
replays as an envelope (docs/sources.md "Order", "Bad input")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.crm_tables import MAPPING
from tidegraph.app.memory import Memory
from tidegraph.pipelines.streaming.config import WorkerSettings
from tidegraph.pipelines.streaming.handlers import Consumed, Emit
from tidegraph.pipelines.streaming.sources import SourceHandler
from tidegraph.processors.sources import SourceSet
from tidegraph.settings import Settings
from tidegraph.topics.names import TopicNames
from tidegraph.topics.records import DeadLetter, decode, decode_extracted, encode_key

TOPIC = "crm.public.accounts"
NAMES = TopicNames("tg")
ACME = {"id": 1, "tenant": "north", "name": "Acme", "plan": "Pro", "owner": "Alice"}


def change(op: str, before: Any, after: Any, table: str = "accounts", offset: int = 3) -> Consumed:
    source = {"table": table, "lsn": 100 + offset, "txId": 7, "ts_ms": 1_700_000_000_000}
    value = {"op": op, "before": before, "after": after, "source": source}
    return Consumed(TOPIC, 2, offset, 1_700_000_000_500, b'{"id": 1}', orjson.dumps(value))


@pytest.fixture
async def handler(tmp_path: Path) -> AsyncIterator[SourceHandler]:
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(MAPPING)
    settings = Settings(data_dir=tmp_path / "data", embedder="hashing", mappings=mapping)
    sources = SourceSet.model_validate(
        {"sources": [{"name": "crm", "topics": [TOPIC], "envelope": "debezium",
                      "group": "{row.tenant}"}]}
    )  # fmt: skip
    async with await Memory.open(settings) as memory:
        runner = memory.runtime.runner()
        yield SourceHandler(sources, NAMES, WorkerSettings(), 30.0, runner.map_now)


async def one(handler: SourceHandler, record: Consumed) -> Emit:
    [[emit]] = await handler.handle_group([record])
    return emit


async def test_a_mapped_change_goes_straight_to_the_write_hop(handler: SourceHandler) -> None:
    emit = await one(handler, change("u", ACME, {**ACME, "plan": "Team"}))
    assert (emit.topic, emit.key) == (NAMES.extracted, encode_key("north"))
    hop = decode_extracted(emit.value)
    assert (hop.origin.topic, hop.origin.partition, hop.origin.offset) == (TOPIC, 2, 3)
    extraction = hop.extraction
    assert extraction.episode.group_id == "north"
    assert [(extraction.entities[f.object].name, f.relation) for f in extraction.facts] == [
        ("Team", "HAS_PLAN")
    ]


async def test_a_change_no_rule_matches_goes_to_the_extraction_hop(
    handler: SourceHandler,
) -> None:
    emit = await one(handler, change("c", None, {"id": 4, "tenant": "north"}, table="invoices"))
    assert (emit.topic, emit.key) == (NAMES.episodes, encode_key("north"))
    assert orjson.loads(emit.value)["content"]["source"]["table"] == "invoices"


async def test_a_change_its_rule_cannot_map_is_a_dead_letter_that_replays_as_an_envelope(
    handler: SourceHandler,
) -> None:
    planless = {k: v for k, v in ACME.items() if k != "plan"}  # the rule's {row.plan}
    emit = await one(handler, change("c", None, planless))
    assert emit.topic == NAMES.dlq
    letter = decode(DeadLetter, emit.value)
    assert (letter.stage, letter.reason) == ("extraction", "mapping_missing_field")
    assert letter.consumed is not None and letter.consumed.topic == TOPIC
    # `tidegraph dlq replay` sends a stage's letter (not the source's) to {prefix}.episodes
    # keyed by its group: the record it keeps is the episode's envelope.
    envelope = orjson.loads(letter.original_bytes())
    assert envelope["group_id"] == "north" and envelope["content"]["op"] == "c"
