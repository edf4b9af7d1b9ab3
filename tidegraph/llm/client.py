"""The one LLM client of tidegraph: structured outputs from pydantic schemas (docs/configuration.md
"Configuration": the LLM settings).

``LLMClient.structured`` sends one chat completion with ``response_format`` of type
``json_schema`` (strict) built from a pydantic model, parses the answer with orjson and
validates it with the model.

* Rate limit: ONE limiter per client shared by every stage and task: requests per minute and
  estimated tokens per minute (aiolimiter leaky buckets). Each HTTP attempt, retries
  included, takes one request and ``ceil(chars(system + user + schema JSON) / 4)`` tokens
  (capped at the per-minute budget). Completion tokens are not known in advance and are not
  charged; leave headroom in ``tokens_per_minute`` for them.
* Retries (tenacity, full-jitter exponential backoff from ``backoff_base`` up to
  ``backoff_max``; a server's ``Retry-After`` is honoured up to ``backoff_max``): HTTP 408,
  409, 429 and 5xx, timeouts, connection errors and invalid output (not JSON, or not the
  schema). The openai client's own retries are off. Other 4xx fail at once.
* Cache: keyed by a hash of (model, schema name, schema JSON, system, user); a hit makes no
  HTTP request. Only validated answers are stored. Cache failures are logged, never raised.
* Accounting, per stage:
  - ``LLM_CALLS{outcome}``: one per ``structured`` call: ``ok``, ``cached`` or ``error``;
  - ``LLM_ERRORS{kind}`` and ``stats.errors``: one per failed attempt, including ones a retry
    then fixed; ``RETRIES{reason}``: one per retry (reason = the error kind);
  - ``LLM_LATENCY``: every HTTP attempt; ``LLM_TOKENS`` and ``stats.*_tokens``: the answer's
    ``usage`` (also of answers that failed validation: they cost tokens);
  - ``stats.calls`` / ``stats.prompt_chars``: HTTP requests that got an HTTP answer (any
    status) and the system+user characters they carried; ``stats.cached``: cache hits.

Strict-mode schema rules (``strict_json_schema``; violations raise ``StrictSchemaError`` on
the first call with that schema):

* every field is sent as required: a field with a default must still be produced by the
  model, so make optional fields ``X | None`` (the default value is not sent);
* not expressible, so refused: ``dict[str, X]`` / free-form ``dict``, ``Any`` fields, models
  with ``extra="allow"``, tuples (``prefixItems``), ``not``, multi-entry ``allOf``;
* rewritten: ``Literal["x"]`` (``const``) -> one-value ``enum``; discriminated unions
  (``oneOf``) -> ``anyOf``; a ``$ref`` with siblings (e.g. a described nested model) is
  inlined;
* dropped from what is sent but still enforced by pydantic on the answer (an answer that
  breaks them is retried as invalid output): ``minLength``/``maxLength``, ``uniqueItems``,
  ``default``, ``examples``, string formats other than date-time, time, date, duration,
  email, hostname, ipv4, ipv6 and uuid, and any other keyword OpenAI does not document;
* the root must be a model (an object) and the class name must match ``[A-Za-z0-9_-]{1,64}``
  (it is the ``json_schema`` name servers and the fake server key on; no generic models).

Size: about 650 lines because the client's retry, error classification and rate limiting
are one policy read together (every attempt passes all three); the cache lives in
``tidegraph/llm/cache.py``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import openai
import orjson
from aiolimiter import AsyncLimiter
from openai.types.chat import (
    ChatCompletionSystemMessageParam,
    ChatCompletionUserMessageParam,
)
from openai.types.shared_params import ResponseFormatJSONSchema
from pydantic import BaseModel, ValidationError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from tidegraph.llm.cache import ResponseCache, SqliteResponseCache
from tidegraph.metrics import LLM_CALLS, LLM_ERRORS, LLM_LATENCY, LLM_TOKENS, RETRIES

if TYPE_CHECKING:
    from tidegraph.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T", bound=BaseModel)
ErrorKind = Literal["rate_limited", "server", "timeout", "invalid_output", "other"]

CACHE_FILE_NAME = "llm_cache.sqlite3"
_CACHE_KEY_VERSION = "v1"
_CHARS_PER_TOKEN = 4


# ---- errors ----------------------------------------------------------------------------------
class LLMError(Exception):
    """An LLM call failed for good. ``kind`` says why, ``attempts`` how many HTTP attempts."""

    def __init__(self, message: str, *, stage: str, kind: ErrorKind, attempts: int) -> None:
        super().__init__(message)
        self.stage = stage
        self.kind: ErrorKind = kind
        self.attempts = attempts

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_llm_error, (str(self), self.stage, self.kind, self.attempts))


def _rebuild_llm_error(message: str, stage: str, kind: ErrorKind, attempts: int) -> LLMError:
    return LLMError(message, stage=stage, kind=kind, attempts=attempts)


class StrictSchemaError(TypeError):
    """A pydantic model that cannot be sent as an OpenAI strict JSON schema."""


class _AttemptFailure(Exception):
    """A retryable failure of one attempt (internal)."""

    def __init__(self, kind: ErrorKind, detail: str, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.kind: ErrorKind = kind
        self.detail = detail
        self.retry_after = retry_after


# ---- strict JSON schema ----------------------------------------------------------------------
_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_KEPT_KEYWORDS = frozenset(
    {
        "type", "title", "description", "enum", "pattern",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minItems", "maxItems",
    }
)  # fmt: skip
_STRICT_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
_REFUSED_KEYWORDS = {
    "prefixItems": "tuples are not supported; use a list or a nested model",
    "patternProperties": "pattern properties are not supported; use a list of objects",
    "not": "'not' is not supported",
    "if": "conditional schemas are not supported",
}
_TYPE_KEYWORDS = ("type", "anyOf", "oneOf", "allOf", "$ref", "enum", "const", "properties")


def strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAI strict-mode JSON schema of ``model`` (rules in the module docstring)."""
    if not _SCHEMA_NAME.match(model.__name__):
        raise StrictSchemaError(
            f"schema class name {model.__name__!r} cannot be a json_schema name: "
            "use letters, digits, '_' or '-' (at most 64), and no generic models"
        )
    raw = model.model_json_schema()
    defs: dict[str, Any] = raw.get("$defs", {})
    converter = _StrictConverter(model.__name__, defs)
    root = converter.node({k: v for k, v in raw.items() if k != "$defs"}, "")
    if root.get("type") != "object":
        raise StrictSchemaError(f"{model.__name__}: the root of a strict schema must be an object")
    if defs:
        root["$defs"] = {name: converter.node(d, f"$defs.{name}") for name, d in defs.items()}
    return root


