"""Every Prometheus metric tidegraph exports, in one place (listed in docs/streaming.md, "Metrics").

Stages and components import the metric objects from here; the worker serves them over HTTP.
"""

from __future__ import annotations

import functools
from typing import TypeVar

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

_Metric = TypeVar("_Metric", bound=MetricWrapperBase)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

# ---- stages ------------------------------------------------------------------------------
STAGE_EVENTS = Counter(
    "tidegraph_stage_events_total",
    "Records handled by a stage, by outcome (ok, skipped, error = one failed attempt, "
    "retried, dead_lettered).",
    ["stage", "outcome"],
)
STAGE_LATENCY = Histogram(
    "tidegraph_stage_latency_seconds",
    "Time a stage spends on one record.",
    ["stage"],
    buckets=LATENCY_BUCKETS,
)
END_TO_END_LATENCY = Histogram(
    "tidegraph_end_to_end_latency_seconds",
    "From the episode's produce timestamp to its graph write committing.",
    buckets=LATENCY_BUCKETS,
)
EVENT_LOOP_LAG = Histogram(
    "tidegraph_event_loop_lag_seconds",
    "How late the worker's event loop ran its heartbeat (due every second): time the loop "
    "was blocked by code that did not yield (a stall of every group at once).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
IN_FLIGHT = Gauge(
    "tidegraph_in_flight_episodes", "Episodes a stage is working on right now.", ["stage"]
)
RETRIES = Counter(
    "tidegraph_retries_total", "Retries of transient failures, by stage.", ["stage", "reason"]
)
DEAD_LETTERS = Counter(
    "tidegraph_dead_letters_total", "Records sent to the dead-letter topic.", ["stage", "reason"]
)

# ---- LLM ---------------------------------------------------------------------------------
LLM_CALLS = Counter(
    "tidegraph_llm_calls_total",
    "LLM requests by stage and outcome (ok, cached, error).",
    ["stage", "outcome"],
)
LLM_TOKENS = Counter(
    "tidegraph_llm_tokens_total", "LLM tokens by stage and kind (prompt, completion).",
    ["stage", "kind"],
)  # fmt: skip
LLM_ERRORS = Counter(
    "tidegraph_llm_errors_total",
    "LLM failures by stage and kind (rate_limited, server, timeout, invalid_json, other).",
    ["stage", "kind"],
)
LLM_LATENCY = Histogram(
    "tidegraph_llm_latency_seconds", "LLM request latency.", ["stage"], buckets=LATENCY_BUCKETS
)

# ---- graph store -------------------------------------------------------------------------
STORE_WRITE_LATENCY = Histogram(
    "tidegraph_store_write_latency_seconds",
    "Graph write transaction latency, by operation.",
    ["operation"],
    buckets=LATENCY_BUCKETS,
)
FACT_JUDGEMENTS = Counter(
    "tidegraph_fact_judgements_total",
    "Episodes whose new facts the LLM judged, by how: joint (answered by a call that judged "
    "several consecutive episodes of the group), alone (a call of the episode's own: one "
    "at a time, or a joint call that did not ask exactly its questions).",
    ["how"],
)
LLM_CALLS_AHEAD = Counter(
    "tidegraph_llm_calls_ahead_total",
    "LLM calls started ahead on a guess (an episode's entity judging, while the episodes "
    "before it in its unit are judged and written), by outcome: used (the real request was "
    "the same), unused (it was not: one call wasted), failed (asked again).",
    ["outcome"],
)
BATCHES = Counter(
    "tidegraph_batches_total",
    "Micro-batches of one group's mapped episodes, by outcome: batched (resolved, stamped, "
    "invalidated and written as one unit), or fallback (processed one episode at a time: "
    "the batch's read could not answer a question exactly, or an episode failed).",
    ["outcome"],
)
BATCH_EPISODES = Histogram(
    "tidegraph_batch_episodes",
    "Episodes per micro-batch written as one unit.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)

STORE_BATCH_SIZE = Histogram(
    "tidegraph_store_batch_rows",
    "Rows per graph write transaction, by operation.",
    ["operation"],
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
)
STORE_ERRORS = Counter(
    "tidegraph_store_errors_total", "Graph store errors by kind (transient, other).", ["kind"]
)

# ---- graph content -----------------------------------------------------------------------
FACTS_INVALIDATED = Counter(
    "tidegraph_facts_invalidated_total",
    "Facts closed by a contradicting fact, or stored born-closed (late).",
    ["kind"],
)
EPISODES_NOT_EXTRACTED = Counter(
    "tidegraph_episodes_not_extracted_total",
    "Episodes stored without extraction (searchable; `tidegraph extract --pending` extracts "
    "them later), by reason: no_llm, or the LLM failure that stopped extraction.",
    ["reason"],
)
ENTITIES_RESOLVED = Counter(
    "tidegraph_entities_resolved_total",
    "Extracted entities by how they were resolved (key, exact, llm, new).",
    ["method"],
)

# ---- communities -------------------------------------------------------------------------
COMMUNITY_ASSIGNMENTS = Counter(
    "tidegraph_community_assignments_total",
    "New entities handled by incremental assignment, by outcome (joined, none, error = "
    "given up after retries; the next refresh places it).",
    ["outcome"],
)
COMMUNITY_REFRESHES = Counter(
    "tidegraph_community_refreshes_total",
    "Full community refreshes, by trigger (initial, drift, age, manual).",
    ["trigger"],
)
COMMUNITY_REFRESH_SECONDS = Histogram(
    "tidegraph_community_refresh_seconds",
    "Duration of a full community refresh (projection, propagation, summaries, write).",
    buckets=LATENCY_BUCKETS,
)
COMMUNITIES_CHANGED = Counter(
    "tidegraph_communities_changed_total",
    "Communities a refresh touched, by kind (changed, created, deleted, unchanged).",
    ["kind"],
)
COMMUNITY_DRIFT_ARI = Gauge(
    "tidegraph_community_drift_ari",
    "ARI of the live partition against the fresh one at the group's last refresh.",
    ["group_id"],
)
COMMUNITY_DRIFT_RATIO = Gauge(
    "tidegraph_community_drift_ratio",
    "Incremental assignments since the group's last refresh relative to the group's size "
    "then; a refresh is scheduled above TIDEGRAPH_COMMUNITY_DRIFT_THRESHOLD.",
    ["group_id"],
)
COMMUNITY_SUMMARIES = Counter(
    "tidegraph_community_summaries_total",
    "Communities a refresh named and summarised, by source (llm = one LLM summary call, "
    "default = named from the top members without an LLM).",
    ["source"],
)

# ---- memory retrieval --------------------------------------------------------------------
SEARCHES = Counter(
    "tidegraph_searches_total",
    "Memory searches (tidegraph.recall.Searcher), by recipe and outcome (ok, error).",
    ["recipe", "outcome"],
)
SEARCH_LATENCY = Histogram(
    "tidegraph_search_latency_seconds",
    "Time one memory search takes (every method, the reranking), by recipe.",
    ["recipe"],
    buckets=LATENCY_BUCKETS,
)

# ---- serving memory (tidegraph serve, tidegraph mcp) -------------------------------------
HTTP_REQUESTS = Counter(
    "tidegraph_http_requests_total",
    "HTTP requests `tidegraph serve` answered, by route template, method and status code.",
    ["route", "method", "status"],
)
HTTP_LATENCY = Histogram(
    "tidegraph_http_request_seconds",
    "Time `tidegraph serve` took to answer a request (read-your-writes waits included).",
    ["route", "method"],
    buckets=(0.001, 0.0025, *LATENCY_BUCKETS),
)
HTTP_ERRORS = Counter(
    "tidegraph_http_errors_total",
    "HTTP requests answered with an error, by route and error code (unauthorized, forbidden, "
    "invalid, bad_request, too_large, episode_pending, episode_dead_lettered, internal, ...).",
    ["route", "error"],
)
MCP_TOOL_CALLS = Counter(
    "tidegraph_mcp_tool_calls_total",
    "MCP tool calls by tool and outcome (ok, error).",
    ["tool", "outcome"],
)
SERVE_WAITS = Gauge(
    "tidegraph_serve_waits",
    "Requests of `tidegraph serve` and `tidegraph mcp` held open now, by kind: wait_for (a read "
    "waiting for its writes), changes (a long poll of GET /v1/changes), stream (a server-sent "
    "change stream), subscription (an MCP session subscribed to a group's changes).",
    ["kind"],
)

# ---- streaming topology (Kafka workers) ----------------------------------------------------
BATCH_SIZE = Histogram(
    "tidegraph_batch_records",
    "Records per micro-batch a stage's agent took from Kafka.",
    ["stage"],
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
)
RECORDS_PRODUCED = Counter(
    "tidegraph_records_produced_total",
    "Records a worker produced and Kafka acknowledged, by topic (extracted, resolved, stamped, "
    "entities.new, dlq).",
    ["topic"],
)
WRITES_IN_EXTRACTION_HOP = Counter(
    "tidegraph_extraction_hop_mapped_total",
    "Mapped records of the extraction hop: written there (written), or handed on to the write "
    "hop because records of their group were on the way there (handed_on).",
    ["path"],
)
ASSIGNED_PARTITIONS = Gauge(
    "tidegraph_assigned_partitions",
    "Partitions of each consumed topic currently assigned to this worker.",
    ["topic"],
)

# ---- declared sources (docs/sources.md) ----------------------------------------------------
SOURCE_RECORDS = Counter(
    "tidegraph_source_records_total",
    "Records of a declared source by outcome: episode (produced to {prefix}.episodes), "
    "skipped (a tombstone, heartbeat, ...), dead_lettered.",
    ["source", "outcome"],
)
SOURCE_SKIPPED = Counter(
    "tidegraph_source_skipped_total",
    "Records of a declared source that are no episode and no failure, by kind: tombstone, "
    "heartbeat, schema_change, transaction, truncate, message.",
    ["source", "kind"],
)
SOURCE_BEHIND = Gauge(
    "tidegraph_source_behind_seconds",
    "How far a declared source's stage is behind: from the last record's Kafka timestamp to "
    "its turn into an episode.",
    ["source"],
)
SOURCE_DEAD_LETTERS = Counter(
    "tidegraph_source_dead_letters_total",
    "Records of a declared source sent to the dead-letter topic, by reason.",
    ["source", "reason"],
)

# ---- memory lifecycle: forgetting and the change stream ------------------------------------
FORGOTTEN = Counter(
    "tidegraph_forgotten_total",
    "Episodes forgotten (erased, kept only as tombstones), by how they were named: episode, "
    "subject, group.",
    ["by"],
)
FORGET_REQUESTS = Counter(
    "tidegraph_forget_requests_total",
    "Forget requests the workers took from the input topic (taken), ran (done) or dead-lettered "
    "(failed).",
    ["outcome"],
)
FORGET_SECONDS = Histogram(
    "tidegraph_forget_seconds",
    "Time a forget took to work out its difference (replaying the part of the group it "
    "reaches, or the whole group).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
)
FORGET_PATHS = Counter(
    "tidegraph_forget_paths_total",
    "Forgets by how their difference was computed: incremental (the part of the group they "
    "reach) or whole (the group's remaining episodes replayed; the log line says why).",
    ["path"],
)
CHANGES_PUBLISHED = Counter(
    "tidegraph_changes_published_total",
    "Changes the relay produced to {prefix}.changes and Kafka acknowledged.",
)
CHANGES_PRUNED = Counter(
    "tidegraph_changes_pruned_total",
    "Changes dropped from the store's outbox once older than TIDEGRAPH_CHANGES_RETENTION_HOURS.",
)
CHANGES_BEHIND = Gauge(
    "tidegraph_changes_unpublished",
    "Changes committed to the outbox of the groups this worker relays and not published yet.",
)
STORE_UNREACHABLE = Gauge(
    "tidegraph_store_unreachable",
    "1 while the graph store does not answer and records wait for it at the head of their "
    'groups (docs/streaming.md "When the store is down"), else 0.',
)
STORE_UNREACHABLE_SECONDS = Counter(
    "tidegraph_store_unreachable_seconds_total",
    "Seconds the graph store did not answer, counted when each outage ended.",
)
STORE_HELD = Gauge(
    "tidegraph_store_held_records",
    "Records (or record groups) waiting for the graph store to answer again.",
)
PARTITIONS_PAUSED = Gauge(
    "tidegraph_partitions_paused",
    "Input partitions this worker paused while the graph store does not answer.",
)


@functools.cache
def labelled(metric: _Metric, *values: str) -> _Metric:
    """``metric.labels(*values)``, kept: the series of a stage counted once or more for every
    record (its lookup takes a lock and builds the key each time: 1.4 µs with the
    increment, against 0.5 µs kept). Only for
    labels from a fixed few values (stages, outcomes, resolution methods): every series asked
    is kept for good."""
    return metric.labels(*values)
