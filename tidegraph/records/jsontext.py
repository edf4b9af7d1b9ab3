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
# The cheap test first (a change event with its schema is a kilobyte or more, and the search
# above costs ten times the parse there): every ASCII digit made "0", anything else a space,
# and 20 zeros in a row looked for.
_DIGITS_ONLY = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_TWENTY_DIGITS = b"0" * 20


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """``orjson.loads`` with integers exact; raises ``orjson.JSONDecodeError`` (a
    ``json.JSONDecodeError``) for anything that is not JSON."""
    data = orjson.loads(raw)
    # orjson read it, so a str is valid UTF-8; JSON's numbers are ASCII digits.
    text = raw.encode() if isinstance(raw, str) else bytes(raw)
    if _TWENTY_DIGITS not in text.translate(_DIGITS_ONLY) or not _LONG_INTEGER.search(text):
        return data
    try:
        return pydantic_core.from_json(text, allow_inf_nan=False, cache_strings=False)
    except ValueError as exc:  # an integer of more than 4,300 digits
        document = text.decode(errors="replace")
        raise orjson.JSONDecodeError(f"a number is out of range: {exc}", document, 0) from None


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
