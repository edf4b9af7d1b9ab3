"""What every way in reads as input (issue 31): JSON with integers exact
(``records.jsontext``), the one episode shape (``id`` or ``episode_id``, ``source`` from the
content), group ids by the worker's rule everywhere (``GroupId``), and search text in which
control bytes are separators."""

from __future__ import annotations

import orjson
import pytest
from pydantic import TypeAdapter, ValidationError

from tidegraph.records import jsontext
from tidegraph.records.episode import GroupId, parse_episode
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.search import SearchRequest
from tidegraph.stores.search_text import lucene_query, search_terms

BIG = 2**64 + 1


def test_integers_over_64_bits_stay_exact_and_the_rest_reads_as_orjson_reads_it():
    raw = b'{"a": 18446744073709551617, "b": 7.0, "c": 0.00012345678901234567, "d": [1, "x"]}'
    data = jsontext.loads(raw)
    assert data["a"] == BIG and isinstance(data["a"], int)  # orjson: 1.8446744073709552e+19
    assert data == {**orjson.loads(raw), "a": BIG}
    assert jsontext.loads(raw.decode()) == data
    assert jsontext.loads(jsontext.dumps(data)) == data  # written by the standard encoder
    assert jsontext.loads(jsontext.dumps({"n": -(10**30)})) == {"n": -(10**30)}
    assert jsontext.dumps({"b": 1, "a": BIG}, sort_keys=True) == b'{"a":18446744073709551617,"b":1}'
    assert jsontext.dumps({"a": 1}) == orjson.dumps({"a": 1})  # the fast path is orjson's


def test_what_is_not_json_stays_a_json_error():
    for raw in (b"{", b'{"a": NaN}', b'"\\ud800"', b'{"a": 1' + b"0" * 5000 + b"}", b"\xff"):
        with pytest.raises(orjson.JSONDecodeError):
            jsontext.loads(raw)
    with pytest.raises(TypeError):
        jsontext.dumps({"s": "\ud800"})


def envelope(**fields: object) -> dict[str, object]:
    return {"group_id": "g", "content": "Dana called", "reference_time": "2025-01-01", **fields}


def test_one_episode_shape_id_or_episode_id_and_source_from_the_content():
    assert parse_episode(envelope(id="e1")).id == "e1"
    assert parse_episode(envelope(episode_id="e1")).uuid == parse_episode(envelope(id="e1")).uuid
    assert parse_episode(envelope(id="e1")).source == "message"
    assert parse_episode(envelope(id="e1", content={"type": "x"})).source == "json"
    assert parse_episode(envelope(id="e1", source="text")).source == "text"
    with pytest.raises(InvalidEpisode, match="id or episode_id, not both") as both:
        parse_episode(envelope(id="a", episode_id="b"))
    assert both.value.reason == "invalid_id"
    with pytest.raises(InvalidEpisode) as missing:
        parse_episode(envelope())
    assert missing.value.reason == "missing_field"


def test_integers_of_a_record_are_exact_through_the_envelope():
    raw = b'{"id": "e", "group_id": "g", "content": {"id": 18446744073709551617}, ' \
          b'"reference_time": "2025-01-01"}'  # fmt: skip
    episode = parse_episode(raw)
    assert episode.content == {"id": BIG}
    assert jsontext.loads(jsontext.dumps(episode.model_dump(mode="json")))["content"] == {"id": BIG}


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"group_id": "g\ud800"}, "invalid_group_id"),
        ({"id": "e\udc00"}, "invalid_id"),
        ({"content": "text \ud800"}, "invalid_utf8"),
        ({"name": "\ud800"}, "invalid_utf8"),
        ({"content": {"k": "\ud800"}}, "invalid_content"),
        ({"content": {"k": 10**5000}}, "invalid_content"),
    ],
)
def test_text_that_cannot_be_utf8_is_refused_with_a_reason(fields, reason):
    import sys

    digits = sys.get_int_max_str_digits()
    with pytest.raises(InvalidEpisode) as refused:
        parse_episode(envelope(**{"id": "e1", **fields}))
    assert refused.value.reason == reason
    assert sys.get_int_max_str_digits() == digits


def test_group_ids_follow_the_workers_rule_everywhere():
    group_id = TypeAdapter(GroupId)
    assert group_id.validate_python("acme") == "acme"
    for bad in ("", " acme", "acme ", "a\x00b", "a\tb", "x" * 257):
        with pytest.raises(ValidationError):
            group_id.validate_python(bad)
    with pytest.raises(ValidationError, match="spaces"):
        SearchRequest(query="x", group_ids=["acme "])
    with pytest.raises(ValidationError):
        SearchRequest(query="x", group_ids=[])
    with pytest.raises(InvalidEpisode) as padded:
        parse_episode(envelope(id="e", group_id=" g"))
    assert padded.value.reason == "invalid_group_id"


def test_control_bytes_in_search_text_are_separators_on_every_store():
    assert search_terms("acme\x00corp \x1brenewal\x7f") == ["acme", "corp", "renewal"]
    assert lucene_query("acme\x00corp") == "acme corp"
    assert search_terms("\x00\x01\x02") == []


def test_a_hop_record_keeps_the_episodes_integers_exact():
    """The worker's hops (the extracted topic) carry the episode: its integers stay exact, so
    its content hash and a mapped key are those of the envelope."""
    from tidegraph.records.stages import Extraction
    from tidegraph.topics.records import ExtractedRecord, RecordRef, decode_extracted, encode

    episode = parse_episode(
        b'{"id": "e", "group_id": "g", "content": {"account": {"id": 18446744073709551617}}, '
        b'"reference_time": "2025-01-01"}'
    )
    record = ExtractedRecord(
        origin=RecordRef(topic="t.episodes", partition=0, offset=7),
        extraction=Extraction(episode=episode),
    )
    read = decode_extracted(encode(record))
    assert isinstance(read, ExtractedRecord)
    assert read.extraction.episode.content == {"account": {"id": BIG}}
    assert read.extraction.episode.content_hash == episode.content_hash
