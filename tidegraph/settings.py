"""Settings read from environment variables (prefix ``TIDEGRAPH_``) or a ``.env`` file.

Every field here is documented in docs/configuration.md; keep the two in step.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

KafkaSecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
KafkaSaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


# The topic prefix, and so the deployment (docs/streaming.md "Change stream"), when none is set.
DEFAULT_TOPIC_PREFIX = "tidegraph"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TIDEGRAPH_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    # --- graph store -------------------------------------------------------------------
    store: Literal["embedded", "neo4j"] = Field(
        "embedded", description="Graph store: the embedded one (no server) or Neo4j."
    )
    data_dir: Path = Field(
        Path(".tidegraph"), description="Folder for the embedded store, LLM cache and local data."
    )
    embedded_cache_mb: int = Field(
        128,
        ge=1,
        description="Page cache of the embedded store (SQLite), MiB: an upper bound, the "
        "store's own memory, for its writes and again, shared, for its searches; more keeps "
        "more of a large graph's pages in memory.",
    )
    neo4j_uri: str = Field("bolt://127.0.0.1:17687", description="Neo4j Bolt URI.")
    neo4j_user: str = Field("neo4j", description="Neo4j user.")
    neo4j_password: SecretStr = Field(SecretStr("tidegraph-local"), description="Neo4j password.")
    neo4j_database: str = Field("neo4j", description="Neo4j database name.")
    neo4j_ca_file: Path | None = Field(
        None,
        description="CA certificate (PEM) that signed Neo4j's Bolt certificate; turns on TLS "
        "for bolt:// and neo4j:// URIs (neo4j+s:// uses the system CAs instead).",
    )

    # --- kafka -------------------------------------------------------------------------
    kafka_bootstrap_servers: str = Field(
        "127.0.0.1:19092", description="Kafka bootstrap servers, comma separated."
    )
    kafka_security_protocol: KafkaSecurityProtocol = Field(
        "PLAINTEXT", description="Kafka security protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or "
        "SASL_SSL (every Kafka client: workers, topic admin, produce, dlq)."
    )  # fmt: skip
    kafka_sasl_mechanism: KafkaSaslMechanism = Field(
        "PLAIN", description="SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."
    )
    kafka_sasl_username: str | None = Field(None, description="SASL user name.")
    kafka_sasl_password: SecretStr | None = Field(None, description="SASL password.")
    kafka_ssl_cafile: Path | None = Field(
        None, description="CA certificate (PEM) for the brokers' TLS; unset = system CAs."
    )
    kafka_ssl_certfile: Path | None = Field(
        None, description="Client certificate (PEM) for mutual TLS."
    )
    kafka_ssl_keyfile: Path | None = Field(None, description="Client private key (PEM).")
    kafka_ssl_key_password: SecretStr | None = Field(
        None, description="Password of the client private key, if it is encrypted."
    )
    kafka_ssl_check_hostname: bool = Field(
        True, description="Check that the broker certificate names the host connected to."
    )
    topic_prefix: str = Field(
        DEFAULT_TOPIC_PREFIX,
        description="Prefix of every topic name; also names the deployment whose relay "
        "publishes the change stream of the groups it writes.",
    )
    partitions: int = Field(8, ge=1, description="Partitions of every tidegraph topic.")
    replication_factor: int = Field(1, ge=1, description="Replication factor of created topics.")
    encrypt_episodes: bool = Field(
        False,
        description="Seal the episodes tidegraph's own producers write to the input topic "
        "with their group's data key, held in the store, so that forgetting a group with "
        'purge makes its records unreadable (docs/streaming.md "Sealed episodes"). The '
        "producers then need the store.",
    )

    # --- LLM and embeddings ------------------------------------------------------------
    llm_base_url: str | None = Field(
        None, description="OpenAI-compatible base URL; unset = no LLM (mapped JSON only)."
    )
    llm_model: str = Field("gpt-4o-mini", description="Chat model used for extraction.")
    llm_api_key: SecretStr = Field(SecretStr("unset"), description="API key for the LLM endpoint.")
    llm_timeout_seconds: float = Field(60.0, gt=0, description="Per-call LLM timeout.")
    llm_max_attempts: int = Field(5, ge=1, description="Attempts per LLM call before giving up.")
    llm_requests_per_minute: int = Field(600, ge=1, description="Global LLM request budget.")
    llm_tokens_per_minute: int = Field(2_000_000, ge=1, description="Global LLM token budget.")
    embedder: Literal["minilm", "e5", "openai", "hashing"] = Field(
        "minilm",
        description="Embedder: offline MiniLM (bundled), offline e5-small-v2 (fetched by the "
        "install step; better episode search, thresholds not calibrated for LLM-fed stores), "
        "the OpenAI-compatible endpoint, or a deterministic hashing embedder (tests).",
    )
    embedding_model: str = Field(
        "text-embedding-3-small", description="Embedding model name at the OpenAI endpoint."
    )
    embedding_dim: int = Field(
        384, ge=8, description="Embedding dimension for the openai/hashing embedders."
    )
    mappings: Path | None = Field(
        None, description="Declared-mapping file (YAML) for JSON records; unset = none."
    )
    sources: Path | None = Field(
        None,
        description="Declared-sources file (YAML): existing topics (Debezium change events, "
        "Avro through a schema registry, JSON) the worker reads beside its input topic; "
        "unset = none (docs/sources.md).",
    )
    rerank_base_url: str | None = Field(
        None,
        description="Base URL of a cross-encoder /rerank endpoint (Cohere, Jina, vLLM, TEI); "
        "unset = no cross-encoder (the cross_encoder search recipes need one).",
    )
    rerank_model: str | None = Field(None, description="Reranker model at that endpoint.")
    rerank_api_key: SecretStr | None = Field(
        None, description="API key of the rerank endpoint (sent as a Bearer token)."
    )
    context_episodes: int = Field(
        4, ge=0, description="Previous episodes of the group given to extraction as context."
    )
    llm_episodes_per_call: int = Field(
        4,
        ge=1,
        description="Waiting text episodes of one group extracted by one LLM call (1: one "
        "call per episode).",
    )
    embed_mapped_content: bool = Field(
        False,
        description="Also embed the content of JSON records extracted by a declared mapping, "
        "for episode vector search (their facts and entities are embedded, and BM25 finds "
        "the records, either way). Off, a mapped record's write costs Neo4j about half.",
    )

    changes_enabled: bool = Field(
        True,
        description="Record every committed change of the graph in the store's outbox (the "
        "change stream: GET /v1/changes, {prefix}.changes); off, writes skip it.",
    )
    changes_retention_hours: float = Field(
        168.0,
        ge=0,
        description="How long the store's outbox keeps a committed change (a reader of GET "
        "/v1/changes can catch up that far back; 0: for good). Through Kafka, a change is "
        "also kept until the relay has published it.",
    )

    # --- records ---------------------------------------------------------------------
    record_timeout_seconds: float = Field(
        600.0,
        gt=0,
        description="Longest a stage may work on one record, retries included; then the record "
        "is dead-lettered with reason 'timeout' (replayable) and its group goes on.",
    )
    store_outage_limit_seconds: float = Field(
        3600.0,
        ge=0,
        description="How long records wait at the head of their groups for a graph store "
        "that does not answer (nothing is dead-lettered for it; record budgets stop meanwhile); "
        "past it a worker exits with status 75 without committing, `tidegraph ingest` stops "
        'with one line (docs/streaming.md "When the store is down"). The servers never '
        "hold a request: they answer 503 with Retry-After.",
    )

    # --- worker ------------------------------------------------------------------------
    metrics_port: int = Field(9464, description="Port of the worker's /metrics and health HTTP.")
    log_level: str = Field("INFO", description="Log level.")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
