"""Settings of the streaming workers (``TIDEGRAPH_`` environment variables, like Settings).

Kept apart from ``tidegraph.settings.Settings`` because only the Kafka topology reads them;
they are listed in docs/configuration.md "Worker settings".
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from tidegraph.pipelines.retry import RetryPolicy


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TIDEGRAPH_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    consumer_group: str | None = Field(
        None, description="Kafka consumer group of the workers; default '<prefix>.pipeline'."
    )
    batch_size: int = Field(256, ge=1, description="Most records per micro-batch (stream.take).")
    batch_within_seconds: float = Field(
        0.2, gt=0, description="Longest wait to fill a micro-batch before processing it."
    )
    extraction_batch_within_seconds: float = Field(
        0.05,
        gt=0,
        description="The same for the extraction hop and the source stage (which extracts "
        "the records a declared mapping maps): their micro-batches only group the records "
        "of a job, and a lane's records waiting behind a busy job are taken together anyway.",
    )

    def retry_policy(self) -> RetryPolicy:
        """Retries of a record's transient failures (``TIDEGRAPH_STAGE_MAX_ATTEMPTS``, the
        backoff settings)."""
        return RetryPolicy(
            max_attempts=self.stage_max_attempts,
            backoff=self.retry_backoff_seconds,
            backoff_max=self.retry_backoff_max_seconds,
        )

    def batch_within(self, stage: str) -> float:
        """The micro-batch wait of the hop that starts with ``stage``."""
        if stage in ("extraction", "source"):
            return self.extraction_batch_within_seconds
        return self.batch_within_seconds

    max_in_flight: int = Field(
        128, ge=1, description="Most records a stage has admitted at once (all groups)."
    )
    fetch_max_wait_seconds: float = Field(
        0.1,
        gt=0,
        le=1.5,
        description="Longest a fetch of the worker's consumer waits at the broker for new "
        "records (tidegraph/pipelines/streaming/fetching.py): the partitions its fetch left "
        "out, whose records were taken meanwhile, are fetched after that at the latest.",
    )
    fetch_min_bytes: int = Field(
        16384,
        ge=1,
        le=1_048_576,
        description="How many bytes of new records a fetch of the worker's consumer waits "
        "for at the broker, at most TIDEGRAPH_FETCH_MAX_WAIT_SECONDS (Kafka's "
        "fetch.min.bytes): fewer fetches under a steady feed, a record of a quiet feed up to "
        "that wait later per hop; 1 answers at the first record.",
    )
    max_in_flight_per_group: int = Field(
        16, ge=1, description="Most records a stage has admitted at once for one group."
    )
    rebalance_timeout_seconds: float = Field(
        60.0, gt=0, le=85, description="How long the group waits for a worker to finish the "
        "records it took when partitions move (Kafka rebalance timeout)."
    )  # fmt: skip
    stage_max_attempts: int = Field(
        4, ge=1, description="Attempts per record and stage for transient errors."
    )
    retry_backoff_seconds: float = Field(
        0.5, gt=0, description="First backoff between attempts (doubles, with jitter)."
    )
    retry_backoff_max_seconds: float = Field(8.0, gt=0, description="Longest backoff.")
    changes_relay_seconds: float = Field(
        0.2,
        gt=0,
        description="How often a worker publishes the changes its groups committed to "
        "{prefix}.changes (the change stream's relay).",
    )
    max_record_bytes: int = Field(
        1_000_000, ge=1024, description="Input records larger than this are dead-lettered."
    )
    commit_every: int = Field(100, ge=1, description="Commit offsets after this many acks.")
    commit_interval_seconds: float = Field(1.0, gt=0, description="Commit offsets this often.")
    session_timeout_seconds: float = Field(
        10.0, ge=6, description="Kafka group session timeout (a dead worker's partitions move "
        "after this long)."
    )  # fmt: skip
    heartbeat_interval_seconds: float = Field(2.0, gt=0, description="Kafka heartbeat interval.")
    health_stuck_seconds: float = Field(
        300.0, gt=0, description="/readyz fails when a stage has work in flight and no "
        "progress for this long."
    )  # fmt: skip
    health_probe_seconds: float = Field(
        10.0, gt=0, description="How often the worker checks that Neo4j answers (/readyz)."
    )
    metrics_host: str = Field("0.0.0.0", description="Address the /metrics endpoint binds.")
    communities_enabled: bool = Field(
        True, description="Run the community processor (assignment agent and refresh timer)."
    )
    community_check_seconds: float = Field(
        30.0,
        gt=0,
        description="How often the refresh timer checks each group's drift and "
        "age; the refreshes one check starts are spread evenly over this time.",
    )
    community_drift_threshold: float = Field(
        0.1, ge=0, description="Refresh a group when its incremental assignments since the "
        "last refresh exceed this fraction of its size."
    )  # fmt: skip
    community_max_age_seconds: float = Field(
        6 * 3600.0, gt=0, description="Refresh a group whose last refresh is older than this "
        "when something was assigned since."
    )  # fmt: skip
    community_max_concurrent_refreshes: int = Field(
        2, ge=1, description="Most group refreshes a worker runs at once."
    )
    pending_sweep_seconds: float = Field(
        300.0,
        gt=0,
        description="With an LLM configured: how often the worker sends the episodes stored "
        "without extraction (of the groups whose partitions it owns) through the chain again.",
    )
    pending_sweep_limit: int = Field(
        500, ge=1, description="Most not-yet-extracted episodes one sweep sends again."
    )

    def group_id(self, prefix: str) -> str:
        return self.consumer_group or f"{prefix}.pipeline"
