"""JSON text in and out with integers kept exact (docs/mappings.md "Declared mappings": keys).

orjson is the codec of the wire, but it reads an integer over 64 bits as a float
(``2**64`` -> ``1.8446744073709552e+19``, so ids ``2**64`` and ``2**64 + 1`` became one
entity) and refuses to write one. ``loads`` reads such text again with pydantic-core's parser,
which keeps every integer exact (up to 4,300 digits, Python's limit); ``dumps`` falls back to
the standard library's encoder for a value orjson cannot write. Text without a long integer
(nearly all of it) takes orjson's path alone.
"""

from __future__ import annotations

import json
import re
from datetime import date, datetime
from typing import Any

import orjson
import pydantic_core

# A run of 20+ digits that does not follow a decimal point: possibly an integer over 64 bits
# (19 digits always fit; the digits of a float's fraction never count).
_LONG_INTEGER = re.compile(rb"(?<![.\d])\d{20,}")
_LONG_INTEGER_TEXT = re.compile(r"(?<![.\d])\d{20,}")


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """``orjson.loads`` with integers exact; raises ``orjson.JSONDecodeError`` (a
    ``json.JSONDecodeError``) for anything that is not JSON."""
    data = orjson.loads(raw)
    if isinstance(raw, str):
        long = _LONG_INTEGER_TEXT.search(raw) is not None
    else:
        raw = bytes(raw)
        long = _LONG_INTEGER.search(raw) is not None
    if not long:
        return data
    try:
        return pydantic_core.from_json(raw, allow_inf_nan=False, cache_strings=False)
    except ValueError as exc:  # an integer of more than 4,300 digits
        text = raw if isinstance(raw, str) else raw.decode(errors="replace")
        raise orjson.JSONDecodeError(f"a number is out of range: {exc}", text, 0) from None


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """``orjson.dumps`` (sorted keys when asked), or the standard library's encoder for what
    orjson cannot write (an integer over 64 bits). Raises TypeError or ValueError for a value
    that is not JSON (a lone surrogate, an integer of more than 4,300 digits)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    except orjson.JSONEncodeError as exc:
        if "64-bit" not in str(exc):
            raise
    text = json.dumps(
        value, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False, default=_default
    )
    return text.encode()


def _default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")
