"""Deterministic uuids: the stored nodes' and changes' ids never change with the code."""

from __future__ import annotations

import uuid

import pytest

from tidegraph.records.ids import TIDEGRAPH_NAMESPACE, derived_uuid, stable_uuid


@pytest.mark.parametrize(
    "parts",
    [
        ("entity", "acme", "Acme Corp"),
        ("change", "group-1", "ep-7", "fact.created", "3f1d2a4e-3c8b-5e7a-9b1f-0d4c2e8a7b63"),
        ("episode", "tenant-é", "naïve ☃ 名前"),
        ("",),
        ("a\x1fb", "c"),
    ],
)
def test_a_derived_uuid_is_the_rfc_4122_uuid5_of_its_joined_parts(parts: tuple[str, ...]) -> None:
    expected = str(uuid.uuid5(TIDEGRAPH_NAMESPACE, "\x1f".join(parts)))
    assert derived_uuid(*parts) == expected
    assert stable_uuid(*parts) == expected
    assert uuid.UUID(expected).version == 5


def test_an_id_stored_before_stays_the_same() -> None:
    # the uuid of this entity as every store holds it since the namespace was fixed
    assert stable_uuid("entity", "g", "x") == str(
        uuid.uuid5(uuid.UUID("6f1d2a4e-3c8b-5e7a-9b1f-0d4c2e8a7b63"), "entity\x1fg\x1fx")
    )
