"""Values in the schema registry's wire format (tidegraph/pipelines/streaming/sources.py
``RegistryDecoder``), the part decided before any schema is fetched: bytes that are not the
format, a registry that does not answer. Decoding through a real registry is in
tests/integration/test_source_registry.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tidegraph.pipelines.streaming.sources import RegistryDecoder, RegistryUnavailable
from tidegraph.processors.sources import RegistrySpec
from tidegraph.records.errors import RecordError

TOPIC = "crm.public.accounts"


@pytest.fixture
def closed_url() -> Iterator[str]:
    """A registry URL on a loopback port that is bound (so no one else takes it) and refuses
    every connection (nothing listens)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/apis/ccompat/v7"


@pytest.mark.parametrize("data", [b'{"op": "c"}', b"\x00\x00", b"\x01\x00\x00\x00\x01abc"])
async def test_bytes_that_are_not_the_wire_format_say_so(closed_url: str, data: bytes) -> None:
    with pytest.raises(RecordError) as failed:
        await RegistryDecoder(RegistrySpec(url=closed_url)).decode(TOPIC, data)
    assert failed.value.reason == "source_undecodable"
    assert "wire format" in str(failed.value)


async def test_an_unreachable_registry_is_transient(closed_url: str) -> None:
    with pytest.raises(RegistryUnavailable):
        await RegistryDecoder(RegistrySpec(url=closed_url)).decode(
            TOPIC, b"\x00\x00\x00\x00\x01\x02"
        )
