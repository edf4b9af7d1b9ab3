"""The LLM client: structured outputs, rate limiting, retries and a response cache."""

from tidegraph.llm.cache import MemoryResponseCache, ResponseCache, SqliteResponseCache
from tidegraph.llm.client import (
    LLMClient,
    LLMError,
    LLMStats,
    RateLimiter,
    StrictSchemaError,
    cache_key,
    strict_json_schema,
)

__all__ = [
    "LLMClient",
    "LLMError",
    "LLMStats",
    "MemoryResponseCache",
    "RateLimiter",
    "ResponseCache",
    "SqliteResponseCache",
    "StrictSchemaError",
    "cache_key",
    "strict_json_schema",
]
