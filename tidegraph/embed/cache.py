"""A bounded cache in front of an embedder: the same text is embedded once.

A feed states the same fact texts and names again and again (a ticket's status toggling, a
record restating an account's plan); every embedder here is deterministic, so a text's vector
can be reused. Vectors are kept as ``array('d')`` (8 bytes a number instead of a Python float
object each) and handed out as fresh lists.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict

from tidegraph.embed.base import Embedder

DEFAULT_MAX_TEXTS = 4096


class CachingEmbedder(Embedder):
    """Wraps ``inner``; at most ``max_texts`` vectors are kept (least recently used go)."""

    def __init__(self, inner: Embedder, max_texts: int = DEFAULT_MAX_TEXTS) -> None:
        if max_texts < 1:
            raise ValueError("max_texts must be at least 1")
        self.inner = inner
        self.model_name = inner.model_name
        self.dim = inner.dim
        self.thresholds = inner.thresholds
        self.max_texts = max_texts
        self._vectors: OrderedDict[str, array] = OrderedDict()
        # Questions' vectors apart: a model may embed a question unlike the same stored text
        # (e5's prefixes). An agent asks the same thing again and again (a search per turn).
        self._questions: OrderedDict[str, array] = OrderedDict()

    async def embed(self, texts: list[str]) -> list[list[float]]:
        # Taken before awaiting: another caller may evict them meanwhile.
        cached = {t: self._vectors[t] for t in texts if t in self._vectors}
        for text in cached:
            self._vectors.move_to_end(text)
        missing = list(dict.fromkeys(t for t in texts if t not in cached))
        fresh = dict(zip(missing, await self.inner.embed(missing), strict=True)) if missing else {}
        for text, vector in fresh.items():
            self._remember(text, vector)
        return [list(fresh[t]) if t in fresh else cached[t].tolist() for t in texts]

    async def warm(self, texts: list[str]) -> None:
        """Embed, in one call, those of ``texts`` not cached yet (a unit's texts before its
        in-memory work: ``tidegraph.pipelines.units``)."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if missing:
            for text, vector in zip(missing, await self.inner.embed(missing), strict=True):
                self._remember(text, vector)

    def prime(self, vectors: dict[str, list[float]]) -> None:
        """Remember embeddings made before (a forget's replay primes the group's stored
        ones: the same text, the same model, the same vector)."""
        for text, vector in vectors.items():
            self._remember(text, vector)

    def _remember(
        self, text: str, vector: list[float], kept: OrderedDict[str, array] | None = None
    ) -> None:
        kept = self._vectors if kept is None else kept
        kept[text] = array("d", vector)
        while len(kept) > self.max_texts:
            kept.popitem(last=False)

    async def embed_query(self, text: str) -> list[float]:
        """The inner embedder's vector of a search's text, kept apart from the stored texts'
        (it may differ from the same text's: e5's prefixes)."""
        if (vector := self._questions.get(text)) is not None:
            self._questions.move_to_end(text)
            return vector.tolist()
        fresh = await self.inner.embed_query(text)
        self._remember(text, fresh, self._questions)
        return list(fresh)

    async def close(self) -> None:
        await self.inner.close()