class _StrictConverter:
    def __init__(self, model_name: str, defs: dict[str, Any]) -> None:
        self.model_name = model_name
        self.defs = defs

    def fail(self, path: str, problem: str) -> StrictSchemaError:
        where = f"{self.model_name}{'.' + path if path else ''}"
        return StrictSchemaError(f"{where}: {problem} (OpenAI strict structured outputs)")

    def node(self, schema: dict[str, Any], path: str, inlining: tuple[str, ...] = ()) -> Any:
        if "$ref" in schema:
            return self.ref(schema, path, inlining)
        if "allOf" in schema:
            return self.all_of(schema, path, inlining)
        if not any(key in schema for key in _TYPE_KEYWORDS):
            raise self.fail(path, "a field without a type (Any?) is not supported")
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key in _REFUSED_KEYWORDS:
                raise self.fail(path, _REFUSED_KEYWORDS[key])
            if key == "const":
                out["enum"] = [value]
            elif key in ("anyOf", "oneOf"):
                out["anyOf"] = [self.node(v, f"{path}|{i}", inlining) for i, v in enumerate(value)]
            elif key == "properties":
                out[key] = {
                    name: self.node(sub, f"{path}.{name}".lstrip("."), inlining)
                    for name, sub in value.items()
                }
            elif key == "items" and isinstance(value, dict):
                out[key] = self.node(value, f"{path}[]", inlining)
            elif key == "format":
                if value in _STRICT_FORMATS:
                    out[key] = value
            elif key in _KEPT_KEYWORDS:
                out[key] = value
        if schema.get("type") == "object" or "properties" in schema:
            self.close_object(schema, out, path)
        return out

    def close_object(self, schema: dict[str, Any], out: dict[str, Any], path: str) -> None:
        extra = schema.get("additionalProperties")
        if extra not in (None, False):
            raise self.fail(
                path,
                "open objects (dict[str, X], or extra='allow') are not supported; "
                "use a list of key/value models",
            )
        if not out.get("properties"):
            raise self.fail(path, "an object without properties (a bare dict?) is not supported")
        out["required"] = list(out["properties"])
        out["additionalProperties"] = False

    def ref(self, schema: dict[str, Any], path: str, inlining: tuple[str, ...]) -> Any:
        ref: str = schema["$ref"]
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        if not siblings:
            return {"$ref": ref}
        name = ref.rsplit("/", 1)[-1]
        if not ref.startswith("#/$defs/") or name not in self.defs:
            raise self.fail(path, f"unresolvable reference {ref!r}")
        if name in inlining:  # recursive model: keep the reference, drop the annotations
            return {"$ref": ref}
        # OpenAI rejects a $ref with sibling keywords: inline the definition instead.
        return self.node({**self.defs[name], **siblings}, path, (*inlining, name))

    def all_of(self, schema: dict[str, Any], path: str, inlining: tuple[str, ...]) -> Any:
        parts = schema["allOf"]
        if len(parts) != 1:
            raise self.fail(path, "allOf with several schemas is not supported")
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        return self.node({**parts[0], **rest}, path, inlining)


