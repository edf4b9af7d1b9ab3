"""The embedder interface shared by every embedding backend.

An embedder turns texts into L2-normalised vectors, so the dot product of two vectors is their
cosine. Cosine scales differ a lot between models (an unrelated pair can score 0.1 with one model
and 0.8 with another), so every embedder carries its own :class:`EmbeddingThresholds`.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class EmbeddingThresholds:
    """Cosine cut-offs, calibrated per model (see each embedder's module for the numbers)."""

    entity_same: float
    """Cosine at/above which two entity NAMES are confidently the same.

    Auto-merge is NOT done on this alone: it marks a strong candidate."""

    entity_candidate: float
    """Cosine at/above which an existing entity is worth showing to the LLM as a candidate."""

    fact_candidate: float
    """Cosine at/above which two fact texts are worth comparing for duplication."""

    def __post_init__(self) -> None:
        for name in ("entity_same", "entity_candidate", "fact_candidate"):
            value = getattr(self, name)
            if not -1.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a cosine in [-1, 1], got {value}")
        if self.entity_candidate > self.entity_same:
            raise ValueError("entity_candidate must not be above entity_same")


class Embedder(abc.ABC):
    """Embeds texts into L2-normalised vectors of ``dim`` floats."""

    model_name: str
    dim: int
    thresholds: EmbeddingThresholds

    @abc.abstractmethod
    async def embed(self, texts: list[str]) -> list[list[float]]:
        """One L2-normalised vector per text, in the order given; ``[]`` gives ``[]``."""

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release clients or sessions held by the embedder."""

    async def embed_one(self, text: str) -> list[float]:
        """Convenience: the vector of a single text."""
        return (await self.embed([text]))[0]

    async def embed_query(self, text: str) -> list[float]:
        """The vector of a search's text, compared with the vectors of :meth:`embed`. The same
        as :meth:`embed_one` unless the model embeds questions and stored texts apart (e5's
        ``query: `` and ``passage: ``)."""
        return await self.embed_one(text)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_name={self.model_name!r}, dim={self.dim})"


def l2_normalise(vector: Sequence[float]) -> list[float]:
    """The vector scaled to unit length (a zero vector is returned unchanged)."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if norm == 0.0:
        return [float(x) for x in vector]
    return [float(x) / norm for x in vector]
