"""The producers' partitioner: Kafka's default placement of every key, its hash kept."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner

from tidegraph.pipelines.pending import partition_of
from tidegraph.pipelines.streaming.app import _faust_app
from tidegraph.pipelines.streaming.config import WorkerSettings
from tidegraph.settings import Settings
from tidegraph.topics.client import producer_for
from tidegraph.topics.partitioning import KeyPartitioner

KEYS = [f"tenant-{i}".encode() for i in range(300)] + [
    b"",
    "gr\u00fcppe \u2603".encode(),
    b"x" * 300,
]


def test_every_key_goes_where_kafkas_default_partitioner_puts_it_every_time() -> None:
    kafka, ours = DefaultPartitioner(), KeyPartitioner(max_keys=50)  # forgets as it goes
    for partitions in (1, 3, 8, 12):
        every = list(range(partitions))
        for _ in range(2):  # hashed, then kept
            for key in KEYS:
                assert ours(key, every, every) == kafka(key, every, every)
                assert partition_of(key.decode(), partitions) == kafka(key, every, every)


def test_a_record_without_key_goes_to_an_available_partition() -> None:
    ours = KeyPartitioner()
    assert {ours(None, [0, 1, 2, 3], [2]) for _ in range(20)} == {2}
    assert {ours(None, [0, 1], []) for _ in range(50)} <= {0, 1}


def test_the_workers_producer_uses_it(tmp_path: object) -> None:
    settings = Settings(data_dir=tmp_path)
    app = _faust_app(settings, WorkerSettings(), None)
    assert isinstance(app.conf.producer_partitioner, KeyPartitioner)


async def test_the_clients_producer_uses_it(tmp_path: object) -> None:
    producer = producer_for(Settings(data_dir=tmp_path))
    assert isinstance(producer._partitioner, KeyPartitioner)
