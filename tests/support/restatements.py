"""LLM-free feeds of restatements (docs/retrieval.md "Now and as of"): for many subjects, four
attributes (plan, owner, address, status) stated again and again as they change over a year,
between other chat; the questions ask "now" and "as of" each change, each with the statement
that answers it (the latest said by then). Two feeds:

- the named feed (``wide=False``): every statement names its attribute as the questions do
  ("moved to the X plan", "the new account owner"), each attribute changing on its own days;
- the wide feed (``wide=True``): a subject's four attributes change around the same days, in
  widely varied words: most statements never name the attribute ("Acme Corp upgraded to
  Pro", "Tom Becker will look after Acme Corp from here on"), others use another word for it
  ("tier", "rep", "office") or another word order, values written in lower case if asked
  (``lower_case``: "upgraded to pro"); between them, chat about the subject
  that names no value, and noise that names the same values without the subject ("the Pro
  plan gets a price rise").

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
# The named feed: how each attribute is stated ({s} the subject, {v} the value), each naming
# what changed.
NAMED_STATEMENTS = {
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
NAMED_CHATTER = [
    "{s} asked for a copy of last month's invoice",
    "lunch with the {s} team went well",
    "did anyone reply to {s} about the outage?",
    "{s} sent a thank-you note to support",
]
# The wide feed: how each attribute is stated ({s} the subject, {v} the value). The first
# ones name the attribute as the questions do; the others (more than half) do not: another
# word for it, or none, in other word orders.
STATEMENTS = {
    "plan": [
        "{s} moved to the {v} plan today",
        "heads up, {s} is on the {v} plan from now on",
        "the plan for {s} is {v} as of this week",
        "{s} upgraded to {v}",
        "{v} is what {s} picked in the end",
        "{s} signed up for the {v} tier",
        "{s} went with {v} after the call",
        "subscription change, {s} is on {v}",
    ],
    "owner": [
        "{v} is the new account owner for {s}",
        "account owner change: {s} now belongs to {v}",
        "{v} takes over {s} starting Monday",
        "{v} will look after {s} from here on",
        "{s} is handled by {v} now",
        "the rep for {s} is {v} going forward",
        "hand-off done, {v} has {s}",
    ],
    "address": [
        "please update the address for {s} to {v}",
        "new billing address for {s}: {v}",
        "{s} relocated to {v}",
        "{s} can be found at {v} now",
        "mail for {s} goes to {v} from today",
        "the new office of {s} is at {v}",
        "{s} settled into {v} last week",
    ],
    "status": [
        "{s} status is now {v}",
        "we set the status of {s} to {v}",
        "{s} is {v} as of today",
        "{s} flipped to {v}",
        "marking {s} as {v}",
        "state of the {s} account: {v}",
        "{s} became {v} this morning",
    ],
}
QUESTIONS = {
    "plan": ["Which plan is {s} on?", "What plan does {s} have now?"],
    "owner": ["Who is the account owner for {s}?", "Who is the owner of the {s} account now?"],
    "address": ["What is the address of {s}?", "Where is {s} located, which address?"],
    "status": ["What is the status of {s}?", "What status is {s} in currently?"],
}
# Chat about a subject that names none of its values.
CHATTER = [
    "{s} asked for a copy of last month's invoice",
    "lunch with the {s} people went well",
    "did anyone reply to {s} about the outage?",
    "{s} sent a thank-you note to support",
    "{s} wants a call about the renewal",
    "{s} reported a bug in the export",
]
# Noise that names an attribute's values, and often the attribute, without a subject.
NOISE = {
    "plan": ["the {v} plan gets a price rise next month", "is the {v} tier worth it for us?"],
    "owner": ["{v} is out of the office on Friday", "{v} is presenting at the all-hands"],
    "address": ["roadworks outside {v} this week", "the courier could not find {v}"],
    "status": ["how many accounts are {v} right now?", "report of the {v} accounts is ready"],
}
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
    subjects: int = 12,
    changes: int = 3,
    seed: int = 7,
    *,
    wide: bool = False,
    lower_case: float = 0.0,
) -> tuple[list[Said], list[Question]]:
    """Messages in time order, and the questions (now, and as of each change but the last).
    In the wide feed a subject's attributes change around the same days (within three days
    of each other), so its other attributes' statements are as recent as the answer; the
    share ``lower_case`` of its statements write their value in lower case ("upgraded to
    pro", "tom becker will look after ...")."""
    rng = random.Random(seed)
    said: list[Said] = []
    history: dict[tuple[str, str], list[Said]] = {}

    def at_day(day: int) -> datetime:
        return START + timedelta(days=day, minutes=rng.randrange(600))

    if not wide:
        _named_feed(rng, subjects, changes, said, history)
        return said, _questions(history, said)
    for subject in SUBJECTS[:subjects]:
        periods = sorted(rng.sample(range(0, 360, 14), changes))
        for attribute, values in VALUES.items():
            chosen = rng.sample(values, changes)
            for n, (period, value) in enumerate(zip(periods, chosen, strict=True)):
                template = rng.choice(STATEMENTS[attribute])
                # People type a value as they please.
                written = value.lower() if lower_case and rng.random() < lower_case else value
                text = template.format(s=subject, v=written)
                at = at_day(period + rng.randrange(4))
                item = Said(f"{subject}:{attribute}:{n}", rng.choice(SPEAKERS), text, at)
                said.append(item)
                history.setdefault((subject, attribute), []).append(item)
        for n in range(4):
            text = rng.choice(CHATTER).format(s=subject)
            at = at_day(rng.randrange(360))
            said.append(Said(f"{subject}:chatter:{n}", rng.choice(SPEAKERS), text, at))
    for n in range(4 * subjects):
        attribute = rng.choice(sorted(NOISE))
        text = rng.choice(NOISE[attribute]).format(v=rng.choice(VALUES[attribute]))
        said.append(Said(f"noise:{n}", rng.choice(SPEAKERS), text, at_day(rng.randrange(360))))
    return said, _questions(history, said)


def _named_feed(
    rng: random.Random,
    subjects: int,
    changes: int,
    said: list[Said],
    history: dict[tuple[str, str], list[Said]],
) -> None:
    """The named feed's messages (the module docstring), into ``said`` and ``history``."""
    for subject in SUBJECTS[:subjects]:
        for attribute, values in VALUES.items():
            chosen = rng.sample(values, changes)
            # Changes spread over the year, a few weeks apart, at varied times of day.
            days = sorted(rng.sample(range(0, 360, 7), changes))
            for n, (day, value) in enumerate(zip(days, chosen, strict=True)):
                at = START + timedelta(days=day, minutes=rng.randrange(600))
                template = rng.choice(NAMED_STATEMENTS[attribute])
                text = template.format(s=subject, v=value)
                item = Said(f"{subject}:{attribute}:{n}", rng.choice(SPEAKERS), text, at)
                said.append(item)
                history.setdefault((subject, attribute), []).append(item)
        for n in range(4):
            at = START + timedelta(days=rng.randrange(360), minutes=rng.randrange(600))
            text = rng.choice(NAMED_CHATTER).format(s=subject)
            said.append(Said(f"{subject}:chatter:{n}", rng.choice(SPEAKERS), text, at))


def _questions(history: dict[tuple[str, str], list[Said]], said: list[Said]) -> list[Question]:
    """``said`` sorted in time; the questions of ``history``: now (each phrasing) and as of
    the middle of each two changes."""
    said.sort(key=lambda s: (s.at, s.id))
    questions: list[Question] = []
    for (subject, attribute), statements in history.items():
        statements.sort(key=lambda s: s.at)
        asks = QUESTIONS[attribute]
        latest = statements[-1]
        questions += [Question(subject, attribute, q.format(s=subject), None, latest) for q in asks]
        for earlier, later in zip(statements, statements[1:], strict=False):
            when = earlier.at + (later.at - earlier.at) / 2
            query = asks[0].format(s=subject)
            questions.append(Question(subject, attribute, query, when, earlier))
    return questions


def names_the_attribute(statement: Said, attribute: str) -> bool:
    """Whether a statement says the attribute's word as the questions do (the feed's
    measure of its paraphrase)."""
    return attribute in statement.text.lower()


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
