"""Identity: deterministic uuids and the normal forms names, relation types and labels are
compared and stored in."""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
import uuid as uuidlib

# Namespace of every deterministic uuid tidegraph derives (uuid5). Never change it: the uuids
# of stored nodes and facts depend on it.
TIDEGRAPH_NAMESPACE = uuidlib.UUID("6f1d2a4e-3c8b-5e7a-9b1f-0d4c2e8a7b63")
_NAMESPACE_BYTES = TIDEGRAPH_NAMESPACE.bytes


RELATION_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")


LABEL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


# Control characters (C0, DEL, C1): never part of an id or a group id.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# A lone UTF-16 surrogate (Python text decoded from "\\ud800" by a lenient JSON parser): not
# text, it cannot be written as UTF-8.
SURROGATE = re.compile(r"[\ud800-\udfff]")


def id_problem(value: str) -> str | None:
    """What makes ``value`` unfit as an id or a group id, kept exactly as sent (None: fit):
    padding or control characters (trimming would merge tenant "X " into "X") or a lone
    surrogate. The one rule of every way in (the worker, ``ingest``, HTTP, MCP, Python)."""
    if value != value.strip() or _CONTROL.search(value):
        return "has leading/trailing spaces or control characters"
    if SURROGATE.search(value):
        return "has a lone UTF-16 surrogate (not text)"
    return None


@functools.lru_cache(maxsize=1 << 16)
def stable_uuid(*parts: str) -> str:
    """A deterministic uuid from its parts, joined with the unit separator (\\x1f).

    Unambiguous because only the last part of any call may contain the separator: group ids
    and episode ids refuse control characters (``Episode``), the other leading parts are
    constants, uuids and relation names (``RELATION_RE``). Remembered: an episode's uuid is
    asked at every stage, an entity's at every mention."""
    return derived_uuid(*parts)


def derived_uuid(*parts: str) -> str:
    """``stable_uuid`` not remembered, for a uuid asked once (a change's id: every write
    makes several, none asked again, and remembering them would push out the ones asked at
    every stage). The uuid5 of RFC 4122, ``str(uuid.uuid5(TIDEGRAPH_NAMESPACE, name))``,
    computed without building a ``UUID`` (a quarter of the time)."""
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + "\x1f".join(parts).encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # the RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_PUNCTUATION = re.compile(r"[^\w\s]")


@functools.lru_cache(maxsize=1 << 14)  # the same names and fact texts, asked at every stage
def normalize_name(name: str) -> str:
    """The form names are compared in: NFKC, casefolded, punctuation dropped, spaces folded."""
    text = unicodedata.normalize("NFKC", name).casefold()
    text = _PUNCTUATION.sub(" ", text)
    return " ".join(text.split())


@functools.lru_cache(maxsize=4096)  # a handful of relations, named on every fact
def to_relation_name(raw: str) -> str:
    """UPPER_SNAKE_CASE relation type from any text; never empty, always RELATION_RE-valid."""
    text = unicodedata.normalize("NFKD", raw).encode("ascii", "ignore").decode()
    text = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").upper()
    if not text or not text[0].isalpha():
        text = "REL_" + text if text else "RELATES_TO"
    return text[:64]


def to_label(raw: str) -> str | None:
    """A safe node label (letters, digits, underscore; starts with a letter) or None."""
    text = re.sub(r"[^A-Za-z0-9_]+", "", raw.strip().replace(" ", "_"))
    if not text or not text[0].isalpha():
        return None
    text = text[:64]
    return text if LABEL_RE.match(text) else None
