"""Offline validation of the operations files: dashboards, alert rules, compose, Kubernetes.

- Every metric a dashboard or alert rule queries is exported by a worker's ``/metrics`` (the
  health server over the real registry) or is a known external metric (``up``, kafka-exporter).
- Dashboards have the Grafana dashboard shape; alert rules have the Prometheus rules shape.
- ``deploy/compose/docker-compose.yml`` passes the compose-spec JSON schema (vendored in
  check-jsonschema) and its workers use only settings docs/configuration.md documents.
- ``deploy/k8s`` manifests pass the Kubernetes OpenAPI schemas bundled in kubernetes-validate
  (strict: unknown fields rejected). Both validators run with no network.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tidegraph import metrics
from tidegraph.pipelines.streaming.health import HealthState, start_http_server

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
RULES = GRAFANA / "alerts" / "tidegraph.rules.yml"
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s"


DOCS = ROOT / "docs"
OPERATIONS_MD = DOCS / "operations.md"
CONFIGURATION_MD = DOCS / "configuration.md"
K8S_VERSION = "1.30.0"

# Metrics tidegraph does not export itself: Prometheus' scrape health and kafka-exporter's lag.
EXTERNAL_METRICS = {"up", "kafka_consumergroup_lag", "kafka_consumergroup_lag_sum"}
PROMQL_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan",
}  # fmt: skip
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


# ---- helpers ----------------------------------------------------------------------------------
def settings_table(path: Path, heading: str, *, required: bool = True) -> set[str]:
    """``TIDEGRAPH_*`` names in the first column of the table under a markdown heading."""
    text = path.read_text()
    match = re.search(rf"^#+ {re.escape(heading)}\s*$(.*?)(?=^#+ |\Z)", text, re.M | re.S)
    if not match and not required:
        return set()
    assert match, f"{path.name}: no section {heading!r}"
    names = set(re.findall(r"^\| `(TIDEGRAPH_[A-Z0-9_]+)` \|", match.group(1), re.M))
    assert names, f"{path.name}: no settings table under {heading!r}"
    return names


def documented_settings() -> set[str]:
    """Every setting the docs document: the Configuration and Worker settings tables."""
    return settings_table(CONFIGURATION_MD, "Configuration") | settings_table(
        CONFIGURATION_MD, "Worker settings"
    )


def real_settings() -> set[str]:
    """The environment variables tidegraph reads: Settings, WorkerSettings and ServeSettings
    fields, and the local services' (a tool of the checkout)."""
    from tests.support.local_services import LocalSettings
    from tidegraph.app.serving.settings import ServeSettings
    from tidegraph.pipelines.streaming.config import WorkerSettings
    from tidegraph.settings import Settings

    fields = (
        set(Settings.model_fields)
        | set(WorkerSettings.model_fields)
        | set(ServeSettings.model_fields)
        | set(LocalSettings.model_fields)
    )
    return {f"TIDEGRAPH_{name.upper()}" for name in fields}


def test_the_docs_document_exactly_the_real_settings():
    documented, real = documented_settings(), real_settings()
    assert real - documented == set(), "settings missing from the docs/configuration.md tables"
    assert documented - real == set(), "docs/configuration.md documents settings not read"


def strip_promql(expr: str) -> str:
    """Remove what holds no metric name: strings, grafana variables, ranges, grouping labels."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\$\{?\w+\}?", "1", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery durations
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    return expr


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (identifiers that are not functions or keywords)."""
    names = set()
    for m in re.finditer(r"(?<![\w$.:])([a-zA-Z_:][\w:]*)(\s*\()?", strip_promql(expr)):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in PROMQL_KEYWORDS:
            continue
        names.add(name)
    return names


