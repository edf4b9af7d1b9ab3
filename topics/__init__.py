"""Topic names, record schemas (orjson on the wire) and topic creation.

See ``docs/topology.md`` for the table of topics (key, value schema, producer, consumer).
"""

from topics.admin import TopicSetupError, ensure_topics
from topics.names import STAGES, TopicNames
from topics.records import (
    DeadLetter,
    ExtractedRecord,
    NewEntityRecord,
    RecordRef,
    ResolvedRecord,
    StampedRecord,
    decode,
    encode,
)

__all__ = [
    "STAGES",
    "DeadLetter",
    "ExtractedRecord",
    "NewEntityRecord",
    "RecordRef",
    "ResolvedRecord",
    "StampedRecord",
    "TopicNames",
    "TopicSetupError",
    "decode",
    "encode",
    "ensure_topics",
]
