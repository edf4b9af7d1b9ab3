"""Every metric a Grafana panel or alert rule queries is in a real worker's ``/metrics``: a
``tidegraph worker`` process on the real Kafka and Neo4j, scraped over HTTP after it has
processed records (the unit test in tests/unit/test_ops.py checks the registry in-process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.topology_harness import Topology
from tests.support.crm_feed import crm_feed
from tests.unit.test_ops import queried_but_not_exported, series_in

pytestmark = pytest.mark.integration


async def test_dashboards_and_alerts_query_only_what_a_real_worker_exports(
    kafka_bootstrap: str, neo4j_uri: str, neo4j_driver: Any, topic_prefix: str, tmp_path: Path
) -> None:
    topo = Topology(kafka_bootstrap, neo4j_uri, topic_prefix, tmp_path)
    try:
        worker = topo.start_worker()
        report = await topo.produce(crm_feed(12, 2, run=topo.run))
        await topo.wait_reflected(report)
        await topo.wait_metric(worker, "tidegraph_stage_events_total", 12, stage="invalidation",
                               outcome="ok")  # fmt: skip
        series = series_in(worker.metrics())
        assert "tidegraph_end_to_end_latency_seconds_bucket" in series
        missing = queried_but_not_exported(series)
        assert not missing, "queried metrics this worker does not export:\n" + "\n".join(missing)
    finally:
        await topo.close(neo4j_driver)
