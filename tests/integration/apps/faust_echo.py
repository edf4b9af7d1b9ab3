"""A minimal Faust app for the smoke test: its agent records every value it sees by
forwarding it, tagged, to an output topic. Run as ``python -m faust -A ... worker``."""

import os

import faust

PREFIX = os.environ["SMOKE_PREFIX"]
BROKER = os.environ["SMOKE_BROKER"]
DATADIR = os.environ["SMOKE_DATADIR"]

app = faust.App(
    PREFIX,
    broker=f"kafka://{BROKER}",
    store="memory://",
    datadir=DATADIR,
    web_enabled=False,
    topic_partitions=2,
    consumer_auto_offset_reset="earliest",
)
source = app.topic(f"{PREFIX}-in", key_serializer="raw", value_serializer="raw", partitions=2)
seen = app.topic(f"{PREFIX}-seen", key_serializer="raw", value_serializer="raw", partitions=2)


@app.agent(source)
async def record(stream):  # type: ignore[no-untyped-def]
    async for key, value in stream.items():
        await seen.send(key=key, value=b"seen:" + value)
