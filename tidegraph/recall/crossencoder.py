"""A cross-encoder behind an HTTP ``/rerank`` endpoint (Cohere, Jina, vLLM, Text Embeddings
Inference and most OpenAI-compatible servers that serve a reranker model).

Request: ``POST {base_url}/rerank`` with ``{"model", "query", "documents", "top_n"}`` (and
``Authorization: Bearer <key>`` when a key is set). Answer: ``{"results": [{"index",
"relevance_score"}, ...]}`` in any order (TEI's bare list of ``{"index", "score"}`` is read
too). A document the answer leaves out scores below every scored one.

Configured by ``TIDEGRAPH_RERANK_BASE_URL`` (e.g. ``https://api.jina.ai/v1``,
``http://localhost:8000/v1`` for vLLM), ``TIDEGRAPH_RERANK_MODEL`` and
``TIDEGRAPH_RERANK_API_KEY``; unset base URL = no cross-encoder.
"""

from __future__ import annotations

from typing import Any

import httpx

from tidegraph.recall.rerank import CrossEncoder
from tidegraph.settings import Settings

DEFAULT_TIMEOUT_SECONDS = 30.0


class RerankError(RuntimeError):
    """The ``/rerank`` endpoint failed or answered something that is not a ranking."""


class HttpCrossEncoder(CrossEncoder):
    """``scores(query, texts)`` from one ``/rerank`` request (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"the rerank base URL must start with http:// or https://, got {base_url!r} "
                "(TIDEGRAPH_RERANK_BASE_URL)"
            )
        if not model:
            raise ValueError("a rerank endpoint needs a model name (TIDEGRAPH_RERANK_MODEL)")
        self.url = base_url.rstrip("/") + "/rerank"
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout)
        self._headers = headers

    async def scores(self, query: str, texts: list[str]) -> list[float]:
        if not texts:
            return []
        body = {"model": self.model, "query": query, "documents": texts, "top_n": len(texts)}
        try:
            response = await self._client.post(self.url, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise RerankError(
                f"the rerank endpoint {self.url} could not be reached ({type(exc).__name__}: "
                f"{exc}); check TIDEGRAPH_RERANK_BASE_URL or unset it to rank without it"
            ) from exc
        if response.status_code != 200:
            hint = " (check TIDEGRAPH_RERANK_API_KEY)" if response.status_code in (401, 403) else ""
            raise RerankError(
                f"the rerank endpoint {self.url} answered HTTP {response.status_code}: "
                f"{response.text[:300]!r}{hint}"
            )
        try:
            payload = response.json()
        except ValueError as exc:
            raise RerankError(f"the rerank endpoint {self.url} did not answer JSON") from exc
        return read_scores(payload, len(texts), self.url)

    async def close(self) -> None:
        if self._own_client:
            await self._client.aclose()


def read_scores(payload: Any, count: int, where: str = "the rerank endpoint") -> list[float]:
    """One score per document from a ``/rerank`` answer (see the module docstring)."""
    results = payload.get("results") if isinstance(payload, dict) else payload
    if not isinstance(results, list):
        raise RerankError(f"{where} answered no 'results' list: {str(payload)[:300]!r}")
    scores: dict[int, float] = {}
    for item in results:
        try:
            index = item["index"]
            score = item["relevance_score"] if "relevance_score" in item else item["score"]
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError("index")
            scores[index] = float(score)
        except (KeyError, TypeError, ValueError) as exc:
            raise RerankError(
                f"{where} answered a result without an integer 'index' and a numeric "
                f"'relevance_score': {str(item)[:200]!r}"
            ) from exc
        if not 0 <= index < count:
            raise RerankError(f"{where} answered index {index} for {count} documents")
    floor = min(scores.values(), default=0.0) - 1.0
    return [scores.get(i, floor) for i in range(count)]


def cross_encoder_from_settings(settings: Settings) -> HttpCrossEncoder | None:
    """The configured cross-encoder, or None when ``TIDEGRAPH_RERANK_BASE_URL`` is unset."""
    if not settings.rerank_base_url:
        return None
    if not settings.rerank_model:
        raise ValueError(
            "TIDEGRAPH_RERANK_BASE_URL is set but TIDEGRAPH_RERANK_MODEL is not: name the "
            "reranker model the endpoint serves (e.g. BAAI/bge-reranker-v2-m3)"
        )
    key = settings.rerank_api_key.get_secret_value() if settings.rerank_api_key else None
    return HttpCrossEncoder(settings.rerank_base_url, settings.rerank_model, key)
