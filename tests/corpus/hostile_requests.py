"""Requests a hostile or careless client sends ``tidegraph serve`` (issue 31): forged tokens,
bodies that are not what they claim, odd headers, query text in FTS5/Lucene/Cypher syntax and
control bytes, group-id lists. Every one must be answered below 500 in the one error shape,
and none may show another tenant's memory.

``hostile_requests(own, other, other_token)`` builds the corpus for a caller whose key may use
group ``own`` only: ``other`` is another tenant's group (its memory must never show) and
``other_token`` a token of one of its episodes.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tidegraph.records import jsontext

JSON = {"content-type": "application/json"}


@dataclass
class Case:
    name: str
    method: str
    path: str
    params: list[tuple[str, str]] | None = None
    json: Any = None
    content: bytes | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    # Statuses the case may answer (None: any below 500).
    expect: frozenset[int] | None = None
    # Bytes sent as they are over a socket (b"{key}" stands for the caller's API key): what an
    # HTTP client library will not send.
    raw: bytes | None = None


def token(data: Any) -> str:
    """A forged read-your-writes token carrying ``data``."""
    return "rw1." + base64.urlsafe_b64encode(jsontext.dumps(data)).decode().rstrip("=")


def _raw_token(raw: bytes) -> str:
    return "rw1." + base64.urlsafe_b64encode(raw).decode().rstrip("=")


# Query text: FTS5, Lucene and Cypher syntax, control bytes, odd Unicode, sizes.
QUERY_TEXTS = [
    # FTS5
    '"', '""', '"unterminated phrase', "a*", "*", "NEAR(acme plan)", "acme AND OR NOT plan",
    "^acme", "text : acme", "group_id : other", "{text group_id}: acme", "-acme", "acme +plan",
    "acme NOT", "(acme", "acme)", "'; DROP TABLE fact; --", "x' OR '1'='1",
    # Lucene
    "*:*", "name:acme~2", "[a TO z]", "{a TO z}", "acme^10", "/ac.*me/", "acme && plan || x",
    "\\", "\\\\\\", "!acme", "acme?", "a:b:c", "(((((((((((", ")))))))))))", "AND", "OR NOT",
    # Cypher
    "MATCH (n) DETACH DELETE n", "'}) RETURN n //", "$group_id", "`group_id`",
    "n.group_id = 'other' OR true", "CALL db.index.fulltext.queryNodes('x', '*')",
    # control bytes and odd Unicode
    "a\x00b", "\x00", "\x01\x02\x03 acme", "acme\x1b[31m", "\x7f\x7f", "line\u2028break",
    "\ufeffacme", "a\u202eemca", "e\u0301\u0301\u0301", "🚀 acme 🚀", "\u200b", "\t\n\r",
    # sizes and shapes
    "acme " * 399, "x" * 2000, " ".join(f"w{n}" for n in range(200)), "the and of to",
    "!!!???...", "0123456789", "é" * 500, "a" * 300,
    # time words at the edges of the calendar
    "acme plan on 9999-12-31", "acme plan on 0001-01-01", "acme in 9999", "acme in 0001",
    "acme plan 999999 weeks ago", "acme December 9999", "acme January 0001",
]  # fmt: skip

# Times at the edges of what a datetime holds (issue 48): out of range once in UTC, or too
# near the edge for a window around them.
EXTREME_TIMES = [
    "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999Z",
]  # fmt: skip

# Group-id lists a search may name.
GROUP_LISTS = [
    [""], [" "], [" own"], ["own "], ["a\x00b"], ["a\tb"], ["x" * 257], ["é" * 256],
    ["\u0000"], [None], [1], [["nested"]], [{}], ["own", "own", "own"], ["x"] * 65, [],
]  # fmt: skip


def hostile_requests(own: str, other: str, other_token: str) -> list[Case]:
    cases: list[Case] = []
    add = cases.append

    # ------------------------------------------------------------------ tokens
    forged = {
        "t list": {"g": own, "u": "u1", "t": [1]},
        "t object": {"g": own, "u": "u1", "t": {}},
        "g number": {"g": 123, "u": "u1"},
        "g null": {"g": None, "u": "u1"},
        "u missing": {"g": own},
        "p text": {"g": own, "u": "u1", "t": "topic", "p": "x", "o": 1},
        "o negative": {"g": own, "u": "u1", "t": "topic", "p": 0, "o": -1},
        "s huge": {"g": own, "u": "u1", "t": "topic", "p": 0, "o": 0, "s": 10**30},
        "s past year 9999": {"g": own, "u": "u1", "t": "topic", "p": 0, "o": 0, "s": 2**63 - 1},
        "s float": {"g": own, "u": "u1", "t": "topic", "p": 0, "o": 0, "s": 1.5},
        "p bool": {"g": own, "u": "u1", "t": "topic", "p": True, "o": 0},
        "extra key": {"g": own, "u": "u1", "x": 1},
        "padded group": {"g": f" {own}", "u": "u1"},
        "control group": {"g": f"{own}\x00", "u": "u1"},
        "list": [own, "u1"],
        "number": 7,
        "deep": {"g": own, "u": {"a": {"b": {"c": [[[[[]]]]]}}}},
        "long uuid": {"g": own, "u": "u" * 5000},
    }
    raw_tokens = {
        "not base64": "rw1.!!!!",
        "no prefix": "abc",
        "empty": "",
        "prefix only": "rw1.",
        "invalid utf-8": _raw_token(b'{"g": "\xff", "u": "x"}'),
        "not json": _raw_token(b"\x00\x01\x02"),
        "huge": "rw1." + "A" * 20_000,
        "unicode": "rw1.éé",
    }
    for name, data in forged.items():
        raw_tokens[name] = token(data)
    for n, (name, value) in enumerate(raw_tokens.items()):
        route = n % 3
        if route == 0:
            add(
                Case(
                    f"token {name} (search)",
                    "POST",
                    "/v1/search",
                    json={"query": "acme", "wait_for": [value]},
                )
            )
        elif route == 1:
            add(
                Case(
                    f"token {name} (context)",
                    "POST",
                    "/v1/context",
                    json={"query": "acme", "wait_for": [value]},
                )
            )
        else:
            add(Case(f"token {name} (facts)", "GET", "/v1/facts", params=[("wait_for", value)]))
    add(
        Case(
            "token of another tenant",
            "POST",
            "/v1/search",
            json={"query": "acme", "wait_for": [other_token]},
            expect=frozenset({403}),
        )
    )
    add(
        Case(
            "token of another tenant (facts)",
            "GET",
            "/v1/facts",
            params=[("wait_for", other_token)],
            expect=frozenset({403}),
        )
    )
    add(
        Case(
            "33 tokens",
            "POST",
            "/v1/search",
            json={"query": "acme", "wait_for": [token({"g": own, "u": str(n)}) for n in range(33)]},
            expect=frozenset({422}),
        )
    )

    # ------------------------------------------------------------------ bodies
    def body(name: str, raw: bytes, path: str = "/v1/search", **kw: Any) -> None:
        add(Case(name, "POST", path, content=raw, headers={**JSON, **kw.pop("headers", {})}, **kw))

    body("not json", b"{not json")
    body("invalid utf-8", b'{"query": "\xff\xfe"}')
    body("utf-16", '{"query": "acme"}'.encode("utf-16"))
    body("lone surrogate in query", b'{"query": "\\ud800"}')
    body("lone surrogate in centre", b'{"query": "acme", "centre": "\\udc00"}')
    body("lone surrogate in group", b'{"query": "acme", "group_ids": ["\\ud83d"]}')
    body(
        "lone surrogate in content",
        b'{"content": "\\ud800", "reference_time": "2025-01-01"}',
        "/v1/episodes",
    )
    body(
        "lone surrogate in group_id",
        b'{"content": "x", "reference_time": "2025-01-01", "group_id": "\\ud800"}',
        "/v1/episodes",
    )
    body(
        "integer 10**30 in content",
        b'{"content": {"n": 1000000000000000000000000000000}, "source": "json", '
        b'"reference_time": "2025-01-01"}',
        "/v1/episodes",
    )
    body("5000-digit integer", b'{"query": "acme", "limit": 1' + b"0" * 5000 + b"}")
    body(
        "5000-digit integer in content",
        b'{"content": {"n": 1' + b"0" * 5000 + b'}, "reference_time": "2025-01-01"}',
        "/v1/episodes",
    )
    body("NaN", b'{"query": "acme", "limit": NaN}')
    body("Infinity timeout", b'{"query": "acme", "wait_timeout_seconds": Infinity}')
    body("nested 2000 levels", b'{"query": "acme", "centre": ' + b"[" * 2000 + b"]" * 2000 + b"}")
    body(
        "nested content",
        b'{"content": ' + b'{"a":' * 200 + b"1" + b"}" * 200 + b', "reference_time": "2025-01-01"}',
        "/v1/episodes",
    )
    body("array", b"[1, 2, 3]")
    body("string", b'"acme"')
    body("null", b"null")
    body("empty", b"")
    body("whitespace", b"   \n ")
    body("duplicate keys", b'{"query": "acme", "query": "plan"}')
    body("BOM", b'\xef\xbb\xbf{"query": "acme"}')
    add(
        Case(
            "text/plain body",
            "POST",
            "/v1/search",
            content=b'{"query": "acme"}',
            headers={"content-type": "text/plain"},
        )
    )
    add(Case("no content-type", "POST", "/v1/search", content=b'{"query": "acme"}'))
    add(
        Case(
            "form body",
            "POST",
            "/v1/search",
            content=b"query=acme",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
    )
    add(
        Case(
            "multipart content-type",
            "POST",
            "/v1/episodes",
            content=b"--x--",
            headers={"content-type": "multipart/form-data; boundary=x"},
        )
    )

    def raw(name: str, head: bytes, payload: bytes = b"") -> None:
        add(Case(name, "RAW", "", raw=head + b"\r\n\r\n" + payload))

    post = b"POST /v1/search HTTP/1.1\r\nHost: t\r\nX-API-Key: {key}\r\nConnection: close"
    query = b'{"query": "acme"}'
    typed = post + b"\r\nContent-Type: application/json"
    raw("content-length short", typed + b"\r\nContent-Length: 5", query)
    raw("content-length not a number", typed + b"\r\nContent-Length: ten", query)
    raw("content-length negative", typed + b"\r\nContent-Length: -1", query)
    raw("content-length twice", typed + b"\r\nContent-Length: 17\r\nContent-Length: 3", query)
    raw("content-length huge", typed + b"\r\nContent-Length: 1000000000000", query)
    chunked = typed + b"\r\nTransfer-Encoding: chunked"
    raw("chunked and content-length", chunked + b"\r\nContent-Length: 17", b"0\r\n\r\n")
    raw("chunk size garbage", chunked, b"zz\r\nabc\r\n0\r\n\r\n")
    raw("chunked JSON", chunked, b"11\r\n" + query + b"\r\n0\r\n\r\n")
    get = b"GET /v1/facts HTTP/1.1\r\nHost: t"
    raw("header value NUL", get + b"\r\nX-API-Key: a\x00b")
    raw("authorization bearer and spaces", get + b"\r\nAuthorization: Bearer   ")
    raw("header without colon", get + b"\r\nno colon here")
    raw("header 20 KiB", get + b"\r\nX-Big: " + b"a" * 20_000)
    raw("request line garbage", b"GARBAGE")
    raw("HTTP/1.0", b"GET /v1/facts HTTP/1.0\r\nX-API-Key: {key}")
    raw("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM")
    raw("no host", b"GET /v1/facts HTTP/1.1\r\nX-API-Key: {key}\r\nConnection: close")
    raw(
        "path with raw bytes",
        b"GET /v1/episodes/\xff\xfe/status HTTP/1.1\r\nHost: t\r\nX-API-Key: {key}\r\n"
        b"Connection: close",
    )

    def search(case: str, **fields: Any) -> None:
        add(Case(case, "POST", "/v1/search", json={"query": "acme", **fields}))

    search("unknown field", grup_ids=[own])
    search("limit 0", limit=0)
    search("limit negative", limit=-1)
    search("limit 10**30", limit=10**30)
    search("limit text", limit="ten")
    search("limit float", limit=1.5)
    search("recipe unknown", recipe="best")
    search("recipe needs centre", recipe="facts_distance")
    search("recipe needs a cross-encoder", recipe="facts_cross_encoder")
    search("centre unknown", recipe="facts_distance", centre="no-such-entity")
    search("centre long", recipe="entities_distance", centre="c" * 300)
    search("include_invalid text", include_invalid="yes please")
    search("wait timeout zero", wait_timeout_seconds=0)
    search("wait timeout huge", wait_timeout_seconds=1e308)
    search("valid_at garbage", valid_at="the other day-ish")
    search("valid_at 101 chars", valid_at="x" * 101)
    search("valid_at long phrase", valid_at="since the first week " * 4)
    search("valid_at out of range", valid_at="9999-12-31T23:59:59-23:59")
    search("valid_at year 1 ahead", valid_at="0001-01-01T00:00:00+14:00")
    search("valid_at epoch huge", valid_at="99999999999999999999")
    search("known_at in the future", known_at="3000-01-01")
    search("known_at yesterday", known_at="yesterday")
    search("query missing", query=None)
    search("query empty", query="")
    search("query blank", query="   ")
    search("query 2001 chars", query="x" * 2001)
    search("query a number", query=42)
    search("query a list", query=["acme"])
    add(Case("context episodes 5", "POST", "/v1/context", json={"query": "acme", "episodes": 5}))
    add(
        Case("context max_chars 10", "POST", "/v1/context", json={"query": "acme", "max_chars": 10})
    )
    add(
        Case(
            "context max_chars huge",
            "POST",
            "/v1/context",
            json={"query": "acme", "max_chars": 10**12},
        )
    )

    def episode(case: str, **fields: Any) -> None:
        base = {"content": "Dana called", "reference_time": "2025-01-01T00:00:00Z"}
        add(Case(case, "POST", "/v1/episodes", json={**base, **fields}))

    episode("episode group padded", group_id=f" {own} ")
    episode("episode group empty", group_id="")
    episode("episode group control", group_id=f"{own}\x07")
    episode("episode group long", group_id="g" * 300)
    episode("episode of another tenant", group_id=other)
    episode("episode id and episode_id", id="a", episode_id="b")
    episode("episode id 10k", episode_id="e" * 10_000)
    episode("episode id padded", episode_id=" e1 ")
    episode("episode id control", episode_id="e\x00")
    episode("episode source unknown", source="email")
    episode("episode json source with text", source="json")
    episode("episode content empty", content="")
    episode("episode content empty object", content={})
    episode("episode content list", content=[1, 2])
    episode("episode content number", content=7)
    episode("episode reference_time garbage", reference_time="whenever")
    episode("episode reference_time epoch huge", reference_time="1" * 30)
    episode("episode reference_time negative", reference_time="-99999999999")
    episode("episode reference_time zeros", reference_time="0000-00-00")
    episode("episode reference_time 101 chars", reference_time="2025" + " " * 97)
    episode("episode name long", name="n" * 300)
    episode("episode without reference_time", reference_time=None)
    episode("episode with the id name", id="via-id")

    # ------------------------------------------------------------------ headers
    def headers(name: str, value: dict[str, Any], path: str = "/v1/facts") -> None:
        add(Case(name, "GET", path, headers=value))

    headers("x-api-key invalid utf-8", {"X-API-Key": b"\xff\xfe\xfd-key"})
    headers("authorization invalid utf-8", {"Authorization": b"Bearer \xc3\x28\xa0\xa1"})
    headers("authorization latin-1", {"Authorization": "Bearer caf\xe9-key".encode("latin-1")})
    headers("authorization no scheme", {"Authorization": "key-only"})
    headers("authorization bearer alone", {"Authorization": "Bearer"})
    headers("authorization basic", {"Authorization": "Basic dXNlcjpwYXNz"})
    headers("x-api-key 8 KiB", {"X-API-Key": "k" * 8192})
    headers("both keys, one wrong", {"Authorization": "Bearer wrong-key-xx"})
    headers(
        "content-type charset latin-1",
        {"content-type": "application/json; charset=latin-1"},
        "/v1/entities",
    )
    headers("accept xml", {"accept": "application/xml"}, "/v1/entities")
    headers("host odd", {"host": "évil.example:99999".encode()}, "/v1/entities")
    headers("many headers", {f"x-h{n}": "v" for n in range(90)}, "/v1/entities")
    headers("header with invalid utf-8 name-value", {"x-tenant": b"\x80\x81"}, "/v1/entities")

    # ------------------------------------------------------------------ query strings
    for n, text in enumerate(QUERY_TEXTS):
        recipe = ("combined", "facts_rrf", "episodes_bm25", "entities_rrf", "communities_rrf")[
            n % 5
        ]
        add(
            Case(
                f"query {text[:24]!r} ({recipe})",
                "POST",
                "/v1/search",
                json={"query": text, "recipe": recipe},
            )
        )
    for text in QUERY_TEXTS[::6]:
        add(Case(f"GET query {text[:24]!r}", "GET", "/v1/search", params=[("query", text)]))
    for text in QUERY_TEXTS[::9]:
        add(Case(f"context query {text[:24]!r}", "POST", "/v1/context", json={"query": text}))
    add(Case("GET query percent-encoded NUL", "GET", "/v1/search?query=a%00b"))
    add(Case("GET query invalid utf-8", "GET", "/v1/search?query=%FF%FE"))
    add(Case("GET query encoded surrogate", "GET", "/v1/search?query=%ED%A0%80"))
    add(Case("GET query missing", "GET", "/v1/search"))
    add(Case("GET limit 10**30", "GET", "/v1/search", params=[("query", "x"), ("limit", "1" * 31)]))
    add(
        Case(
            "GET include_invalid maybe",
            "GET",
            "/v1/search",
            params=[("query", "x"), ("include_invalid", "maybe")],
        )
    )
    add(
        Case(
            "GET singular group_id",
            "GET",
            "/v1/search",
            params=[("query", "x"), ("group_id", own)],
            expect=frozenset({422}),
        )
    )
    add(Case("GET facts valid_at NUL", "GET", "/v1/facts?valid_at=2025%00"))
    add(Case("GET facts unknown param", "GET", "/v1/facts?group_ids=x", expect=frozenset({422})))

    # ------------------------------------------------------------------ group ids
    for groups in GROUP_LISTS:
        add(
            Case(
                f"group_ids {str(groups)[:30]}",
                "POST",
                "/v1/search",
                json={"query": "acme", "group_ids": groups},
            )
        )
    add(
        Case(
            "group_ids the other tenant",
            "POST",
            "/v1/search",
            json={"query": "acme", "group_ids": [other]},
            expect=frozenset({403}),
        )
    )
    add(
        Case(
            "group_ids own and other",
            "POST",
            "/v1/search",
            json={"query": "acme", "group_ids": [own, other]},
            expect=frozenset({403}),
        )
    )
    add(
        Case(
            "group_ids GET other",
            "GET",
            "/v1/search",
            params=[("query", "acme"), ("group_ids", own), ("group_ids", other)],
            expect=frozenset({403}),
        )
    )
    add(
        Case(
            "context of the other tenant",
            "POST",
            "/v1/context",
            json={"query": "acme", "group_ids": [other]},
            expect=frozenset({403}),
        )
    )
    for value in ("", " ", f"{own} ", "a\x00", other, "x" * 300):
        add(
            Case(f"facts group_id {value[:20]!r}", "GET", "/v1/facts", params=[("group_id", value)])
        )
    for value in ("", other):
        add(
            Case(
                f"entities group_id {value!r}", "GET", "/v1/entities", params=[("group_id", value)]
            )
        )
    add(
        Case(
            "dlq of the other tenant",
            "GET",
            "/v1/dlq",
            params=[("group_ids", other)],
            expect=frozenset({403}),
        )
    )

    # ------------------------------------------------------------------ paths and methods
    add(Case("unknown route", "GET", "/v1/nothing", expect=frozenset({404})))
    add(Case("wrong method", "DELETE", "/v1/search", expect=frozenset({405})))
    add(Case("PUT episodes", "PUT", "/v1/episodes", json={}, expect=frozenset({405})))
    add(Case("status id NUL", "GET", "/v1/episodes/a%00b/status"))
    add(Case("status id invalid utf-8", "GET", "/v1/episodes/%FF%FE/status"))
    add(Case("status id long", "GET", "/v1/episodes/" + "e" * 600 + "/status"))
    add(Case("status id dots", "GET", "/v1/episodes/..%2F..%2Fetc/status"))
    add(
        Case(
            "status of another tenant",
            "GET",
            "/v1/episodes/e1/status",
            params=[("group_id", other)],
            expect=frozenset({403}),
        )
    )
    _lifecycle(cases, own, other)
    add(Case("trailing slash", "GET", "/v1/facts/", expect=frozenset({404})))
    add(Case("double slash", "GET", "//v1/facts"))
    return cases


def _lifecycle(cases: list[Case], own: str, other: str) -> None:
    """Forget, browse and the change stream (issue 34): cursors not given out, ids and
    subjects that are not text, numbers past any seq, another tenant's group."""
    add = cases.append
    sse = {"accept": "text/event-stream"}
    refused = frozenset({400, 409, 413, 422})  # never a page, a forget or a stream
    theirs = base64.urlsafe_b64encode(jsontext.dumps([other, "2025-01-01T00:00:00Z", "u"]))
    forged_cursors = {
        "garbage": "ep1.!!!!",
        "prefix only": "ep1.",
        "no prefix": "abc",
        "not json": "ep1." + base64.urlsafe_b64encode(b"\x00\xff").decode(),
        "wrong shape": "ep1." + base64.urlsafe_b64encode(b"[1, 2]").decode(),
        "bad time": "ep1." + base64.urlsafe_b64encode(jsontext.dumps([own, "x", "u"])).decode(),
        "huge": "ep1." + "A" * 5000,
        "another group": "ep1." + theirs.decode().rstrip("="),
    }
    # The group's own cursors at times out of range (issue 48: a 500, OverflowError).
    for at in EXTREME_TIMES:
        own_at = base64.urlsafe_b64encode(jsontext.dumps([own, at, "x"])).decode().rstrip("=")
        forged_cursors[f"at {at}"] = "ep1." + own_at
    for name, value in forged_cursors.items():
        add(Case(f"episodes cursor {name}", "GET", "/v1/episodes", params=[("cursor", value)],
                 expect=refused))  # fmt: skip
        if name.startswith("at "):
            forgotten = [("cursor", value), ("status", "forgotten")]
            add(Case(f"tombstones cursor {name}", "GET", "/v1/episodes", params=forgotten,
                     expect=refused))  # fmt: skip
    out_of_range = frozenset({400})
    for at in EXTREME_TIMES:
        for name in ("since", "until"):
            add(Case(f"episodes {name} {at}", "GET", "/v1/episodes", params=[(name, at)],
                     expect=out_of_range))  # fmt: skip
        for name in ("valid_at", "known_at"):
            add(Case(f"facts {name} {at}", "GET", "/v1/facts", params=[(name, at)],
                     expect=out_of_range))  # fmt: skip
            add(Case(f"context {name} {at}", "POST", "/v1/context",
                     json={"query": "acme", name: at}, expect=out_of_range))  # fmt: skip
        dated = {"content": "Dana called", "reference_time": at}
        add(Case(f"episode reference_time {at}", "POST", "/v1/episodes", json=dated,
                 expect=out_of_range))  # fmt: skip
    # Numbers the docs do not write (issue 48: read as 5).
    for text in ("+5", " 5", "5 ", "5_0", "0x5", "٥"):
        add(Case(f"changes after {text!r}", "GET", "/v1/changes", params=[("after", text)],
                 expect=frozenset({422})))  # fmt: skip
        add(Case(f"episodes limit {text!r}", "GET", "/v1/episodes", params=[("limit", text)],
                 expect=frozenset({422})))  # fmt: skip
    add(Case("changes wait_seconds '+1'", "GET", "/v1/changes", params=[("wait_seconds", "+1")],
             expect=frozenset({422})))  # fmt: skip
    add(Case("GET search limit ' 5'", "GET", "/v1/search",
             params=[("query", "acme"), ("limit", " 5")], expect=frozenset({422})))  # fmt: skip
    # Paths that a redirect would answer with a Location built from the Host header.
    for path in ("/v1/episodes/ep-0/", "/v1/episodes/%2e%2e%2f", "/v1/facts/", "/v1/episodes/"):
        for method in ("GET", "DELETE"):
            add(Case(f"{method} {path} (no redirect)", method, path,
                     params=[("group_id", own)], headers={"host": "evil.example"},
                     expect=frozenset({404, 405})))  # fmt: skip
    add(Case("episodes cursor surrogate", "GET", "/v1/episodes?cursor=ep1.%ED%A0%80",
             expect=refused))  # fmt: skip
    for name, params in {
        "status unknown": [("status", "deleted")],
        "limit 0": [("limit", "0")],
        "limit 10**30": [("limit", "1" * 31)],
        "since garbage": [("since", "whenever-ish")],
        "until 101 chars": [("until", "x" * 101)],
        "since NUL": [("since", "2025\x00")],
        "content maybe": [("content", "maybe")],
        "unknown param": [("cursour", "x")],
    }.items():
        add(Case(f"episodes {name}", "GET", "/v1/episodes", params=params))
    for name, path in {
        "id NUL": "/v1/episodes/a%00b",
        "id invalid utf-8": "/v1/episodes/%FF%FE",
        "id encoded surrogate": "/v1/episodes/%ED%A0%80",
        "id long": "/v1/episodes/" + "e" * 600,
        "id padded": "/v1/episodes/%20e1%20",
    }.items():
        add(Case(f"show episode {name}", "GET", path))
        add(Case(f"forget episode {name}", "DELETE", path))
    add(Case("forget episode never added", "DELETE", "/v1/episodes/nope", expect=frozenset({404})))
    add(Case("forget episode dry_run maybe", "DELETE", "/v1/episodes/e1?dry_run=maybe"))
    for name, body in {
        "nothing": {},
        "two targets": {"episode_ids": ["a"], "subject": "x"},
        "group false": {"group": False},
        "purge without group": {"subject": "x", "purge": True},
        "ids not a list": {"episode_ids": "a"},
        "ids of numbers": {"episode_ids": [1, 2]},
        "id NUL": {"episode_ids": ["a\x00b"]},
        "id padded": {"episode_ids": [" a "]},
        "subject control": {"subject": "Dana\x07"},
        "subject empty": {"subject": ""},
        "subject long": {"subject": "s" * 5000},
        "subject number": {"subject": 10**30},
        "subject unknown": {"subject": "Nobody At All"},
        "dry_run text": {"subject": "x", "dry_run": "perhaps"},
        "typo": {"episode_id": ["a"]},
    }.items():
        add(Case(f"forget {name}", "POST", "/v1/forget", json=body, expect=refused))
    many = {"episode_ids": [f"e{n}" for n in range(10_000)]}  # none of them added
    add(Case("forget ids 10k", "POST", "/v1/forget", json=many))
    add(
        Case(
            "forget body surrogate",
            "POST",
            "/v1/forget",
            content=b'{"subject": "\\udc00"}',
            headers=JSON,
        )
    )
    add(
        Case(
            "forget body invalid utf-8",
            "POST",
            "/v1/forget",
            content=b'{"subject": "\xff\xfe"}',
            headers=JSON,
        )
    )
    streams: dict[str, tuple[list[tuple[str, str]], dict[str, Any]]] = {
        "after negative": ([("after", "-1")], {}),
        "after 10**30": ([("after", "1" * 31)], {}),
        "after 2**63": ([("after", str(2**63))], {}),
        "after float": ([("after", "1.5")], {}),
        "after text": ([("after", "latest")], {}),
        "after past the end": ([("after", str(2**62))], {}),
        "wait negative": ([("wait_seconds", "-1")], {}),
        "wait huge": ([("wait_seconds", "1e308")], {}),
        "wait NaN": ([("wait_seconds", "nan")], {}),
        "limit 0": ([("limit", "0")], {}),
        "stream after 10**30": ([("after", "1" * 31)], sse),
        "stream last-event-id text": ([], {**sse, "last-event-id": "abc"}),
        "stream last-event-id huge": ([], {**sse, "last-event-id": "9" * 30}),
        "stream last-event-id negative": ([], {**sse, "last-event-id": "-5"}),
        "stream last-event-id bytes": ([], {**sse, "last-event-id": b"\xff\xfe"}),
        "stream last-event-id plus": ([], {**sse, "last-event-id": "+5"}),
        "stream past the end": ([("after", str(2**62))], sse),
    }
    for name, (params, headers) in streams.items():
        add(
            Case(
                f"changes {name}",
                "GET",
                "/v1/changes",
                params=params,
                headers=headers,
                expect=refused,
            )
        )
    forbidden = frozenset({403})
    theirs_asked: list[tuple[str, str, str, list[tuple[str, str]] | None, Any]] = [
        ("forget episode", "DELETE", "/v1/episodes/e1", [("group_id", other)], None),
        ("forget", "POST", "/v1/forget", None, {"group_id": other, "subject": "Quillmark"}),
        ("forget group", "POST", "/v1/forget", None, {"group_id": other, "group": True}),
        ("episodes", "GET", "/v1/episodes", [("group_id", other)], None),
        ("show episode", "GET", "/v1/episodes/e1", [("group_id", other)], None),
        ("changes", "GET", "/v1/changes", [("group_id", other)], None),
    ]
    for name, method, path, query, body in theirs_asked:
        add(Case(f"{name} of another tenant", method, path, params=query, json=body,
                 expect=forbidden))  # fmt: skip
    add(
        Case(
            "changes stream of another tenant",
            "GET",
            "/v1/changes",
            params=[("group_id", other)],
            headers=sse,
            expect=forbidden,
        )
    )


def iter_names(cases: list[Case]) -> Iterator[str]:
    seen: set[str] = set()
    for case in cases:
        assert case.name not in seen, f"two cases named {case.name!r}"
        seen.add(case.name)
        yield case.name
