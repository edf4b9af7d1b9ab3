"""Text embedders: offline MiniLM (default), an OpenAI-compatible endpoint, or feature hashing.

``make_embedder(settings)`` builds the one chosen by ``TIDEGRAPH_EMBEDDER``. Every embedder
returns L2-normalised vectors and carries cosine thresholds calibrated for its own model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tidegraph.embed.base import Embedder, EmbeddingThresholds
from tidegraph.embed.hashing import HASHING_THRESHOLDS, HashingEmbedder
from tidegraph.embed.minilm import MINILM_THRESHOLDS, MiniLMEmbedder
from tidegraph.records.vectors import cosine

if TYPE_CHECKING:
    from tidegraph.embed.openai_embedder import OPENAI_THRESHOLDS, OpenAIEmbedder
    from tidegraph.settings import Settings

__all__ = [
    "HASHING_THRESHOLDS",
    "MINILM_THRESHOLDS",
    "OPENAI_THRESHOLDS",
    "Embedder",
    "EmbedderConfigError",
    "EmbeddingThresholds",
    "HashingEmbedder",
    "MiniLMEmbedder",
    "OpenAIEmbedder",
    "cosine",
    "make_embedder",
]

#: Models known to accept the ``dimensions`` parameter (shortened vectors).
_DIMENSIONS_MODEL_PREFIXES = ("text-embedding-3-",)


def __getattr__(name: str) -> Any:
    # The openai package takes ~0.5 s to import: only pay for it when it is used.
    if name in ("OpenAIEmbedder", "OPENAI_THRESHOLDS"):
        from tidegraph.embed import openai_embedder

        return getattr(openai_embedder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class EmbedderConfigError(ValueError):
    """The settings do not describe a usable embedder."""


def make_embedder(settings: Settings) -> Embedder:
    """The embedder chosen by ``settings.embedder`` (minilm | e5 | openai | hashing).

    * ``minilm``: always 384-dim; ``embedding_dim`` does not apply.
    * ``e5``: e5-small-v2, 384-dim, fetched by the install step (``tidegraph.embed.e5``).
    * ``hashing``: ``embedding_dim`` buckets.
    * ``openai``: needs ``llm_base_url``; uses ``embedding_model``, ``embedding_dim``,
      ``llm_api_key``, ``llm_timeout_seconds`` and ``llm_max_attempts``. ``dimensions`` is sent
      only to models known to accept it (text-embedding-3-*).
    """
    kind = settings.embedder
    if kind == "minilm":
        return MiniLMEmbedder()
    if kind == "e5":
        from tidegraph.embed.e5 import E5Embedder

        return E5Embedder()
    if kind == "hashing":
        return HashingEmbedder(dim=settings.embedding_dim)
    if kind == "openai":
        if not settings.llm_base_url:
            raise EmbedderConfigError(
                "TIDEGRAPH_EMBEDDER=openai needs an OpenAI-compatible endpoint: set "
                "TIDEGRAPH_LLM_BASE_URL (e.g. https://api.openai.com/v1), or use "
                "TIDEGRAPH_EMBEDDER=minilm for the offline model"
            )
        from tidegraph.embed.openai_embedder import OpenAIEmbedder

        model = settings.embedding_model
        return OpenAIEmbedder(
            base_url=settings.llm_base_url,
            api_key=settings.llm_api_key.get_secret_value(),
            model=model,
            dim=settings.embedding_dim,
            send_dimensions=model.startswith(_DIMENSIONS_MODEL_PREFIXES),
            timeout=settings.llm_timeout_seconds,
            max_attempts=settings.llm_max_attempts,
        )
    raise EmbedderConfigError(f"unknown embedder {kind!r}: use minilm, e5, openai or hashing")
