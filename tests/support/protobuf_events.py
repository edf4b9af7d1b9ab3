"""Protobuf values in the schema registry's wire format, as a producer writes them: a
Debezium-shaped envelope schema that imports another file and a well-known type, its message
classes built by protoc and the protobuf library, and Confluent's framing (confluent-kafka's
``SchemaId``: schema id and message indexes)."""

from __future__ import annotations

from typing import Any

ACCOUNT_PROTO = """
syntax = "proto3";
package crm;
import "google/protobuf/timestamp.proto";
import "crm/common.proto";

message Envelope {
  message Row {
    int64 id = 1;
    string tenant = 2;
    string name = 3;
    string plan = 4;
    string owner = 5;
  }
  string op = 1;
  Row after = 2;
  crm.Source source = 3;
  google.protobuf.Timestamp seen = 4;
  Row before = 5;
}
"""
COMMON_PROTO = """
syntax = "proto3";
package crm;
message Source { string table = 1; int64 ts_ms = 2; }
"""

ENVELOPE_MESSAGES = ("crm.Envelope", "crm.Envelope.Row", "crm.Source")


def proto_classes(
    texts: dict[str, str], root: str, names: tuple[str, ...] = ENVELOPE_MESSAGES
) -> dict[str, Any]:
    """The producer's message classes, built with protoc and the protobuf library."""
    from google.protobuf import message_factory
    from google.protobuf.descriptor_pool import DescriptorPool

    from tidegraph.pipelines.streaming.protobuf import compile_proto

    pool = DescriptorPool()
    for file in compile_proto(texts, root):
        pool.Add(file)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(n)) for n in names}


def wire(schema_id: int, indexes: list[int], message: Any) -> bytes:
    from confluent_kafka.schema_registry.common.serde import SchemaId

    return SchemaId("PROTOBUF", schema_id, message_indexes=indexes).id_to_bytes() + (
        message.SerializeToString()
    )


def register_envelope(registry_url: str, topic: str) -> int:
    """The envelope's schema registered as .proto text under ``<topic>-value``, its import
    under a subject of its own (a schema reference): its schema id."""
    from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    common_subject = f"{topic}-common"
    client.register_schema(common_subject, Schema(COMMON_PROTO, "PROTOBUF"))
    version = client.get_latest_version(common_subject).version
    reference = SchemaReference("crm/common.proto", common_subject, version)
    schema_id: int = client.register_schema(
        f"{topic}-value", Schema(ACCOUNT_PROTO, "PROTOBUF", [reference])
    )
    return schema_id


def envelope_classes() -> dict[str, Any]:
    return proto_classes(
        {"account.proto": ACCOUNT_PROTO, "crm/common.proto": COMMON_PROTO}, "account.proto"
    )
