"""REALTALK (Lee et al. 2025, "REALTALK: A 21-Day Real-World Dataset for Long-Term
Conversation", arXiv 2502.13270; github.com/danny911kr/REALTALK, ``data/Chat_*.json``) as
tidegraph episodes and evidence-annotated questions: the held-out conversational set of
docs/retrieval.md "Retrieval figures" (measured, never tuned on).

Ten real messaging-app conversations between two people over 21 days (~8,900 messages, 728
questions). The repository ships no licence file; the files are not part of the project:
put them in a folder of your own and pass its path. Each file (``Chat_N_A_B.json``) becomes
one group; each message one ``message`` episode, its id the message's ``dia_id`` and its
reference time the message's own timestamp. A question's evidence is its list of dia_ids;
categories: 1 multi-hop, 2 temporal, 3 commonsense (the dataset's README).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import orjson

from benchmarks.locomo import Question, dia_ids

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "commonsense"}

_SESSION = re.compile(r"^session_(\d+)$")


def message_time(text: str) -> datetime:
    """'29.12.2023, 22:42:04' -> 2023-12-29T22:42:04Z."""
    return datetime.strptime(text.strip(), "%d.%m.%Y, %H:%M:%S").replace(tzinfo=UTC)


def load(folder: Path, conversations: int | None = None) -> tuple[list[dict], list[Question]]:
    """Episode envelopes (in conversation order) and the questions with evidence."""
    files = sorted(Path(folder).glob("Chat_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    if conversations is not None:
        files = files[:conversations]
    episodes: list[dict] = []
    questions: list[Question] = []
    for path in files:
        chat = orjson.loads(path.read_bytes())
        group = f"realtalk-{path.stem.split('_')[1]}"
        sessions = sorted(int(m.group(1)) for key in chat if (m := _SESSION.match(key)))
        for number in sessions:
            for i, message in enumerate(chat[f"session_{number}"]):
                text = (message.get("clean_text") or "").strip()
                if not text:
                    continue
                episodes.append(
                    {
                        "id": message["dia_id"],
                        "group_id": group,
                        "source": "message",
                        "name": f"session {number} message {i + 1}",
                        "source_description": "REALTALK chat",
                        "content": f"{message['speaker']}: {text}",
                        "reference_time": message_time(message["date_time"]).isoformat(),
                    }
                )
        turns = {e["id"] for e in episodes if e["group_id"] == group}
        for n, qa in enumerate(chat.get("qa", [])):
            evidence = tuple(i for i in dia_ids(qa.get("evidence", [])) if i in turns)
            if evidence:
                questions.append(
                    Question(f"{group}-q{n}", group, qa["question"], evidence, qa["category"])
                )
    return episodes, questions
