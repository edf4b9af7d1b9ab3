"""LoCoMo (Maharana et al., ACL 2024; github.com/snap-research/locomo, CC BY-NC 4.0) as
tidegraph episodes and evidence-annotated questions.

The file (``locomo10.json``: 10 long conversations, ~5,900 turns, 1,986 questions) is not
part of the project: download it yourself and pass its path. Each conversation becomes one
group; each turn one ``message`` episode, its id the turn's ``dia_id`` ("D3:12": session 3,
turn 12) and its reference time the session's date plus one minute per turn. A question's
evidence is the list of dia_ids that answer it; its category is the dataset's (1 multi-hop,
2 temporal, 3 open-domain, 4 single-hop, 5 adversarial: the reading of the dataset's
evaluation code, task_eval/evaluation.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}

_SESSION = re.compile(r"^session_(\d+)$")
_DIA_ID = re.compile(r"D:?(\d+):(\d+)")
_WHEN = re.compile(r"^(\d{1,2}):(\d{2})\s*([ap]m) on (\d{1,2}) (\w+),? (\d{4})$", re.I)


@dataclass(frozen=True)
class Question:
    id: str
    group_id: str
    question: str
    evidence: tuple[str, ...]  # dia_ids (the episode ids) that answer it
    category: int


def session_time(text: str) -> datetime:
    """'1:56 pm on 8 May, 2023' -> 2023-05-08T13:56Z."""
    match = _WHEN.match(text.strip())
    if match is None:
        raise ValueError(f"unexpected LoCoMo session time {text!r}")
    hour, minute, half, day, month, year = match.groups()
    parsed = datetime.strptime(f"{day} {month} {year}", "%d %B %Y")
    hour_24 = int(hour) % 12 + (12 if half.lower() == "pm" else 0)
    return parsed.replace(hour=hour_24, minute=int(minute), tzinfo=UTC)


def turn_text(turn: dict[str, Any]) -> str:
    """'Speaker: text', with the shared image's caption when the turn has one."""
    text = f"{turn['speaker']}: {turn.get('text', '')}".strip()
    if turn.get("blip_caption"):
        text += f" [shares a photo: {turn['blip_caption']}]"
    return text


def dia_ids(evidence: list[str]) -> list[str]:
    """The dia_ids of an evidence list, as written in the file ("D8:6; D9:17", "D:11:26"
    occur); anything else is dropped."""
    return [f"D{s}:{t}" for item in evidence for s, t in _DIA_ID.findall(item)]


def load(path: Path, conversations: int | None = None) -> tuple[list[dict], list[Question]]:
    """Episode envelopes (in conversation order) and the questions with evidence."""
    samples = orjson.loads(path.read_bytes())
    if conversations is not None:
        samples = samples[:conversations]
    episodes: list[dict] = []
    questions: list[Question] = []
    for sample in samples:
        group = f"locomo-{sample['sample_id']}"
        conv = sample["conversation"]
        sessions = sorted(
            (int(m.group(1)), key) for key in conv if (m := _SESSION.match(key)) is not None
        )
        for number, key in sessions:
            start = session_time(conv[f"session_{number}_date_time"])
            for i, turn in enumerate(conv[key]):
                episodes.append(
                    {
                        "id": turn["dia_id"],
                        "group_id": group,
                        "source": "message",
                        "name": f"session {number} turn {i + 1}",
                        "source_description": "LoCoMo conversation",
                        "content": turn_text(turn),
                        "reference_time": (start + timedelta(minutes=i)).isoformat(),
                    }
                )
        turns = {e["id"] for e in episodes if e["group_id"] == group}
        for n, qa in enumerate(sample["qa"]):
            evidence = tuple(i for i in dia_ids(qa.get("evidence", [])) if i in turns)
            if evidence:
                questions.append(
                    Question(f"{group}-q{n}", group, qa["question"], evidence, qa["category"])
                )
    return episodes, questions
