"""A deterministic feature-hashing embedder: no model, no network, same vectors everywhere.

Used by unit tests and as a fallback. The text is normalised (Unicode NFKD without accents,
case-folded, punctuation removed), then these features are hashed into ``dim`` signed buckets
with BLAKE2b (stable across processes and machines, unlike Python's ``hash()``):

* each word (common English function words weigh less),
* the first four letters of each word of four letters or more (``corp`` ~ ``corporation``),
* the character trigrams of each word with boundary marks (spelling variants, typos),
* an acronym: the initials of a multi-word text, or a short single word itself
  (``IBM`` ~ ``International Business Machines``).

The vector is L2-normalised. It knows spelling, not meaning: "Bob"/"Robert" or
"printer"/"scanner" are only as close as their letters are.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections import defaultdict
from functools import lru_cache

from tidegraph.embed.base import Embedder, EmbeddingThresholds

# Calibrated on the pairs in benchmarks/embedders.py (`python -m benchmarks.embedders --calibrate`,
# dim=384). Measured cosines:
#   same entity, other spelling: "Acme Corp"/"ACME Corporation" 0.754, "Acme Corp"/"Acme Corp."
#       1.000, "Microsoft Corporation"/"Microsoft" 0.684, "Katherine Lee"/"Kate Lee" 0.615,
#       "New York City"/"NYC" 0.585, "United States of America"/"USA" 0.572, "Dr. Alice
#       Johnson"/"Alice Johnson" 0.571, "IBM"/"International Business Machines" 0.519,
#       "Bob Smith"/"Robert Smith" 0.443, "J. P. Morgan"/"JP Morgan" 0.415
#   related but different: "Acme Corp"/"Acme Labs" 0.427, "Bob Smith"/"Alice Smith" 0.443,
#       "Apple Inc."/"Apple Records" 0.475, "printer"/"scanner" 0.070, "Paris"/"London" 0.000,
#       "2023 annual report"/"2022 annual report" 0.824 (letters cannot tell them apart)
#   unrelated names (45 pairs): max 0.173, mean 0.011
#   facts saying the same thing: 0.426 - 0.881 (7 pairs)
#   different facts, other subjects: max 0.038; same subject, other claim: 0.386 - 0.685
# Spelling cannot separate "Bob"/"Robert" from "Bob"/"Alice", so `entity_same` (0.60) only sits
# above the related pairs (max 0.475), `entity_candidate` (0.30) between the unrelated names
# (max 0.173) and the weakest true pair (0.415), `fact_candidate` (0.35) below the weakest
# reworded fact (0.426) and far above facts on other subjects (0.038).
HASHING_THRESHOLDS = EmbeddingThresholds(
    entity_same=0.60,
    entity_candidate=0.30,
    fact_candidate=0.35,
)

_WORD_WEIGHT = 1.0
_STOP_WORD_WEIGHT = 0.25
_PREFIX_WEIGHT = 0.7
_TRIGRAMS_WEIGHT = 1.2  # total weight of one word's trigrams, shared between them
_ACRONYM_WEIGHT = 2.5  # a single short word, or the initials of three words or more
_SHORT_ACRONYM_WEIGHT = 1.0  # initials of two words: shared by many unrelated names
_PREFIX_LEN = 4
_MAX_NAME_WORDS = 4
_EMPTY_FEATURE = "empty:"

_STOP_WORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was "
    "were will with".split()
)
_JOINERS = re.compile(r"[.'\u2019`]")
_NON_WORD = re.compile(r"[^\w]+|_+")


def normalise(text: str) -> str:
    """Lower-case ASCII-folded words separated by single spaces (``"I.B.M."`` -> ``"ibm"``)."""
    decomposed = unicodedata.normalize("NFKD", text)
    stripped = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    joined = _JOINERS.sub("", stripped.casefold())
    return " ".join(_NON_WORD.sub(" ", joined).split())


def features(text: str) -> dict[str, float]:
    """Weighted features of a text (see the module docstring)."""
    words = normalise(text).split()
    found: defaultdict[str, float] = defaultdict(float)
    for word in words:
        _add_word_features(found, word)
    acronym = _acronym(words)
    if acronym:
        weight = _SHORT_ACRONYM_WEIGHT if len(acronym) == 2 and len(words) > 1 else _ACRONYM_WEIGHT
        found["a:" + acronym] += weight
    if not found:
        found[_EMPTY_FEATURE] = 1.0
    return found


def _add_word_features(found: defaultdict[str, float], word: str) -> None:
    found["w:" + word] += _STOP_WORD_WEIGHT if word in _STOP_WORDS else _WORD_WEIGHT
    if word in _STOP_WORDS:
        return
    if len(word) >= _PREFIX_LEN:
        found["p:" + word[:_PREFIX_LEN]] += _PREFIX_WEIGHT
    padded = f"<{word}>"
    grams = [padded[i : i + 3] for i in range(len(padded) - 2)]
    for gram in grams:
        found["c:" + gram] += _TRIGRAMS_WEIGHT / math.sqrt(len(grams))


def _acronym(words: list[str]) -> str:
    """Initials of a short multi-word name, or a short single word taken as an acronym.

    Only names get one (four words at most): the initials of a sentence mean nothing."""
    if len(words) == 1:
        word = words[0]
        return word if 2 <= len(word) <= 5 and word.isalpha() else ""
    content = [w for w in words if w not in _STOP_WORDS]
    if len(words) <= _MAX_NAME_WORDS and len(content) >= 2:
        return "".join(w[0] for w in content)
    return ""


@lru_cache(maxsize=1 << 16)
def _bucket(feature: str, dim: int) -> tuple[int, float]:
    """The bucket and sign of a feature: the first 8 bytes of its BLAKE2b digest."""
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
    value = int.from_bytes(digest, "big")
    return value % dim, (1.0 if value >> 63 else -1.0)


class HashingEmbedder(Embedder):
    """Feature hashing of words and character n-grams; deterministic and L2-normalised."""

    def __init__(self, dim: int = 384, thresholds: EmbeddingThresholds | None = None) -> None:
        if dim < 8:
            raise ValueError(f"dim must be at least 8, got {dim}")
        self.dim = dim
        self.model_name = f"hashing-{dim}"
        self.thresholds = thresholds or HASHING_THRESHOLDS

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_sync(text) for text in texts]

    def embed_sync(self, text: str) -> list[float]:
        """The vector of one text, without an event loop (it is cheap: no I/O, no model)."""
        sums: dict[int, float] = {}  # only the buckets a feature falls in
        for feature, weight in sorted(features(text).items()):
            index, sign = _bucket(feature, self.dim)
            sums[index] = sums.get(index, 0.0) + sign * weight
        vector = [0.0] * self.dim
        norm = math.sqrt(math.fsum(x * x for x in sums.values()))
        if norm == 0.0:  # every feature cancelled out in its bucket: fall back to the marker
            index, sign = _bucket(_EMPTY_FEATURE, self.dim)
            vector[index] = sign
            return vector
        for index, value in sums.items():
            vector[index] = value / norm
        return vector
