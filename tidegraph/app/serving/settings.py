"""Settings of ``tidegraph serve`` and ``tidegraph mcp`` (``TIDEGRAPH_`` environment variables,
like Settings), and the API keys they accept.

Kept apart from ``tidegraph.settings.Settings`` because only the servers read them; they are
listed in docs/configuration.md.

API keys bind a key to the group ids (tenants) it may read and write:
``TIDEGRAPH_API_KEYS='{"key-1": ["acme"], "key-2": ["globex", "initech"]}'`` and/or
``TIDEGRAPH_API_KEYS_FILE`` (the same mapping as JSON or YAML). Keys are held only as SHA-256
digests once loaded; logs and errors name a key by its short fingerprint, never the key.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

LOOPBACK = ("127.0.0.1", "::1", "localhost")
MAX_WAIT_SECONDS = 60.0


class ServeSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TIDEGRAPH_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    api_keys: SecretStr | None = Field(
        None,
        description='API keys and the group ids each may use, JSON: {"key": ["group", ...]}.',
    )
    api_keys_file: Path | None = Field(
        None, description="File (JSON or YAML) of API keys and their group ids, as API_KEYS."
    )
    serve_host: str | None = Field(
        None,
        description="Address `tidegraph serve` binds; default 0.0.0.0 with API keys, "
        "127.0.0.1 without (without keys only loopback is allowed).",
    )
    serve_port: int = Field(8080, ge=0, le=65535, description="Port of `tidegraph serve`.")
    serve_via: Literal["process", "kafka"] = Field(
        "process",
        description="How the server adds episodes: written in-process (the embedded default) "
        "or produced to Kafka for the workers (acks=all).",
    )
    serve_max_body_bytes: int = Field(
        1_048_576, ge=1024, description="Largest request body the server accepts (else 413)."
    )
    serve_wait_seconds: float = Field(
        10.0,
        gt=0,
        le=MAX_WAIT_SECONDS,
        description="Default wait of a read with wait_for until the episodes are queryable "
        "(a request may ask for up to 60 s).",
    )
    serve_waits_per_key: int = Field(
        8,
        ge=1,
        description="Reads of one API key that may wait for wait_for tokens at once; more "
        "answer 429 at once (one tenant's waits never slow the others).",
    )
    serve_header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="A connection that has not sent a request's headers within this is "
        "answered 408 and closed (slow clients hold no connection).",
    )
    serve_body_timeout_seconds: float = Field(
        30.0, gt=0, description="Longest time to receive a request body (else 408)."
    )


# ----------------------------------------------------------------------------- keys
class KeyFileError(ValueError):
    """The API keys are not a mapping of key -> list of group ids."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: the group ids it may use (``None``: any, only without API keys) and a
    fingerprint of its key for logs (never the key). ``server_scope``: the groups are the
    server's own (``tidegraph mcp --group``), not an API key's."""

    groups: frozenset[str] | None
    key_id: str = "anonymous"
    server_scope: bool = False

    def may_use(self, group_id: str) -> bool:
        return self.groups is None or group_id in self.groups

    def refusal(self, group_id: str) -> str:
        """Why ``group_id`` is refused, in the caller's terms."""
        if self.server_scope:
            served = ", ".join(repr(g) for g in sorted(self.groups or ()))
            return (
                f"group {group_id!r} is not served here: this server is scoped to {served} "
                "(its --group)"
            )
        return f"this API key may not use group {group_id!r}"

    def refused(self, group_ids: list[str]) -> str | None:
        """The first of ``group_ids`` this caller may not use, if any."""
        return next((g for g in group_ids if not self.may_use(g)), None)


def fingerprint(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


class KeyRing:
    """The configured API keys, as digests (see the module docstring)."""

    def __init__(self, keys: dict[str, list[str]]) -> None:
        self._by_digest: dict[bytes, Principal] = {}
        for key, groups in keys.items():
            digest = hashlib.sha256(key.encode()).digest()
            self._by_digest[digest] = Principal(frozenset(groups), fingerprint(key))

    @property
    def enabled(self) -> bool:
        return bool(self._by_digest)

    def __len__(self) -> int:
        return len(self._by_digest)

    def principal(self, key: str | None) -> Principal | None:
        """The caller a key names (None: unknown key). Without configured keys every caller
        may use every group."""
        if not self._by_digest:
            return Principal(None)
        if not key:
            return None
        digest = hashlib.sha256(key.encode()).digest()
        for known, principal in self._by_digest.items():  # constant time per key
            if hmac.compare_digest(known, digest):
                return principal
        return None

    @classmethod
    def from_settings(cls, settings: ServeSettings) -> KeyRing:
        keys: dict[str, list[str]] = {}
        if settings.api_keys is not None and settings.api_keys.get_secret_value().strip():
            try:
                data = orjson.loads(settings.api_keys.get_secret_value())
            except orjson.JSONDecodeError as exc:
                raise KeyFileError(f"TIDEGRAPH_API_KEYS is not JSON: {exc}") from None
            keys.update(_checked(data, "TIDEGRAPH_API_KEYS"))
        if settings.api_keys_file is not None:
            path = settings.api_keys_file
            try:
                data = yaml.safe_load(path.read_text())  # YAML reads JSON too
            except OSError as exc:
                raise KeyFileError(f"cannot read TIDEGRAPH_API_KEYS_FILE {path}: {exc}") from None
            except yaml.YAMLError as exc:
                raise KeyFileError(f"{path} is not JSON or YAML: {exc}") from None
            keys.update(_checked(data, str(path)))
        return cls(keys)


def _checked(data: Any, where: str) -> dict[str, list[str]]:
    example = '{"my-key": ["acme", "globex"]}'
    if not isinstance(data, dict):
        raise KeyFileError(f"{where}: expected a mapping of key to group ids, e.g. {example}")
    out: dict[str, list[str]] = {}
    for n, (key, groups) in enumerate(data.items(), 1):
        if not isinstance(key, str) or len(key) < 8:
            raise KeyFileError(f"{where}: key #{n} must be a string of 8 characters or more")
        if (
            not isinstance(groups, list)
            or not groups
            or not all(isinstance(g, str) and g.strip() for g in groups)
        ):
            raise KeyFileError(
                f"{where}: key #{n} ({fingerprint(key)}) needs a non-empty list of group ids"
            )
        out[key] = [g.strip() for g in groups]
    return out


def bearer_or_header(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key of ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``."""
    if x_api_key:
        return x_api_key.strip()
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return None


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")
