"""Read-your-writes tokens come back from callers: a token forged with fields of the wrong
types is a damaged token (a 400), never a crash (issue 31)."""

from __future__ import annotations

import base64

import orjson
import pytest

from tidegraph.app.serving.tokens import BadToken, Token


def forged(data: object) -> str:
    return "rw1." + base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")


def test_a_token_round_trips():
    token = Token("acme", "u-1", "t.episodes", 3, 42, 1_700_000_000_000)
    assert Token.decode(token.encode()) == token
    assert Token.decode(Token("acme", "u-1").encode()) == Token("acme", "u-1")


@pytest.mark.parametrize(
    "data",
    [
        {"g": "acme", "u": "u", "t": [1]},
        {"g": "acme", "u": "u", "t": {}},
        {"g": 1, "u": "u"},
        {"g": "acme", "u": None},
        {"g": "acme"},
        {"g": "acme", "u": "u", "t": "x", "p": "0"},
        {"g": "acme", "u": "u", "t": "x", "p": True},
        {"g": "acme", "u": "u", "t": "x", "o": -1},
        {"g": "acme", "u": "u", "t": "x", "s": 1.5},
        {"g": "acme", "u": "u", "t": "x", "s": 2**63},
        {"g": "acme", "u": "u", "t": "x", "s": 2**63 - 1},  # a send time past year 9999
        {"g": "acme", "u": "u", "t": "x", "s": 10**15},
        {"g": " acme", "u": "u"},
        {"g": "acme\x00", "u": "u"},
        {"g": "acme", "u": "u", "extra": 1},
        {"g": "acme", "u": "u" * 600},
        ["acme", "u"],
        "acme",
    ],
)
def test_forged_tokens_are_damaged_tokens(data):
    with pytest.raises(BadToken, match="damaged token"):
        Token.decode(forged(data))


@pytest.mark.parametrize("text", ["", "abc", "rw1.", "rw1.!!!", "rw1.\u00e9", 7, None])
def test_what_is_no_token_at_all_says_so(text):
    with pytest.raises(BadToken):
        Token.decode(text)  # type: ignore[arg-type]