@dataclass(frozen=True)
class _SchemaSpec:
    name: str
    schema: dict[str, Any]
    text: str  # canonical JSON of ``schema`` (sorted keys)
    response_format: ResponseFormatJSONSchema


@functools.cache
def _spec_for(model: type[BaseModel]) -> _SchemaSpec:
    schema = strict_json_schema(model)
    text = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode()
    response_format = ResponseFormatJSONSchema(
        type="json_schema",
        json_schema={"name": model.__name__, "schema": schema, "strict": True},
    )
    return _SchemaSpec(model.__name__, schema, text, response_format)


def cache_key(model: str, schema: type[BaseModel], system: str, user: str) -> str:
    """The response-cache key of a ``structured`` call."""
    spec = _spec_for(schema)
    payload = orjson.dumps([_CACHE_KEY_VERSION, model, spec.name, spec.text, system, user])
    return hashlib.sha256(payload).hexdigest()


# ---- stats and rate limiting -----------------------------------------------------------------
@dataclass
class LLMStats:
    """What this client did (semantics in the module docstring)."""

    calls: Counter[str] = field(default_factory=Counter)
    cached: Counter[str] = field(default_factory=Counter)
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_chars: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        errors: dict[str, dict[str, int]] = {}
        for (stage, kind), n in sorted(self.errors.items()):
            errors.setdefault(stage, {})[kind] = n
        return {
            "calls": dict(sorted(self.calls.items())),
            "cached": dict(sorted(self.cached.items())),
            "errors": errors,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_chars": dict(sorted(self.prompt_chars.items())),
        }


class RateLimiter:
    """Requests-per-minute and tokens-per-minute budgets shared by all calls of a client."""

    def __init__(self, requests_per_minute: int, tokens_per_minute: int) -> None:
        if requests_per_minute < 1 or tokens_per_minute < 1:
            raise ValueError("requests_per_minute and tokens_per_minute must be at least 1")
        self.requests = AsyncLimiter(requests_per_minute, 60)
        self.tokens = AsyncLimiter(tokens_per_minute, 60)

    async def acquire(self, tokens: int) -> None:
        """Wait until one more request of about ``tokens`` tokens fits in both budgets."""
        await self.requests.acquire()
        await self.tokens.acquire(min(max(tokens, 0), self.tokens.max_rate))


@dataclass(frozen=True)
class _Call:
    stage: str
    system: str
    user: str
    schema: type[BaseModel]
    spec: _SchemaSpec

    @property
    def prompt_chars(self) -> int:
        return len(self.system) + len(self.user)

    @property
    def estimated_tokens(self) -> int:
        return math.ceil((self.prompt_chars + len(self.spec.text)) / _CHARS_PER_TOKEN)