def promql_selectors(expr: str) -> list[tuple[str, set[str]]]:
    """``(metric, label names)`` for every ``metric{...}`` selector."""
    expr = re.sub(r"\$\{?\w+\}?", "x", expr)
    out = []
    for m in re.finditer(r"([a-zA-Z_:][\w:]*)\{([^}]*)\}", expr):
        labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", re.sub(r'"[^"]*"', "", m.group(2))))
        out.append((m.group(1), labels))
    return out


def dashboard_exprs() -> list[tuple[str, str]]:
    out = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                out.append((f"{path.name}: {panel['title']}", target["expr"]))
    return out


def rule_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [
        (f"{RULES.name}: {r.get('alert') or r.get('record')}", r["expr"])
        for g in doc["groups"]
        for r in g["rules"]
    ]


def all_exprs() -> list[tuple[str, str]]:
    return dashboard_exprs() + rule_exprs()


def tidegraph_metric_objects() -> dict[str, MetricWrapperBase]:
    """Metric objects defined in tidegraph/metrics.py, by name as defined there."""
    found = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            found[value._name] = value
    return found


def series_in(exposition: str) -> set[str]:
    """Series names a Prometheus text exposition declares (from its ``# TYPE`` lines)."""
    series = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.M):
        if kind == "counter":
            base = name.removesuffix("_total")
            series |= {f"{base}_total", f"{base}_created"}
        elif kind == "histogram":
            series |= {name, *(f"{name}{s}" for s in ("_bucket", "_sum", "_count", "_created"))}
        elif kind == "summary":
            series |= {name, f"{name}_sum", f"{name}_count", f"{name}_created"}
        else:
            series.add(name)
    return series


def queried_but_not_exported(series: set[str]) -> list[str]:
    """``where: metric`` for every metric a dashboard or alert queries that is not in
    ``series`` (nor a known external metric)."""
    missing = []
    for where, expr in all_exprs():
        for name in promql_metric_names(expr):
            if name not in series and name not in EXTERNAL_METRICS:
                missing.append(f"{where}: {name}")
    return missing


@pytest.fixture(scope="module")
def exported_series() -> set[str]:
    """Series names the health server exposes over the real registry (the integration test
    tests/integration/test_worker_metrics.py checks a real worker's /metrics the same way)."""
    server = start_http_server(0, HealthState(kafka_connected=True), addr="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        server.close()
    return series_in(text)


# ---- metrics referenced by dashboards and alerts ---------------------------------------------
def test_the_promql_name_parser():
    expr = (
        "histogram_quantile(0.95, sum by (le, stage) (rate(tidegraph_stage_latency_seconds_bucket"
        '{job=~"$job", stage=~"rate(x)"}[$__rate_interval]))) * 1e6 and on (instance) up == 0 '
        "unless absent(kafka_consumergroup_lag) > $price"
    )
    assert promql_metric_names(expr) == {
        "tidegraph_stage_latency_seconds_bucket",
        "up",
        "kafka_consumergroup_lag",
    }
    assert promql_selectors(expr)[0] == ("tidegraph_stage_latency_seconds_bucket", {"job", "stage"})


def test_every_queried_metric_is_exported_by_a_worker(exported_series):
    assert any(n.startswith("tidegraph_") for n in exported_series)
    missing = queried_but_not_exported(exported_series)
    assert not missing, "metrics that no worker exports:\n" + "\n".join(missing)


def test_every_tidegraph_metric_is_defined_in_metrics_py():
    defined = set(tidegraph_metric_objects())
    used = set()
    for _, expr in all_exprs():
        for name in promql_metric_names(expr):
            if name.startswith("tidegraph_"):
                base = name
                for suffix in SUFFIXES:
                    base = base.removesuffix(suffix)
                used.add(base)
    assert used <= {n.removesuffix("_total") for n in defined}, used - defined
    assert len(used) >= 10  # the dashboards cover the worker's metrics, not a token few


def test_selectors_use_labels_the_metric_has():
    labels = {name: set(m._labelnames) for name, m in tidegraph_metric_objects().items()}
    target_labels = {"job", "instance", "le"}
    bad = []
    for where, expr in all_exprs():
        for metric, used in promql_selectors(expr):
            if not metric.startswith("tidegraph_"):
                continue
            base = metric
            for suffix in ("_bucket", "_sum", "_count", "_created"):
                base = base.removesuffix(suffix)
            known = labels.get(base) or labels.get(base.removesuffix("_total")) or set()
            if not used <= known | target_labels:
                bad.append(f"{where}: {metric} has no label {sorted(used - known - target_labels)}")
    assert not bad, "\n".join(bad)


# ---- dashboards -------------------------------------------------------------------------------
PANEL_TYPES = {"timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "text", "row"}


def test_dashboards_exist():
    assert {p.name for p in DASHBOARDS} >= {"tidegraph-pipeline.json", "tidegraph-llm.json"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_has_the_grafana_shape(path: Path):
    dash = json.loads(path.read_text())
    for key, kind in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list)):
        assert isinstance(dash.get(key), kind), f"{key} missing or not {kind.__name__}"
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dash["uid"])
    assert dash["schemaVersion"] >= 36
    assert "id" not in dash or dash["id"] is None  # provisioned dashboards carry no db id
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    graphs = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(graphs) >= 5
    for panel in dash["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["type"]
        assert panel["title"]
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y"))
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], f"{panel['title']}: no targets"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")"), f"{panel['title']}: unbalanced ()"
            assert expr.count("{") == expr.count("}"), f"{panel['title']}: unbalanced {{}}"
            for var in re.findall(r"\$\{?(\w+)\}?", expr):
                assert var.startswith("__") or var in variables, f"{panel['title']}: ${var}"


