"""An LLM-free feed of restatements (docs/retrieval.md "Now and as of"): for many subjects, one
attribute (plan, owner, address, status) stated again and again as it changes over a year, in varied
words, between other chat; and the questions "now" and "as of" each change, each with the
statement that answers it (the latest said by then).

The feed is deterministic (a seed); the test (tests/integration/test_recency.py) ingests it
into each store with no LLM and reads the first episode about the subject in the default
context."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

SUBJECTS = [
    "Acme Corp", "Bluebird Bakery", "Cobalt Labs", "Driftwood Hotels", "Ember Studios",
    "Fjord Shipping", "Granite Bank", "Harbor Clinics", "Ivory Textiles", "Juniper Farms",
    "Kestrel Air", "Lumen Optics", "Maple Schools", "Nimbus Cloudworks", "Orchid Florists",
    "Pioneer Freight", "Quartz Jewellers", "Redwood Builders", "Saffron Kitchens",
    "Tundra Outfitters",
]  # fmt: skip
PEOPLE = ["Dana Reyes", "Omar Haddad", "Lena Fischer", "Priya Nair", "Tom Becker", "Yuki Sato"]
VALUES = {
    "plan": ["Free", "Basic", "Pro", "Business", "Enterprise"],
    "owner": PEOPLE,
    "address": [
        "12 Harbour Road, Leith", "88 Mill Lane, Bristol", "5 Canal Street, Ghent",
        "301 King Street, Toronto", "9 Rue Nationale, Lille", "44 Elm Avenue, Austin",
    ],
    "status": ["trial", "active", "suspended", "churned", "onboarding"],
}  # fmt: skip
# How each attribute is stated ({s} the subject, {v} the value): varied words, each naming
# what changed.
STATEMENTS = {
    "plan": [
        "{s} moved to the {v} plan today",
        "we switched {s} over to the {v} plan",
        "heads up, {s} is on the {v} plan from now on",
        "{s} changed plan again, they picked {v}",
    ],
    "owner": [
        "{v} is the new account owner for {s}",
        "account owner change: {s} now belongs to {v}",
        "from this week {v} takes over as owner of the {s} account",
        "{s} got a new owner on our side, {v}",
    ],
    "address": [
        "{s} moved offices, the new address is {v}",
        "please update the address for {s} to {v}",
        "{s} relocated, send their mail to the address {v}",
        "new billing address for {s}: {v}",
    ],
    "status": [
        "{s} status is now {v}",
        "account status update for {s}: {v}",
        "we set the status of {s} to {v}",
        "{s} went to {v} status this morning",
    ],
}
QUESTIONS = {
    "plan": ["Which plan is {s} on?", "What plan does {s} have now?"],
    "owner": ["Who is the account owner for {s}?", "Who is the owner of the {s} account now?"],
    "address": ["What is the address of {s}?", "Where is {s} located, which address?"],
    "status": ["What is the status of {s}?", "What status is {s} in currently?"],
}
CHATTER = [
    "{s} asked for a copy of last month's invoice",
    "lunch with the {s} team went well",
    "did anyone reply to {s} about the outage?",
    "{s} sent a thank-you note to support",
]
SPEAKERS = ["Dana", "Omar", "Lena", "Priya"]
START = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Said:
    id: str
    speaker: str
    text: str
    at: datetime

    @property
    def content(self) -> str:
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True)
class Question:
    subject: str
    attribute: str
    query: str
    valid_at: datetime | None  # None: now
    answer: Said  # the statement valid then (the latest said by then)


def restatement_feed(
    subjects: int = 12, changes: int = 3, seed: int = 7
) -> tuple[list[Said], list[Question]]:
    """Messages in time order, and the questions (now, and as of each change but the last)."""
    rng = random.Random(seed)
    said: list[Said] = []
    history: dict[tuple[str, str], list[Said]] = {}
    for subject in SUBJECTS[:subjects]:
        for attribute, values in VALUES.items():
            chosen = rng.sample(values, changes)
            # Changes spread over the year, a few weeks apart, at varied times of day.
            days = sorted(rng.sample(range(0, 360, 7), changes))
            for n, (day, value) in enumerate(zip(days, chosen, strict=True)):
                at = START + timedelta(days=day, minutes=rng.randrange(600))
                template = rng.choice(STATEMENTS[attribute])
                text = template.format(s=subject, v=value)
                item = Said(f"{subject}:{attribute}:{n}", rng.choice(SPEAKERS), text, at)
                said.append(item)
                history.setdefault((subject, attribute), []).append(item)
        for n in range(4):
            at = START + timedelta(days=rng.randrange(360), minutes=rng.randrange(600))
            text = rng.choice(CHATTER).format(s=subject)
            said.append(Said(f"{subject}:chatter:{n}", rng.choice(SPEAKERS), text, at))
    said.sort(key=lambda s: (s.at, s.id))
    questions: list[Question] = []
    for (subject, attribute), statements in history.items():
        asks = QUESTIONS[attribute]
        latest = statements[-1]
        questions += [Question(subject, attribute, q.format(s=subject), None, latest) for q in asks]
        for earlier, later in zip(statements, statements[1:], strict=False):
            when = earlier.at + (later.at - earlier.at) / 2
            query = asks[0].format(s=subject)
            questions.append(Question(subject, attribute, query, when, earlier))
    return said, questions


def first_episode_about(context: str, subject: str) -> str | None:
    """The first line of the context's EPISODES section that names ``subject``."""
    lines = context.splitlines()
    if "EPISODES:" not in lines:
        return None
    for line in lines[lines.index("EPISODES:") + 1 :]:
        if not line.startswith("- "):
            break
        if subject in line:
            return line
    return None
