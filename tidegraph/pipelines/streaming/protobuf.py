"""Protobuf values in the schema registry's wire format, read without generated classes
(docs/sources.md "Schema registry").

Confluent's framing for Protobuf: a zero byte, the schema id (4 bytes), the message indexes
(which message of the schema's file: a varint array, read by confluent-kafka's ``SchemaId``),
then the message. The schema is fetched once per id from the registry with confluent-kafka's
client, with the schemas it references (its imports). A registry holds a Protobuf schema as
``.proto`` text (Java's serializers, Apicurio's converters, a schema registered by hand), which
grpcio-tools' protoc compiles into descriptors, or as a base64 ``FileDescriptorProto``
(confluent-kafka's Python serializer), read as it is. The protobuf library builds the message
class from the descriptors and parses the bytes; the value is the message as a dict (field
names as declared, every field present, 64-bit integers as numbers up to 2**53 and as their
exact digits in text beyond, as protobuf's JSON mapping gives them).
"""

from __future__ import annotations

import base64
import binascii
import importlib
import io
import tempfile
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, json_format, message_factory
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import DecodeError, Message

# protoc runs in this process (grpc_tools' extension): one compile at a time.
_PROTOC = threading.Lock()


class ProtobufError(ValueError):
    """A Protobuf value or schema that cannot be read (the message says why)."""


class ProtobufValues:
    """``decode(data, context) -> dict``: a wire-format Protobuf value, its schema fetched
    through ``client`` (confluent-kafka's ``SchemaRegistryClient``) once per id. The
    registry's errors pass through (``SchemaRegistryError``: the caller tells an unknown id
    from an outage)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._classes: dict[tuple[int, tuple[int, ...]], type[Message]] = {}
        self._files: dict[int, tuple[DescriptorPool, descriptor_pb2.FileDescriptorProto]] = {}

    def __call__(self, data: bytes, context: Any = None) -> dict[str, Any]:
        from confluent_kafka.schema_registry.common.serde import SchemaId

        wire = SchemaId("PROTOBUF")
        try:
            payload = wire.from_bytes(io.BytesIO(data))
        except Exception as exc:  # a cut header or index array
            raise ProtobufError(f"not Protobuf's wire format: {exc}") from None
        if wire.id is None:
            raise ProtobufError("the value names its schema by guid, not by id")
        indexes = tuple(wire.message_indexes or [0])
        cls = self._classes.get((wire.id, indexes))
        if cls is None:
            cls = self._classes[(wire.id, indexes)] = self._message_class(wire.id, indexes)
        message = cls()
        try:
            message.ParseFromString(payload.read())
        except DecodeError as exc:
            raise ProtobufError(f"the message does not parse: {exc}") from None
        value: dict[str, Any] = json_format.MessageToDict(
            message,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
            unquote_int64_if_possible=True,
        )
        return value

    def _message_class(self, schema_id: int, indexes: tuple[int, ...]) -> type[Message]:
        if schema_id not in self._files:
            self._files[schema_id] = self._file_of(schema_id)
        pool, root = self._files[schema_id]
        name = _message_name(root, indexes)
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    def _file_of(self, schema_id: int) -> tuple[DescriptorPool, descriptor_pb2.FileDescriptorProto]:
        """The schema's file and every file it imports, in one pool of its own."""
        schema = self.client.get_schema(schema_id)
        root = f"registry_schema_{schema_id}.proto"
        sources = {root: schema.schema_str or ""}
        self._add_references(schema.references or [], sources)
        pool = DescriptorPool()
        if all(_serialized(text) is not None for text in sources.values()):
            files = _serialized_files(sources)
        else:
            files = compile_proto(sources, root)
        for file in files:
            pool.Add(file)
        [root_file] = [f for f in files if f.name == root]
        return pool, root_file

    def _add_references(self, references: list[Any], sources: dict[str, str]) -> None:
        for ref in references:
            if ref.name in sources:
                continue
            registered = self.client.get_version(ref.subject, ref.version)
            sources[ref.name] = registered.schema.schema_str or ""
            self._add_references(registered.schema.references or [], sources)


def compile_proto(sources: dict[str, str], root: str) -> list[descriptor_pb2.FileDescriptorProto]:
    """``root`` and its imports (``sources``: file name -> ``.proto`` text; Google's
    well-known types come with protoc) compiled by protoc, dependencies first."""
    from grpc_tools import protoc

    include = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory(prefix="tidegraph-proto-") as folder:
        for name, text in sources.items():
            path = Path(folder, name)
            if not path.resolve().is_relative_to(Path(folder).resolve()):
                raise ProtobufError(f"the schema imports {name!r}, outside its folder")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        out = Path(folder, "descriptors.pb")
        args = ["protoc", f"-I{folder}", f"-I{include}", "--include_imports",
                f"--descriptor_set_out={out}", str(Path(folder, root))]  # fmt: skip
        with _PROTOC:
            code = protoc.main(args)
        if code != 0 or not out.exists():
            raise ProtobufError("the schema's .proto text does not compile (protoc said why)")
        found = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return list(found.file)


def _serialized(text: str) -> descriptor_pb2.FileDescriptorProto | None:
    """A schema given as a base64 ``FileDescriptorProto``, or None (``.proto`` text)."""
    try:
        raw = base64.b64decode(text, validate=True)
        return descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, DecodeError, ValueError):
        return None


def _serialized_files(sources: dict[str, str]) -> list[descriptor_pb2.FileDescriptorProto]:
    """Base64 ``FileDescriptorProto`` schemas named as imported, dependencies first (Google's
    well-known types from the protobuf library)."""
    files = {}
    for name, text in sources.items():
        file = _serialized(text)
        assert file is not None
        file.name = name
        files[name] = file
    ordered: list[descriptor_pb2.FileDescriptorProto] = []
    seen: set[str] = set()

    def add(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        if name not in files:
            ordered.append(_well_known(name))
            return
        for dependency in files[name].dependency:
            add(dependency)
        ordered.append(files[name])

    for name in sources:
        add(name)
    return ordered


def _well_known(name: str) -> descriptor_pb2.FileDescriptorProto:
    """One of Google's well-known types (``google/protobuf/timestamp.proto``)."""
    if not name.startswith("google/protobuf/") or "/" in name.removeprefix("google/protobuf/"):
        raise ProtobufError(f"the schema imports {name!r}, which the registry did not give")
    try:
        module = importlib.import_module("google.protobuf." + Path(name).stem + "_pb2")
    except ImportError:
        raise ProtobufError(f"the schema imports {name!r}, an unknown Google type") from None
    return descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)


def _message_name(file: descriptor_pb2.FileDescriptorProto, indexes: tuple[int, ...]) -> str:
    """The full name of the message the wire format's indexes name (the first top-level
    message by default; nested ones by their position within their parent)."""
    names = []
    messages = file.message_type
    for index in indexes:
        if not 0 <= index < len(messages):
            raise ProtobufError(
                f"message index {list(indexes)} is not in the schema "
                f"({len(messages)} message(s) there)"
            )
        names.append(messages[index].name)
        messages = messages[index].nested_type
    return ".".join([file.package, *names] if file.package else names)