def test_dashboard_uids_are_unique():
    uids = [json.loads(p.read_text())["uid"] for p in DASHBOARDS]
    assert len(uids) == len(set(uids))


def test_dashboards_cover_the_issue_panels():
    exprs = " ".join(e for _, e in dashboard_exprs())
    for needle in (
        "tidegraph_stage_events_total",  # throughput and errors per stage
        "tidegraph_end_to_end_latency_seconds_bucket",
        "tidegraph_stage_latency_seconds_bucket",
        "kafka_consumergroup_lag",  # lag per partition
        "tidegraph_llm_tokens_total",
        "tidegraph_llm_errors_total",
        "tidegraph_llm_latency_seconds_bucket",
        "$prompt_price_per_mtok",  # estimated cost
        "tidegraph_dead_letters_total",
        "tidegraph_store_write_latency_seconds_bucket",
    ):
        assert needle in exprs, needle
    assert "sum by (topic, partition) (kafka_consumergroup_lag" in exprs
    community = {n for n in tidegraph_metric_objects() if "_communit" in n}
    for name in community:  # every community metric that exists gets a panel
        assert name in exprs or name.removesuffix("_total") in exprs, name


def test_grafana_provisioning_points_at_the_dashboards():
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["uid"] == "prometheus"
    prov = yaml.safe_load((GRAFANA / "provisioning/dashboards/tidegraph.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    compose = yaml.safe_load(COMPOSE.read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"../../grafana/dashboards:{provider['options']['path']}:ro" in mounts
    assert "../../grafana/provisioning:/etc/grafana/provisioning:ro" in mounts


# ---- alert rules ------------------------------------------------------------------------------
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


def test_alert_rules_are_a_valid_prometheus_rules_file():
    doc = yaml.safe_load(RULES.read_text())
    assert set(doc) == {"groups"}
    names = set()
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit", "labels"}
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert ("alert" in rule) != ("record" in rule)
            assert set(rule) <= {"alert", "record", "expr", "for", "keep_firing_for", "labels",
                                 "annotations"}  # fmt: skip
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            assert rule["expr"].count("(") == rule["expr"].count(")")
            if "alert" in rule:
                assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"])
                assert rule["alert"] not in names, f"duplicate alert {rule['alert']}"
                names.add(rule["alert"])
                assert DURATION.match(rule.get("for", "0s"))
                assert rule["labels"]["severity"] in {"warning", "critical"}
                assert {"summary", "runbook"} <= set(rule["annotations"])
    assert {
        "TidegraphWorkerDown",
        "TidegraphConsumerLagGrowing",
        "TidegraphDeadLetters",
        "TidegraphLLMErrorRate",
        "TidegraphStageStalled",
        "TidegraphNeo4jErrors",
    } <= names


def test_every_alert_has_a_runbook_section():
    doc = yaml.safe_load(RULES.read_text())
    text = OPERATIONS_MD.read_text()
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                name = rule["alert"]
                assert re.search(rf"^#+ `?{name}`?\s*$", text, re.M), f"no runbook for {name}"
                assert f"#{name.lower()}" in rule["annotations"]["runbook"]


# ---- docker compose ---------------------------------------------------------------------------
def interpolate(text: str) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR}`` interpolation with every variable unset."""

    def sub(m: re.Match[str]) -> str:
        return m.group(2) or ""

    text = re.sub(r"(?<!\$)\$\{(\w+)(?::?-([^}]*))?\}", sub, text)
    return text.replace("$$", "$")


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_compose_file_passes_the_compose_spec_schema(tmp_path):
    resolved = tmp_path / "docker-compose.yml"
    resolved.write_text(interpolate(COMPOSE.read_text()))
    result = check_compose(resolved)
    assert result.returncode == 0, result.stdout + result.stderr
    raw = check_compose(COMPOSE)  # the file as written (interpolation left to compose)
    assert raw.returncode == 0, raw.stdout + raw.stderr


def test_the_compose_validator_rejects_a_broken_file(tmp_path):
    doc = yaml.safe_load(interpolate(COMPOSE.read_text()))
    doc["services"]["worker"]["restartt"] = "always"
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(doc))
    result = check_compose(bad)
    assert result.returncode != 0
    assert "restartt" in result.stdout + result.stderr


def test_compose_runs_the_whole_stack():
    doc = yaml.safe_load(interpolate(COMPOSE.read_text()))
    services = doc["services"]
    assert {"kafka", "neo4j", "worker", "kafka-exporter", "prometheus", "grafana"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert "broker,controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]
    assert services["neo4j"]["image"].startswith("neo4j:5.26")
    worker = services["worker"]
    assert worker["build"]["dockerfile"] == "deploy/Dockerfile"
    env = worker["environment"]
    replicas = int(worker["deploy"]["replicas"])
    assert 1 <= replicas <= int(env["TIDEGRAPH_PARTITIONS"])
    for mount in services["prometheus"]["volumes"] + services["grafana"]["volumes"]:
        source = mount.split(":", 1)[0]
        if source.startswith("."):
            assert (COMPOSE_DIR / source).exists(), source


def test_compose_workers_use_only_documented_settings():
    documented = documented_settings()
    assert {"TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS", "TIDEGRAPH_METRICS_PORT"} <= documented
    doc = yaml.safe_load(interpolate(COMPOSE.read_text()))
    env = doc["services"]["worker"]["environment"]
    assert set(env) <= documented, set(env) - documented
    mentioned = set(re.findall(r"TIDEGRAPH_[A-Z0-9_]+", COMPOSE.read_text()))
    assert mentioned <= documented, mentioned - documented
    assert env["TIDEGRAPH_STORE"] == "neo4j"
    assert env["TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert env["TIDEGRAPH_NEO4J_URI"] == "bolt://neo4j:7687"


def test_prometheus_scrapes_the_workers_metrics_port():
    prom = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    compose = yaml.safe_load(interpolate(COMPOSE.read_text()))
    port = int(compose["services"]["worker"]["environment"]["TIDEGRAPH_METRICS_PORT"])
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    (sd,) = jobs["tidegraph"]["dns_sd_configs"]
    assert sd["names"] == ["worker"] and sd["port"] == port
    assert jobs["kafka-exporter"]["static_configs"][0]["targets"] == ["kafka-exporter:9308"]
    assert prom["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    assert (
        "../../grafana/alerts:/etc/prometheus/rules:ro"
        in compose["services"]["prometheus"]["volumes"]
    )
    # the alerts' job label is the scrape job's name
    assert 'up{job="tidegraph"}' in RULES.read_text()


def test_dockerfile_builds_the_worker_image():
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert "pip install ." in text
    assert 'ENTRYPOINT ["tidegraph"]' in text and 'CMD ["worker"]' in text
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().split()
    for copied in re.findall(r"^COPY (\S+)", text, re.M):
        assert f"!{copied}" in ignore or f"!{copied}/" in ignore, copied


# ---- kubernetes -------------------------------------------------------------------------------
def k8s_resources() -> list[dict]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    docs = []
    for name in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((K8S / name).read_text()) if d)
    return docs


def by_kind(kind: str, component: str = "worker") -> dict:
    """The one manifest of ``kind`` for the workers (or ``component="serve"``)."""
    (doc,) = [
        d
        for d in k8s_resources()
        if d["kind"] == kind
        and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    return doc


def test_kustomization_lists_every_manifest():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


@pytest.mark.parametrize("doc", k8s_resources(), ids=lambda d: f"{d['kind']}")
def test_k8s_manifest_passes_the_kubernetes_schema(doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_k8s_validator_rejects_a_broken_manifest():
    doc = by_kind("Deployment")
    doc["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    doc = by_kind("Deployment")
    doc["spec"]["replicas"] = "four"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_k8s_worker_deployment():
    config = by_kind("ConfigMap")["data"]
    deployment = by_kind("Deployment")
    spec = deployment["spec"]
    assert 1 <= spec["replicas"] <= int(config["TIDEGRAPH_PARTITIONS"])
    pod = spec["template"]
    port = int(config["TIDEGRAPH_METRICS_PORT"])
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
    }
    (container,) = pod["spec"]["containers"]
    assert container["args"] == ["worker"]
    (metrics_port,) = container["ports"]
    assert metrics_port["containerPort"] == port
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind])
    refs = {next(iter(r.values()))["name"] for r in container["envFrom"]}
    assert refs == {by_kind("ConfigMap")["metadata"]["name"], by_kind("Secret")["metadata"]["name"]}
    labels = pod["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    pdb = by_kind("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert by_kind("Service")["spec"]["selector"].items() <= labels.items()


def test_k8s_settings_are_documented():
    known = documented_settings()
    config = set(by_kind("ConfigMap")["data"])
    secret = set(by_kind("Secret")["stringData"])
    assert config | secret <= known, (config | secret) - known
    assert {"TIDEGRAPH_NEO4J_PASSWORD", "TIDEGRAPH_LLM_API_KEY"} <= secret
    assert not config & {
        "TIDEGRAPH_NEO4J_PASSWORD",
        "TIDEGRAPH_LLM_API_KEY",
        "TIDEGRAPH_KAFKA_SASL_PASSWORD",
    }
    assert {"TIDEGRAPH_KAFKA_SECURITY_PROTOCOL", "TIDEGRAPH_KAFKA_SSL_CAFILE"} <= config
    assert by_kind("ConfigMap")["data"]["TIDEGRAPH_NEO4J_URI"].startswith("neo4j+s://")


def test_k8s_serve_deployment():
    config = by_kind("ConfigMap")["data"]
    deployment = by_kind("Deployment", "serve")
    pod = deployment["spec"]["template"]
    port = int(config["TIDEGRAPH_SERVE_PORT"])
    assert config["TIDEGRAPH_SERVE_VIA"] == "kafka"  # any replica answers read-your-writes
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    (container,) = pod["spec"]["containers"]
    assert container["args"] == ["serve"]
    (http,) = container["ports"]
    assert http["containerPort"] == port and http["name"] == "http"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    refs = {next(iter(r.values()))["name"] for r in container["envFrom"]}
    keys = by_kind("Secret", "serve")
    assert refs == {"tidegraph-config", "tidegraph-secrets", keys["metadata"]["name"]}
    assert set(keys["stringData"]) == {"TIDEGRAPH_API_KEYS"} <= documented_settings()
    # the workers never see the API keys
    (worker,) = by_kind("Deployment")["spec"]["template"]["spec"]["containers"]
    assert keys["metadata"]["name"] not in {
        next(iter(r.values()))["name"] for r in worker["envFrom"]
    }
    service = by_kind("Service", "serve")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_compose_serves_the_memory_with_keys_and_is_scraped():
    doc = yaml.safe_load(interpolate(COMPOSE.read_text()))
    serve = doc["services"]["serve"]
    env = serve["environment"]
    assert serve["command"] == ["serve"] and env["TIDEGRAPH_SERVE_VIA"] == "kafka"
    assert set(env) <= documented_settings()
    (mount,) = serve["volumes"]
    source, target, _ = mount.split(":")
    assert target == env["TIDEGRAPH_API_KEYS_FILE"]
    keys = yaml.safe_load((COMPOSE_DIR / source).read_text())
    assert all(isinstance(g, list) and g for g in keys.values())
    port = env["TIDEGRAPH_SERVE_PORT"]
    assert f"{port}:{port}" in serve["ports"]
    prom = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["tidegraph-serve"]["static_configs"][0]["targets"] == [f"serve:{port}"]
    dashboard = json.loads((GRAFANA / "dashboards" / "tidegraph-serve.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["job"]["current"]["value"] == "tidegraph-serve"
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    for metric in ("tidegraph_http_requests_total", "tidegraph_http_request_seconds_bucket",
                   "tidegraph_http_errors_total", "tidegraph_mcp_tool_calls_total"):  # fmt: skip
        assert metric in exprs, metric
