"""Scripting tidegraph's extraction requests on the fake LLM server, one episode at a time.

Extraction asks the LLM about one episode (``ExtractionOutput``) or, for several waiting
episodes of a group, about all of them in one call (``EpisodesExtractionOutput``, docs/streaming.md
"Batch-native stages"). ``on_extraction(server, handler)`` registers ``handler`` (written for
one episode) for both: a joint request is split into one request per episode, shaped as the
one-episode request (reference time, the joint request's context, the episode), and the
answers are put together in the joint answer's shape.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from tests.support.fake_llm import FakeRequest, Handler, ScriptedLLMServer
from tidegraph.processors.prompts import CURRENT_EPISODE, EpisodesExtractionOutput, ExtractionOutput

EXTRACTION = ExtractionOutput.__name__
JOINT_EXTRACTION = EpisodesExtractionOutput.__name__

_HEADING = re.compile(
    "^"
    + re.escape(CURRENT_EPISODE)
    .replace(r"\{index\}", r"(?P<index>\d+)")
    .replace(r"\{source\}", r"(?P<source>[^,]*)")
    .replace(r"\{description\}", r"(?P<description>.*)")
    .replace(r"\{time\}", r"(?P<time>[^;()]*)")
    + "$"
)


def split_joint_extraction(request: FakeRequest) -> list[FakeRequest]:
    """A joint extraction request as the one-episode requests of its episodes, in order."""
    return [
        replace(request, schema_name=EXTRACTION, user=user)
        for user in split_joint_user(request.user)
    ]


def split_joint_user(joint: str) -> list[str]:
    """The user message of a joint extraction request as the user messages of one-episode
    requests (reference time, the joint request's context, the episode), in order."""
    lines = joint.split("\n")
    starts = [i for i, line in enumerate(lines) if _HEADING.match(line)]
    if not starts:
        raise ValueError("not a joint extraction request: no current-episode heading")
    context = lines[: starts[0]]
    parts: list[str] = []
    for n, start in enumerate(starts):
        heading = _HEADING.match(lines[start])
        assert heading is not None
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        parts.append(
            "\n".join(
                [
                    f"Reference time: {heading['time']}",
                    *context,
                    f"Current episode ({heading['source']}, {heading['description']}):",
                    *lines[start + 1 : end],
                ]
            )
        )
    return parts


def joint_answer(handler: Handler) -> Handler:
    """A handler of joint extraction requests from ``handler`` of one-episode requests."""

    def answer(request: FakeRequest) -> dict[str, Any]:
        parts = split_joint_extraction(request)
        return {"episodes": [{"episode": i, **handler(part)} for i, part in enumerate(parts)]}

    return answer


def on_extraction(server: ScriptedLLMServer, handler: Handler) -> None:
    """Answer every extraction request, one-episode or joint, with ``handler`` per episode."""
    server.on(EXTRACTION, handler)
    server.on(JOINT_EXTRACTION, joint_answer(handler))


def episodes_asked(server: ScriptedLLMServer) -> int:
    """How many episode extractions the server answered, one-episode or in joint requests."""
    return sum(
        1 if name == EXTRACTION else len(split_joint_user(request.user))
        for name, request, status in server.requests
        if name in (EXTRACTION, JOINT_EXTRACTION) and status == 200
    )
