"""Fair answers: the fake LLM answers tidegraph and Graphiti from the same ground truth.

Both systems run against one :class:`~tests.support.fake_llm.ScriptedLLMServer` with a
fixed latency per request. ``FairAnswers.install`` registers a handler per JSON-schema name:

* **extraction**, tidegraph ``ExtractionOutput`` (``EpisodesExtractionOutput`` for several
  episodes of a group in one call: answered episode by episode, the same way) and Graphiti
  ``ExtractedEntities`` + ``ExtractedEdges``: the episode is identified by the exact text of
  the prompt's current-episode section (tidegraph: after ``Current episode (...)``; Graphiti: inside
  ``<CURRENT MESSAGE>`` / ``<CURRENT_MESSAGE>``), never by the context episodes, and the
  answer is that message's ground truth: the same entity names in the same order and the same
  facts (subject, relation, object, wording). Dates follow each prompt's contract for the
  same meaning: tidegraph asks for the stated date or null (it then stamps the reference
  time itself), Graphiti asks for the stated date, else the episode's timestamp for an
  ongoing fact (a null would make it spend one more call per fact on ``EdgeTimestamps``).
* **entity resolution**, tidegraph ``EntityResolutionOutput`` and Graphiti
  ``NodeResolutions``: a new entity is the candidate with the same name (case-insensitive),
  else new. Both systems first match exact names themselves; only the rest reaches the LLM.
* **fact resolution**, tidegraph ``FactResolutionOutput`` and Graphiti ``EdgeDuplicate``:
  facts are known by their wording; a candidate with the same subject, relation and object is
  a duplicate, one with the same subject and a one-valued relation (``ONE_VALUED``) but
  another object is contradicted, nothing else is. A tidegraph call judging several messages
  at once compares each new fact with the new facts of the earlier messages too.
* **Graphiti only**: ``SummarizedEntities`` (entity summaries, which tidegraph takes from the
  extraction answer) gets a deterministic summary of at most ``SUMMARY_CHARS`` characters;
  ``EdgeTimestamps`` the fact's stated date, else the reference time.

What each system was told at extraction is tallied (``answered``) so a run can show both got
the same number of entities and facts.
"""

from __future__ import annotations

import ast
import json
import re
import threading
from collections import Counter
from typing import Any

from benchmarks.text_feed import ONE_VALUED, FeedEpisode, FeedIndex, TruthFact
from tests.support.extraction_requests import joint_answer
from tests.support.fake_llm import FakeRequest, ScriptedLLMServer

SUMMARY_CHARS = 400

TIDEGRAPH_STAGES = {
    "ExtractionOutput": "extraction",
    "EpisodesExtractionOutput": "extraction",
    "EntityResolutionOutput": "entity_resolution",
    "FactResolutionOutput": "fact_resolution",
}
GRAPHITI_STAGES = {
    "ExtractedEntities": "extraction",
    "ExtractedEdges": "extraction",
    "NodeResolutions": "entity_resolution",
    "EdgeDuplicate": "fact_resolution",
    "SummarizedEntities": "summaries",
    "EdgeTimestamps": "timestamps",
}
STAGES = {**TIDEGRAPH_STAGES, **GRAPHITI_STAGES}

_INDEXED = re.compile(r"^\[(\d+)\] (.*)$")
_STORED_FACT = re.compile(
    r"^(?P<s>.+?) -(?P<rel>[A-Z0-9_]+)-> (?P<o>.+?): (?P<fact>.*) \([^()]*\)$"
)


def _fold(name: str) -> str:
    return " ".join(name.casefold().split())


def _section(text: str, start: str, end: str) -> str:
    """The text between the first ``start`` and the next ``end``."""
    head = text.index(start) + len(start)
    return text[head : text.index(end, head)].strip()


# ast.literal_eval is not thread-safe in CPython 3.11 ("AST constructor recursion depth
# mismatch" when two handler threads parse at once): one parse at a time.
_AST_LOCK = threading.Lock()


def _python_list(text: str) -> list[dict[str, Any]]:
    """A list Graphiti printed with Python's repr (its EdgeDuplicate prompt does)."""
    with _AST_LOCK:
        return ast.literal_eval(text)


def _iso_z(date_or_time: str) -> str:
    return date_or_time if "T" in date_or_time else f"{date_or_time}T00:00:00Z"