class _Backoff:
    """Full-jitter exponential backoff that honours a server's Retry-After (capped)."""

    def __init__(self, base: float, maximum: float) -> None:
        self.maximum = maximum
        self._jitter = wait_random_exponential(multiplier=base, max=maximum)

    def __call__(self, state: RetryCallState) -> float:
        wait = self._jitter(state)
        failure = state.outcome.exception() if state.outcome else None
        retry_after = getattr(failure, "retry_after", None)
        if retry_after:
            wait = max(wait, min(retry_after, self.maximum))
        return wait


# ---- the client ------------------------------------------------------------------------------
class LLMClient:
    """Structured LLM calls against one OpenAI-compatible endpoint (see module docstring)."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        timeout: float = 60.0,
        max_attempts: int = 5,
        requests_per_minute: int = 600,
        tokens_per_minute: int = 2_000_000,
        cache: ResponseCache | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 20.0,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.base_url = base_url
        self.model = model
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.cache = cache
        self.limiter = RateLimiter(requests_per_minute, tokens_per_minute)
        self.stats = LLMStats()
        self._backoff = _Backoff(backoff_base, backoff_max)
        self._owns_cache = False
        self._openai = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> LLMClient | None:
        """The client configured by ``TIDEGRAPH_LLM_*``, or None when no base URL is set.

        Its cache is ``<data_dir>/llm_cache.sqlite3``, closed with the client.
        """
        if not settings.llm_base_url:
            return None
        client = cls(
            base_url=settings.llm_base_url,
            api_key=settings.llm_api_key.get_secret_value(),
            model=settings.llm_model,
            timeout=settings.llm_timeout_seconds,
            max_attempts=settings.llm_max_attempts,
            requests_per_minute=settings.llm_requests_per_minute,
            tokens_per_minute=settings.llm_tokens_per_minute,
            cache=SqliteResponseCache(settings.data_dir / CACHE_FILE_NAME),
        )
        client._owns_cache = True
        return client

    async def close(self) -> None:
        """Close the HTTP client (and the cache when ``from_settings`` created it)."""
        await self._openai.close()
        if self._owns_cache and self.cache is not None:
            self.cache.close()

    async def structured(self, *, stage: str, system: str, user: str, schema: type[T]) -> T:
        """Ask the model for an answer of type ``schema``; validated, cached, retried.

        Raises ``LLMError`` when no valid answer could be had, and ``StrictSchemaError`` when
        ``schema`` cannot be sent in strict mode.
        """
        call = _Call(stage, system, user, schema, _spec_for(schema))
        key = cache_key(self.model, schema, system, user)
        hit = await self._cached(call, key)
        if hit is not None:
            self.stats.cached[stage] += 1
            LLM_CALLS.labels(stage, "cached").inc()
            return hit  # type: ignore[return-value]
        try:
            result, content = await self._with_retries(call)
        except LLMError as exc:
            LLM_CALLS.labels(stage, "error").inc()
            log.warning("llm call failed: %s", exc, extra={"stage": stage, "kind": exc.kind})
            raise
        LLM_CALLS.labels(stage, "ok").inc()
        await self._cache_put(key, content)
        return result  # type: ignore[return-value]

    # ---- retries and one attempt ---------------------------------------------------------
    async def _with_retries(self, call: _Call) -> tuple[BaseModel, bytes]:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_attempts),
            wait=self._backoff,
            retry=retry_if_exception_type(_AttemptFailure),
            before_sleep=functools.partial(self._before_retry, call.stage),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._attempt(call, attempt.retry_state.attempt_number)
        except _AttemptFailure as failure:
            raise LLMError(
                self._gave_up_message(call, failure), stage=call.stage, kind=failure.kind,
                attempts=self.max_attempts,
            ) from failure  # fmt: skip
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _before_retry(self, stage: str, state: RetryCallState) -> None:
        failure = state.outcome.exception() if state.outcome else None
        kind = getattr(failure, "kind", "other")
        wait = state.next_action.sleep if state.next_action else 0.0
        RETRIES.labels(stage, kind).inc()
        log.info(
            "llm retry: stage=%s kind=%s attempt=%d/%d wait=%.2fs: %s",
            stage, kind, state.attempt_number, self.max_attempts, wait, failure,
            extra={"stage": stage, "kind": kind, "attempt": state.attempt_number},
        )  # fmt: skip

    async def _attempt(self, call: _Call, attempt: int) -> tuple[BaseModel, bytes]:
        await self.limiter.acquire(call.estimated_tokens)
        started = time.perf_counter()
        try:
            response = await self._openai.chat.completions.create(
                model=self.model,
                messages=[
                    ChatCompletionSystemMessageParam(role="system", content=call.system),
                    ChatCompletionUserMessageParam(role="user", content=call.user),
                ],
                response_format=call.spec.response_format,
                timeout=self.timeout,
            )
        except openai.APIStatusError as exc:
            self._answered(call)
            raise self._failed(call, self._status_failure(call, exc, attempt)) from exc
        except openai.APITimeoutError as exc:
            detail = f"no answer within {self.timeout:g}s"
            raise self._failed(call, _AttemptFailure("timeout", detail)) from exc
        except openai.APIConnectionError as exc:
            detail = f"could not reach {self.base_url} ({exc.__cause__ or exc})"
            raise self._failed(call, _AttemptFailure("server", detail)) from exc
        except openai.OpenAIError as exc:
            failure = LLMError(
                f"LLM call for stage {call.stage!r} failed: {exc}", stage=call.stage,
                kind="other", attempts=attempt,
            )  # fmt: skip
            raise self._failed(call, failure) from exc
        finally:
            LLM_LATENCY.labels(call.stage).observe(time.perf_counter() - started)
        self._answered(call, response.usage)
        try:
            content = _content_of(response)
            result = call.schema.model_validate(orjson.loads(content))
        except _AttemptFailure as failure:
            raise self._failed(call, failure) from None
        except orjson.JSONDecodeError as exc:
            detail = f"the answer is not valid JSON ({exc})"
            raise self._failed(call, _AttemptFailure("invalid_output", detail)) from None
        except ValidationError as exc:
            detail = f"the answer does not fit {call.spec.name}: {_short(exc)}"
            raise self._failed(call, _AttemptFailure("invalid_output", detail)) from None
        return result, content.encode()

    def _answered(self, call: _Call, usage: Any = None) -> None:
        """Account one HTTP request that got an answer."""
        self.stats.calls[call.stage] += 1
        self.stats.prompt_chars[call.stage] += call.prompt_chars
        if usage is None:
            return
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        self.stats.prompt_tokens += prompt
        self.stats.completion_tokens += completion
        LLM_TOKENS.labels(call.stage, "prompt").inc(prompt)
        LLM_TOKENS.labels(call.stage, "completion").inc(completion)

    def _failed(self, call: _Call, failure: _AttemptFailure | LLMError) -> Exception:
        """Account one failed attempt and give back the exception to raise."""
        self.stats.errors[(call.stage, failure.kind)] += 1
        LLM_ERRORS.labels(call.stage, failure.kind).inc()
        return failure

    def _status_failure(
        self, call: _Call, exc: openai.APIStatusError, attempt: int
    ) -> _AttemptFailure | LLMError:
        status = exc.status_code
        detail = f"HTTP {status}: {_server_message(exc)}"
        if status == 429:
            return _AttemptFailure("rate_limited", detail, _retry_after(exc))
        if status == 408:
            return _AttemptFailure("timeout", detail)
        if status == 409 or status >= 500:
            return _AttemptFailure("server", detail, _retry_after(exc))
        return LLMError(
            self._refused_message(call, status, detail), stage=call.stage, kind="other",
            attempts=attempt,
        )  # fmt: skip

    # ---- operator-facing messages --------------------------------------------------------
    def _refused_message(self, call: _Call, status: int, detail: str) -> str:
        where = f"LLM endpoint {self.base_url} refused stage {call.stage!r} ({detail})"
        if status == 401:
            return f"{where}. The API key was rejected: check TIDEGRAPH_LLM_API_KEY."
        if status == 403:
            return (
                f"{where}. The key may not have access to model {self.model!r}: check "
                "TIDEGRAPH_LLM_API_KEY and TIDEGRAPH_LLM_MODEL."
            )
        if status == 404:
            return (
                f"{where}. Check TIDEGRAPH_LLM_BASE_URL (OpenAI-compatible servers usually end "
                f"in /v1) and that model {self.model!r} exists (TIDEGRAPH_LLM_MODEL)."
            )
        return (
            f"{where}. Not retried. If the server complains about response_format or the "
            f"schema {call.spec.name!r}, the server or model {self.model!r} may not support "
            "strict json_schema structured outputs."
        )

    def _gave_up_message(self, call: _Call, failure: _AttemptFailure) -> str:
        head = (
            f"LLM call for stage {call.stage!r} (schema {call.spec.name!r}) failed after "
            f"{self.max_attempts} attempts; last: {failure.detail}."
        )
        advice = {
            "rate_limited": "The endpoint kept rate-limiting: lower TIDEGRAPH_LLM_REQUESTS_PER_"
            "MINUTE / TIDEGRAPH_LLM_TOKENS_PER_MINUTE below its quota, or raise the quota.",
            "server": f"Check that the endpoint at {self.base_url} is up and healthy "
            "(TIDEGRAPH_LLM_BASE_URL).",
            "timeout": "The endpoint is slow or overloaded: raise TIDEGRAPH_LLM_TIMEOUT_SECONDS "
            "or lower TIDEGRAPH_LLM_REQUESTS_PER_MINUTE.",
            "invalid_output": f"Model {self.model!r} did not produce JSON fitting the schema: "
            "check that it supports strict json_schema structured outputs, or choose another "
            "TIDEGRAPH_LLM_MODEL.",
        }.get(failure.kind, "")
        return f"{head} {advice}".strip()

    # ---- cache ---------------------------------------------------------------------------
    async def _cached(self, call: _Call, key: str) -> BaseModel | None:
        if self.cache is None:
            return None
        try:
            raw = await self._cache_io(self.cache.get, key)
        except Exception:  # a broken cache must not stop the pipeline
            log.warning("llm cache read failed; calling the endpoint", exc_info=True)
            return None
        if raw is None:
            return None
        try:
            return call.schema.model_validate(orjson.loads(raw))
        except (orjson.JSONDecodeError, ValidationError):
            log.warning("stale llm cache entry for stage=%s ignored", call.stage)
            return None

    async def _cache_put(self, key: str, content: bytes) -> None:
        if self.cache is None:
            return
        try:
            await self._cache_io(self.cache.put, key, content)
        except Exception:
            log.warning("llm cache write failed; answer not cached", exc_info=True)

    async def _cache_io(self, fn: Any, *args: Any) -> Any:
        assert self.cache is not None
        if self.cache.blocking:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)


# ---- helpers ---------------------------------------------------------------------------------
def _content_of(response: Any) -> str:
    """The assistant message content, or an invalid-output failure saying what is wrong."""
    try:
        choice = response.choices[0]
        message = choice.message
    except (AttributeError, IndexError, TypeError):
        raise _AttemptFailure("invalid_output", "the answer has no choices") from None
    if getattr(message, "refusal", None):
        raise _AttemptFailure("invalid_output", f"the model refused: {message.refusal}")
    content = message.content
    if not content:
        reason = getattr(choice, "finish_reason", None)
        raise _AttemptFailure("invalid_output", f"empty answer (finish_reason={reason})")
    if getattr(choice, "finish_reason", None) == "length":
        raise _AttemptFailure("invalid_output", "the answer was cut off (finish_reason=length)")
    return str(content)


def _server_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(exc.message)


def _retry_after(exc: openai.APIStatusError) -> float | None:
    headers = exc.response.headers
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value:
            try:
                return max(float(value) / scale, 0.0)
            except ValueError:
                return None  # an HTTP date: let the backoff decide
    return None


def _short(exc: ValidationError, limit: int = 3) -> str:
    parts = [
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
        for err in exc.errors()[:limit]
    ]
    more = exc.error_count() - limit
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
