"""The server's Prometheus metrics, kept by ``prometheus_client`` in one registry per app (several apps in one
process keep their own figures): request counts, latency, batch-size and model-time histograms, errors, and the
library's process (CPU, memory, open files), platform and garbage-collector metrics.

A request's latency minus its batch's model time is what HTTP, queueing, tokenising and serialising cost: compare
``embforge_request_latency_seconds`` with ``embforge_model_seconds``.

The names and labels are those of embforge's own writer before it (``embforge_requests_total`` by ``path``,
``method``, ``status``; ``embforge_errors_total`` by ``path``, ``status``; the three histograms). What changed
with ``prometheus_client``: labels are written in name order (``{method=...,path=...,status=...}``), values and
bucket bounds as floats (``le="1.0"``, ``... 3.0``); each counter and histogram also has its ``_created``
timestamp series; ``process_*`` (Linux), ``python_info`` and ``python_gc_*`` are new.
"""

from __future__ import annotations

from embforge._optional import require

require("prometheus_client")
from prometheus_client import (  # noqa: E402
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what :meth:`Metrics.render` writes


class Metrics:
    """The metrics of one app, rendered by :meth:`render` in the Prometheus text format (0.0.4).

    Recording is one ``inc`` or ``observe`` of ``prometheus_client`` (thread-safe: the batchers' worker threads
    record model calls)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "embforge_requests", "HTTP requests.", ["path", "method", "status"], registry=self.registry
        )
        self.errors = Counter(
            "embforge_errors", "Requests answered with 4xx/5xx.", ["path", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "embforge_request_latency_seconds",
            "Request latency.",
            ["path"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batches = Histogram(
            "embforge_batch_size",
            "Items per model call.",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.model_seconds = Histogram(
            "embforge_model_seconds",
            "Seconds of one model call (a batch).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def observe_request(self, path: str, method: str, status: int, seconds: float) -> None:
        code = str(status)
        self.requests.labels(path, method, code).inc()
        self.latency.labels(path).observe(seconds)
        if status >= 400:
            self.errors.labels(path, code).inc()

    def observe_batch(self, model: str, size: int, seconds: float = 0.0) -> None:
        self.batches.labels(model).observe(size)
        self.model_seconds.labels(model).observe(seconds)

    def render(self) -> str:
        """Every metric of the app's registry, in the text format of :data:`CONTENT_TYPE`."""
        return generate_latest(self.registry).decode()
