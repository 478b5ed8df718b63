"""Prometheus text-format metrics without a dependency: request counts, latency, batch-size and model-time
histograms, errors. A request's latency minus its batch's model time is what HTTP, queueing, tokenising and
serialising cost: compare ``embforge_request_latency_seconds`` with ``embforge_model_seconds``."""

from __future__ import annotations

import threading
from collections import defaultdict

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.total += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


class Metrics:
    """Counters and histograms, rendered by :meth:`render` in the Prometheus exposition format (0.0.4)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self.errors: dict[tuple[str, str], int] = defaultdict(int)
        self.latency: dict[str, _Histogram] = {}
        self.batches: dict[str, _Histogram] = {}
        self.model_seconds: dict[str, _Histogram] = {}

    def observe_request(self, path: str, method: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(path, method, status)] += 1
            self.latency.setdefault(path, _Histogram(LATENCY_BUCKETS)).observe(seconds)
            if status >= 400:
                self.errors[(path, str(status))] += 1

    def observe_batch(self, model: str, size: int, seconds: float = 0.0) -> None:
        with self._lock:
            self.batches.setdefault(model, _Histogram(BATCH_BUCKETS)).observe(size)
            self.model_seconds.setdefault(model, _Histogram(LATENCY_BUCKETS)).observe(seconds)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            lines += [
                "# HELP embforge_requests_total HTTP requests.",
                "# TYPE embforge_requests_total counter",
            ]
            for (path, method, status), n in sorted(self.requests.items()):
                lines.append(
                    f'embforge_requests_total{{path="{path}",method="{method}",status="{status}"}} {n}'
                )
            lines += [
                "# HELP embforge_errors_total Requests answered with 4xx/5xx.",
                "# TYPE embforge_errors_total counter",
            ]
            for (path, code), n in sorted(self.errors.items()):
                lines.append(f'embforge_errors_total{{path="{path}",status="{code}"}} {n}')
            lines += _histogram("embforge_request_latency_seconds", "Request latency.", "path", self.latency)
            lines += _histogram("embforge_batch_size", "Items per model call.", "model", self.batches)
            lines += _histogram(
                "embforge_model_seconds", "Seconds of one model call (a batch).", "model", self.model_seconds
            )
        return "\n".join(lines) + "\n"


def _histogram(name: str, help_text: str, label: str, series: dict[str, _Histogram]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for key, hist in sorted(series.items()):
        for bound, count in zip(hist.buckets, hist.counts):
            lines.append(f'{name}_bucket{{{label}="{key}",le="{bound:g}"}} {count}')
        lines.append(f'{name}_bucket{{{label}="{key}",le="+Inf"}} {hist.total}')
        lines.append(f'{name}_sum{{{label}="{key}"}} {hist.sum:.6f}')
        lines.append(f'{name}_count{{{label}="{key}"}} {hist.total}')
    return lines
