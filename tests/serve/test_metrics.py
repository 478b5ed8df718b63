"""``/metrics`` (issue #50): the metric names, types, labels and counts a scraper relies on, each app's own
figures (several apps in one process), and the process metrics beside them."""

from __future__ import annotations

import math
import re
import sys
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
LATENCY = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, math.inf]
BATCH = [1, 2, 4, 8, 16, 32, 64, 128, 256, math.inf]


def scrape(text: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str], float]]]:
    """``({family: type}, [(sample name, labels, value)])`` of a text exposition (0.0.4), strictly read."""
    types: dict[str, str] = {}
    samples = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match, f"not an exposition line: {line!r}"
            labels = dict(_LABEL.findall(match.group(2) or ""))
            samples.append((match.group(1), labels, float(match.group(3))))
    return types, samples


def value(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float | None:
    found = [v for n, got, v in samples if n == name and got == labels]
    assert len(found) <= 1, (name, labels)
    return found[0] if found else None


def buckets(samples: list[Any], name: str, **labels: str) -> list[tuple[float, float]]:
    """``[(le, cumulative count)]`` of one histogram series, by bound."""
    rows = [
        (float(got["le"]), v)
        for n, got, v in samples
        if n == f"{name}_bucket" and {k: x for k, x in got.items() if k != "le"} == labels
    ]
    return sorted(rows)


def app(tiny_encoder: Any, **limits: Any) -> Any:
    from fastapi.testclient import TestClient

    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    return TestClient(
        create_app(tiny_encoder, config=ServeConfig(model_name="tiny", max_wait_ms=1, **limits))
    )


def test_metric_names_types_labels_and_counts(tiny_encoder) -> None:
    with app(tiny_encoder, max_inputs=3) as client:
        for body in ({"input": "a cat"}, {"input": ["a dog", "the dog", "a bird"]}):
            assert client.post("/v1/embeddings", json=body).status_code == 200
        assert client.post("/v1/embeddings", json={"input": ["a"] * 4}).status_code == 413
        assert client.get("/nowhere").status_code == 404
        assert client.get("/health").status_code == 200
        reply = client.get("/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    types, samples = scrape(reply.text)
    assert {
        "embforge_requests_total": "counter",
        "embforge_errors_total": "counter",
        "embforge_request_latency_seconds": "histogram",
        "embforge_batch_size": "histogram",
        "embforge_model_seconds": "histogram",
    }.items() <= types.items()

    requests = "embforge_requests_total"
    assert value(samples, requests, path="/v1/embeddings", method="POST", status="200") == 2
    assert value(samples, requests, path="/v1/embeddings", method="POST", status="413") == 1
    assert value(samples, requests, path="other", method="GET", status="404") == 1  # unknown paths pooled
    assert value(samples, requests, path="/health", method="GET", status="200") == 1
    assert value(samples, "embforge_errors_total", path="/v1/embeddings", status="413") == 1
    assert value(samples, "embforge_errors_total", path="other", status="404") == 1
    assert value(samples, "embforge_errors_total", path="/health", status="200") is None

    latency = buckets(samples, "embforge_request_latency_seconds", path="/v1/embeddings")
    assert [le for le, _ in latency] == LATENCY
    counts = [n for _, n in latency]
    assert counts == sorted(counts) and counts[-1] == 3  # cumulative; +Inf holds every request
    assert value(samples, "embforge_request_latency_seconds_count", path="/v1/embeddings") == 3
    batch = buckets(samples, "embforge_batch_size", model="embedding")
    assert [le for le, _ in batch] == BATCH
    assert [n for le, n in batch if le in (1, 2, 4)] == [1, 1, 2]  # a batch of 1, a batch of 3
    assert value(samples, "embforge_batch_size_sum", model="embedding") == 4
    assert value(samples, "embforge_model_seconds_count", model="embedding") == 2
    model_time = value(samples, "embforge_model_seconds_sum", model="embedding")
    total = value(samples, "embforge_request_latency_seconds_sum", path="/v1/embeddings")
    assert model_time is not None and total is not None and 0 < model_time < total


def test_each_app_counts_its_own_requests(tiny_encoder) -> None:
    with app(tiny_encoder) as first, app(tiny_encoder) as second:
        for _ in range(3):
            assert first.get("/health").status_code == 200
        assert second.get("/health").status_code == 200
        _, one = scrape(first.get("/metrics").text)
        _, two = scrape(second.get("/metrics").text)
    assert value(one, "embforge_requests_total", path="/health", method="GET", status="200") == 3
    assert value(two, "embforge_requests_total", path="/health", method="GET", status="200") == 1


def test_process_metrics_and_a_standard_parser_reads_it(tiny_encoder) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    with app(tiny_encoder) as client:
        assert client.get("/health").status_code == 200
        text = client.get("/metrics").text
    families = {family.name: family.type for family in parser.text_string_to_metric_families(text)}
    assert families["embforge_requests"] == "counter" and families["embforge_batch_size"] == "histogram"
    assert families["python_info"] == "gauge" and "python_gc_collections" in families
    if sys.platform.startswith("linux"):  # prometheus_client reads /proc
        assert families["process_cpu_seconds"] == "counter"
        assert families["process_resident_memory_bytes"] == "gauge"
