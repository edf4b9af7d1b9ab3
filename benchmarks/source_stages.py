"""The CPU of one change in each stage of the sources benchmark's paths (docs/performance.md
"Sources"), in this process, no services:

    python -m benchmarks.source_stages [--records 5000] [--repeat 5] [--out FILE]

The same CRM changes as ``benchmarks.sources`` builds, as the worker's stages see them:
``envelope`` (tidegraph's own envelopes: the extraction hop parses each and maps it),
``debezium-json`` (Connect's JSON with schemas on, through a declared source: the value and
key decoded, the episode built, the change-event rule applied) and ``debezium-avro`` (the
same events in the registry's wire format, decoded by fastavro with the schema parsed once;
the registry's client is a stand-in that hands the schema over, as the real one's cache does
after the first record). Every path ends with its extraction encoded for ``{prefix}.extracted``.
Per stage, the fastest of ``--repeat`` passes over all the records, in microseconds per change
(an insert is two envelopes). What the stages cost is a fraction of the worker's CPU per
change (Kafka's clients, the write hop, the store's driver are the rest).
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import yaml
from fastavro import parse_schema, schemaless_writer

from benchmarks.sources import (
    CHANGE_MAPPING,
    ENVELOPE_MAPPING,
    JSON_SCHEMA,
    avro_schema,
    changes,
    debezium_value,
    envelope,
)
from tidegraph.pipelines.streaming.avro import AvroValues
from tidegraph.pipelines.streaming.connect_json import JsonValues
from tidegraph.processors.mapping import MappingSet
from tidegraph.processors.sources import SourceRecord, SourceSet
from tidegraph.records import jsontext
from tidegraph.records.episode import parse_episode
from tidegraph.topics.records import ExtractedRecord, RecordRef, encode

TOPIC = "crm.public.accounts"
REF = RecordRef(topic=TOPIC, partition=0, offset=1, timestamp_ms=1)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=5000, help="changes")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5, help="passes; the fastest is kept")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    return parser.parse_args(argv)


def timed(fn: Callable[[Any], Any], items: list[Any], repeat: int) -> tuple[list[Any], float]:
    """``fn`` of every item, and the fastest pass's CPU seconds."""
    best, out = float("inf"), []
    for _ in range(repeat):
        started = time.process_time()
        out = [fn(item) for item in items]
        best = min(best, time.process_time() - started)
    return out, best


def avro_values(feed: list[dict[str, Any]]) -> tuple[list[bytes], AvroValues]:
    parsed = parse_schema(orjson.loads(avro_schema()))
    out = []
    for lsn, change in enumerate(feed, start=1):
        buffer = io.BytesIO(b"\0" + (1).to_bytes(4, "big"))
        buffer.seek(0, io.SEEK_END)
        schemaless_writer(buffer, parsed, debezium_value(change, lsn))
        out.append(buffer.getvalue())
    schema = SimpleNamespace(schema_str=avro_schema(), references=[])
    return out, AvroValues(SimpleNamespace(get_schema=lambda _id: schema))


def run(args: argparse.Namespace) -> dict[str, Any]:
    feed = changes(args.records, args.groups)
    n, repeat = len(feed), args.repeat
    spec = SourceSet.model_validate(
        {"sources": [{"name": "crm", "topics": [TOPIC], "envelope": "debezium",
                      "group": "run-{row.tenant}"}]}
    ).sources[0]  # fmt: skip
    change_rules = MappingSet.model_validate(yaml.safe_load(CHANGE_MAPPING))
    envelope_rules = MappingSet.model_validate(yaml.safe_load(ENVELOPE_MAPPING))
    keys = [orjson.dumps({"id": c["after"]["id"]}) for c in feed]
    json_values = [
        orjson.dumps({"schema": JSON_SCHEMA, "payload": debezium_value(c, lsn)})
        for lsn, c in enumerate(feed, start=1)
    ]
    avro_bytes, avro = avro_values(feed)

    def per_change(seconds: float) -> float:
        return round(seconds / n * 1e6, 1)

    def extracted(extraction: Any) -> bytes:
        return encode(ExtractedRecord(origin=REF, extraction=extraction))

    def source_path(values: list[bytes], decode: Callable[[bytes], Any]) -> dict[str, float]:
        decoded, t_value = timed(decode, values, repeat)
        decoded_keys, t_key = timed(jsontext.loads, keys, repeat)
        records = [
            SourceRecord(TOPIC, 0, offset, offset, key, value, {})
            for offset, (key, value) in enumerate(zip(decoded_keys, decoded, strict=True))
        ]
        episodes, t_episode = timed(spec.episode, records, repeat)
        extractions, t_map = timed(change_rules.extract, episodes, repeat)
        _, t_encode = timed(extracted, extractions, repeat)
        stages = {"decode_value": t_value, "decode_key": t_key, "episode": t_episode,
                  "mapping": t_map, "encode_extracted": t_encode}  # fmt: skip
        return {k: per_change(v) for k, v in stages.items()} | {
            "total": per_change(sum(stages.values()))
        }

    json_values_reader = JsonValues()
    paths = {
        "debezium-json": source_path(json_values, lambda b: json_values_reader.decode(TOPIC, b)),
        "debezium-avro": source_path(avro_bytes, avro),
    }
    _, whole = timed(jsontext.loads, json_values, repeat)
    paths["debezium-json"]["decode_value_whole"] = per_change(whole)
    envelopes = [value for c in feed for value in envelope(c, "run")]
    episodes, t_parse = timed(parse_episode, envelopes, repeat)
    extractions, t_map = timed(envelope_rules.extract, episodes, repeat)
    _, t_encode = timed(extracted, extractions, repeat)
    paths["envelope"] = {
        "parse_episode": per_change(t_parse),
        "mapping": per_change(t_map),
        "encode_extracted": per_change(t_encode),
        "total": per_change(t_parse + t_map + t_encode),
    }
    return {
        "command": "python -m benchmarks.source_stages " + " ".join(args.argv),
        "changes": n,
        "bytes_per_change": {
            "debezium-json": round(sum(map(len, json_values)) / n),
            "debezium-avro": round(sum(map(len, avro_bytes)) / n),
            "envelope": round(sum(map(len, envelopes)) / n),
        },
        "us_per_change": paths,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    text = orjson.dumps(run(args), option=orjson.OPT_INDENT_2).decode()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