class FairAnswers:
    """The handlers of both systems' structured requests (see the module docstring)."""

    def __init__(self, index: FeedIndex) -> None:
        self.index = index
        self.answered: Counter[str] = Counter()
        self._lock = threading.Lock()

    def install(self, server: ScriptedLLMServer) -> None:
        handlers = {
            "ExtractionOutput": self.tidegraph_extraction,
            "EpisodesExtractionOutput": joint_answer(self.tidegraph_extraction),
            "EntityResolutionOutput": self.tidegraph_entities,
            "FactResolutionOutput": self.tidegraph_facts,
            "ExtractedEntities": self.graphiti_entities,
            "ExtractedEdges": self.graphiti_edges,
            "NodeResolutions": self.graphiti_nodes,
            "EdgeDuplicate": self.graphiti_edge_duplicate,
            "SummarizedEntities": self.graphiti_summaries,
            "EdgeTimestamps": self.graphiti_timestamps,
        }
        for name, handler in handlers.items():
            server.on(name, handler)

    def _tally(self, **counts: int) -> None:
        with self._lock:
            self.answered.update(counts)

    # ---- fact judgement shared by both systems ------------------------------------------
    @staticmethod
    def judge(new: TruthFact, old: tuple[str, str, str]) -> str | None:
        """``duplicate``, ``contradicts`` or None for a new fact against a stored one."""
        mine = (_fold(new.subject), new.relation, _fold(new.object))
        theirs = (_fold(old[0]), old[1], _fold(old[2]))
        if theirs == mine:
            return "duplicate"
        if theirs[:2] == mine[:2] and new.relation in ONE_VALUED:
            return "contradicts"
        return None

    def _key_of(self, fact_text: str) -> tuple[str, str, str] | None:
        truth = self.index.fact(fact_text)
        return truth.key if truth else None

    # ---- tidegraph ---------------------------------------------------------------------------
    def tidegraph_extraction(self, request: FakeRequest) -> dict[str, Any]:
        lines = request.user.split("\n")
        start = next(i for i, line in enumerate(lines) if line.startswith("Current episode ("))
        episode = self.index.episode("\n".join(lines[start + 1 :]))
        truth = episode.truth
        self._tally(tidegraph_entities=len(truth.entities), tidegraph_facts=len(truth.facts))
        return {
            "entities": [
                {"name": e.name, "type": e.type, "summary": _first_summary(e.name, episode)}
                for e in truth.entities
            ],
            "facts": [
                {
                    "subject": f.subject,
                    "relation": f.relation,
                    "object": f.object,
                    "fact": f.fact,
                    "valid_at": f.valid_at,
                    "invalid_at": None,
                }
                for f in truth.facts
            ],
        }

    def tidegraph_entities(self, request: FakeRequest) -> dict[str, Any]:
        head, _, tail = request.user.partition("New entities:")
        candidates: dict[str, int] = {}
        for line in head.split("Existing entities (candidates):", 1)[1].strip().splitlines():
            m = _INDEXED.match(line)
            if m:
                candidates.setdefault(_fold(m[2].split(" (", 1)[0]), int(m[1]))
        matches = []
        for line in tail.strip().splitlines():
            m = _INDEXED.match(line)
            if m:
                name = _fold(m[2].split(": ", 1)[0])
                matches.append({"entity": int(m[1]), "duplicate_of": candidates.get(name)})
        return {"matches": matches}

    def tidegraph_facts(self, request: FakeRequest) -> dict[str, Any]:
        head, _, tail = request.user.partition("New facts:")
        stored: list[tuple[int, tuple[str, str, str]]] = []
        for line in head.split("Existing facts:", 1)[1].strip().splitlines():
            m = _INDEXED.match(line)
            f = _STORED_FACT.match(m[2]) if m else None
            if m and f:
                stored.append((int(m[1]), (f["s"], f["rel"], f["o"])))
        judgements = []
        earlier: list[tuple[int, tuple[str, str, str]]] = []  # earlier messages' new facts
        current: list[tuple[int, tuple[str, str, str]]] = []
        for line in tail.strip().splitlines():
            if line.startswith("(message "):  # a joint call: the next message's facts
                earlier, current = earlier + current, []
                continue
            m = _INDEXED.match(line)
            new = self.index.fact(m[2]) if m else None
            if m is None or new is None:
                continue
            current.append((int(m[1]), new.key))
            verdicts = [(i, self.judge(new, old)) for i, old in [*stored, *earlier]]
            duplicates = [i for i, v in verdicts if v == "duplicate"]
            judgements.append(
                {
                    "new_fact": int(m[1]),
                    "duplicate_of": duplicates[0] if duplicates else None,
                    "contradicts": [i for i, v in verdicts if v == "contradicts"],
                }
            )
        return {"judgements": judgements}

    # ---- Graphiti ------------------------------------------------------------------------
    def graphiti_entities(self, request: FakeRequest) -> dict[str, Any]:
        current = _section(request.user, "<CURRENT MESSAGE>", "</CURRENT MESSAGE>")
        episode = self.index.episode(current)
        entities = episode.truth.entities
        self._tally(graphiti_entities=len(entities))
        return {
            "extracted_entities": [
                {"name": e.name, "entity_type_id": 0, "episode_indices": [0]} for e in entities
            ]
        }

    def graphiti_edges(self, request: FakeRequest) -> dict[str, Any]:
        current = _section(request.user, "<CURRENT_MESSAGE>", "</CURRENT_MESSAGE>")
        episode = self.index.episode(current)
        facts = episode.truth.facts
        self._tally(graphiti_facts=len(facts))
        reference = episode.reference_time.isoformat().replace("+00:00", "Z")
        return {
            "edges": [
                {
                    "source_entity_name": f.subject,
                    "target_entity_name": f.object,
                    "relation_type": f.relation,
                    "fact": f.fact,
                    "valid_at": _iso_z(f.valid_at) if f.valid_at else reference,
                    "invalid_at": None,
                    "episode_indices": [0],
                }
                for f in facts
            ]
        }

    def graphiti_nodes(self, request: FakeRequest) -> dict[str, Any]:
        extracted = json.loads(_section(request.user, "<ENTITIES>", "</ENTITIES>"))
        existing = json.loads(_section(request.user, "<EXISTING ENTITIES>", "</EXISTING ENTITIES>"))
        by_name: dict[str, int] = {}
        for candidate in existing:
            by_name.setdefault(_fold(candidate["name"]), int(candidate["candidate_id"]))
        return {
            "entity_resolutions": [
                {
                    "id": int(e["id"]),
                    "name": e["name"],
                    "duplicate_candidate_id": by_name.get(_fold(e["name"]), -1),
                }
                for e in extracted
            ]
        }

    def graphiti_edge_duplicate(self, request: FakeRequest) -> dict[str, Any]:
        text = request.user
        related = _python_list(_section(text, "<EXISTING FACTS>", "</EXISTING FACTS>"))
        candidates = _python_list(
            _section(text, "<FACT INVALIDATION CANDIDATES>", "</FACT INVALIDATION CANDIDATES>")
        )
        new = self.index.fact(_section(text, "<NEW FACT>", "</NEW FACT>"))
        duplicates: list[int] = []
        contradicted: list[int] = []
        if new is not None:
            for item, is_related in [(r, True) for r in related] + [(c, False) for c in candidates]:
                old = self._key_of(item["fact"])
                verdict = self.judge(new, old) if old else None
                if verdict == "duplicate" and is_related:
                    duplicates.append(int(item["idx"]))
                elif verdict == "contradicts":
                    contradicted.append(int(item["idx"]))
        return {"duplicate_facts": duplicates, "contradicted_facts": contradicted}

    def graphiti_summaries(self, request: FakeRequest) -> dict[str, Any]:
        entities = json.loads(_section(request.user, "<ENTITIES>", "</ENTITIES>"))
        return {
            "summaries": [
                {"name": e["name"], "summary": _condensed(e["name"], e.get("summary") or "")}
                for e in entities
            ]
        }

    def graphiti_timestamps(self, request: FakeRequest) -> dict[str, Any]:
        fact = self.index.fact(_section(request.user, "<FACT>", "</FACT>"))
        reference = _section(request.user, "<REFERENCE TIME>", "</REFERENCE TIME>")
        stated = fact.valid_at if fact else None
        return {"valid_at": _iso_z(stated) if stated else reference, "invalid_at": None}


