"""Reading a process's Prometheus metrics (for tests and benchmarks): free ports, a scrape of
``/metrics``, samples and sums of a metric, quantiles of a histogram."""

from __future__ import annotations

import socket
import urllib.request


# ----------------------------------------------------------------------------- workers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------- metrics
def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Samples of metric ``name`` (exact sample name) in Prometheus text format."""
    samples = []
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head == name:
            labels: dict[str, str] = {}
        elif head.startswith(name + "{"):
            labels = dict(
                (part.split("=", 1)[0], part.split("=", 1)[1].strip('"'))
                for part in head[len(name) + 1 : -1].split(",")
                if part
            )
        else:
            continue
        samples.append((labels, float(value)))
    return samples


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(
        value
        for got, value in metric_samples(text, name)
        if all(got.get(k) == v for k, v in labels.items())
    )


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """PromQL-style quantile from cumulative bucket counts {upper bound: count}."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total == 0:
        return float("nan")
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower
