"""Embeddings from an OpenAI-compatible ``/v1/embeddings`` endpoint.

Texts are sent in batches (a few batches in flight at once); each request is retried a bounded
number of times, with jittered exponential backoff (honouring ``Retry-After`` when the server
sends one), on 429, 5xx, timeouts and connection errors. The openai client's own retries are off
(``max_retries=0``) so that this is the only retry loop. Vectors are L2-normalised here, whatever
the server returns, and checked against the configured dimension.
"""

from __future__ import annotations

import asyncio
import logging

import openai
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from tidegraph.embed.base import Embedder, EmbeddingThresholds, l2_normalise

logger = logging.getLogger(__name__)

#: Default cut-offs per model. These are NOT measured in this repository (no endpoint is
#: reachable from the build machine): they are starting values for text-embedding-3-small,
#: whose cosines run lower than MiniLM's (unrelated short texts ~0.1-0.3, rewordings
#: ~0.7-0.9). Recalibrate with the pairs in benchmarks/embedders.py against the real endpoint
#: and pass ``thresholds=`` (or extend this table) for any other model.
OPENAI_THRESHOLDS: dict[str, EmbeddingThresholds] = {
    "text-embedding-3-small": EmbeddingThresholds(
        entity_same=0.75,
        entity_candidate=0.40,
        fact_candidate=0.55,
    ),
}
DEFAULT_THRESHOLDS_MODEL = "text-embedding-3-small"

DEFAULT_BATCH_SIZE = 256
DEFAULT_MAX_CONCURRENCY = 4


class EmbeddingResponseError(RuntimeError):
    """The endpoint answered, but not with one vector of the expected size per input."""


def thresholds_for(model: str) -> EmbeddingThresholds:
    """The default thresholds of ``model`` (text-embedding-3-small's when it is not known)."""
    known = OPENAI_THRESHOLDS.get(model)
    if known is not None:
        return known
    logger.warning(
        "no calibrated embedding thresholds for %r; using those of %s",
        model,
        DEFAULT_THRESHOLDS_MODEL,
    )
    return OPENAI_THRESHOLDS[DEFAULT_THRESHOLDS_MODEL]


def is_retryable(exc: BaseException) -> bool:
    """429 (except an exhausted quota), 5xx, 408, timeouts and connection errors."""
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code == 429:
            return getattr(exc, "code", None) != "insufficient_quota"
        return exc.status_code >= 500 or exc.status_code == 408
    return False


def retry_after_seconds(exc: BaseException | None) -> float | None:
    """The server's ``Retry-After``/``retry-after-ms`` hint, in seconds, if any."""
    response = getattr(exc, "response", None)
    if response is None:
        return None
    headers = response.headers
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            return max(0.0, float(raw) * scale)
        except ValueError:
            continue  # an HTTP date: fall back to our own backoff
    return None


class OpenAIEmbedder(Embedder):
    """``AsyncOpenAI(...).embeddings.create`` with batching and bounded, jittered retries.

    Args:
        base_url: the OpenAI-compatible base URL (e.g. ``https://api.openai.com/v1``).
        api_key: the API key.
        model: the embedding model name at the endpoint.
        dim: the dimension of the vectors; responses of another size are an error.
        send_dimensions: send ``dimensions=dim`` (text-embedding-3-* can shorten their vectors;
            many other servers reject the parameter).
        batch_size: texts per request.
        max_concurrency: requests in flight at once for one :meth:`embed` call.
        max_attempts: attempts per request, retries included.
        timeout: seconds per request.
        backoff_initial / backoff_max: the jittered exponential backoff, in seconds.
        thresholds: overrides the model's defaults (:data:`OPENAI_THRESHOLDS`).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        dim: int,
        *,
        send_dimensions: bool = False,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        max_attempts: int = 5,
        timeout: float = 60.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        thresholds: EmbeddingThresholds | None = None,
    ) -> None:
        if batch_size < 1 or max_concurrency < 1 or max_attempts < 1:
            raise ValueError("batch_size, max_concurrency and max_attempts must be at least 1")
        self.model_name = model
        self.dim = dim
        self.thresholds = thresholds or thresholds_for(model)
        self.send_dimensions = send_dimensions
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        self.max_attempts = max_attempts
        self._jitter = wait_random_exponential(multiplier=backoff_initial, max=backoff_max)
        self._backoff_max = backoff_max
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0
        )

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        batches = [texts[i : i + self.batch_size] for i in range(0, len(texts), self.batch_size)]
        gate = asyncio.Semaphore(self.max_concurrency)

        async def run(batch: list[str]) -> list[list[float]]:
            async with gate:
                return await self._embed_batch(batch)

        results = await asyncio.gather(*(run(batch) for batch in batches))
        return [vector for batch_vectors in results for vector in batch_vectors]

    async def close(self) -> None:
        await self._client.close()

    async def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        dimensions = self.dim if self.send_dimensions else openai.omit
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_attempts),
            wait=self._wait,
            retry=retry_if_exception(is_retryable),
            before_sleep=self._log_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                response = await self._client.embeddings.create(
                    model=self.model_name,
                    input=batch,
                    encoding_format="float",
                    dimensions=dimensions,
                )
        return self._vectors(response, len(batch))

    def _vectors(self, response: object, expected: int) -> list[list[float]]:
        data = sorted(response.data, key=lambda item: item.index)  # type: ignore[attr-defined]
        if len(data) != expected:
            raise EmbeddingResponseError(
                f"{self.model_name}: {len(data)} embeddings returned for {expected} inputs"
            )
        vectors = [l2_normalise(item.embedding) for item in data]
        for vector in vectors:
            if len(vector) != self.dim:
                raise EmbeddingResponseError(
                    f"{self.model_name} returned {len(vector)}-dim vectors, expected {self.dim}: "
                    "set TIDEGRAPH_EMBEDDING_DIM to the model's dimension (or use a model that "
                    "accepts the `dimensions` parameter)"
                )
        return vectors

    def _wait(self, state: RetryCallState) -> float:
        jittered = self._jitter(state)
        hint = retry_after_seconds(state.outcome.exception() if state.outcome else None)
        return jittered if hint is None else max(jittered, min(hint, self._backoff_max))

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        logger.warning(
            "embedding request to %s failed (attempt %d/%d, %s); retrying in %.2fs",
            self.model_name,
            state.attempt_number,
            self.max_attempts,
            type(exc).__name__,
            state.upcoming_sleep,
        )