def _first_summary(name: str, episode: FeedEpisode) -> str:
    return f"{name} is mentioned in the support chat of {episode.reference_time.date()}."


def _condensed(name: str, summary: str) -> str:
    """A deterministic summary: the latest lines of the old one that fit ``SUMMARY_CHARS``."""
    if not summary.strip():
        return f"{name} is mentioned in the support chat."
    kept: list[str] = []
    size = 0
    for line in reversed([s.strip() for s in summary.splitlines() if s.strip()]):
        if size + len(line) + 1 > SUMMARY_CHARS:
            break
        kept.insert(0, line)
        size += len(line) + 1
    return "\n".join(kept) or summary[:SUMMARY_CHARS]


def llm_usage(server: ScriptedLLMServer, episodes: int) -> dict[str, Any]:
    """Calls and prompt characters by schema name and by stage, totals and per episode."""
    calls: Counter[str] = Counter()
    chars: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for name, request, status in server.requests:
        if status != 200:
            failed[name] += 1
            continue
        calls[name] += 1
        chars[name] += len(request.system) + len(request.user)
    stages: Counter[str] = Counter()
    stage_chars: Counter[str] = Counter()
    for name, n in calls.items():
        stages[STAGES.get(name, name)] += n
        stage_chars[STAGES.get(name, name)] += chars[name]
    per = max(episodes, 1)
    total_calls, total_chars = sum(calls.values()), sum(chars.values())
    return {
        "calls": total_calls,
        "calls_per_episode": round(total_calls / per, 3),
        "prompt_chars": total_chars,
        "prompt_chars_per_episode": round(total_chars / per, 1),
        "calls_by_schema": dict(sorted(calls.items())),
        "calls_per_episode_by_schema": {k: round(v / per, 3) for k, v in sorted(calls.items())},
        "calls_per_episode_by_stage": {k: round(v / per, 3) for k, v in sorted(stages.items())},
        "prompt_chars_per_episode_by_stage": {
            k: round(v / per, 1) for k, v in sorted(stage_chars.items())
        },
        "failed_requests": dict(sorted(failed.items())),
    }
