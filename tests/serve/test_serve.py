"""The server: OpenAI shape and parity with encode(), rerank vs CrossEncoder.predict, search + persistence,
limits and errors, auth, metrics, micro-batching, and a real uvicorn on loopback with graceful shutdown."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import (
    fail_batches_of,
    free_port,
    make_tokenizer,
    slow_down,
    start_uvicorn,
    tiny_bert_config,
)

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

TEXTS = ["a man plays the guitar", "the cat", "a woman is reading a small red book .", "oil price falls"]
DOCS = [
    {"id": "d1", "text": "a man plays the guitar", "fields": {"lang": "en"}},
    {"id": "d2", "text": "the stock market rises", "fields": {"n": 2}},
    {"id": "d3", "text": "a child kicks the ball in the park"},
    {"id": "d4", "text": "the woman sings a song"},
]


def client_for(model, **kwargs):
    from fastapi.testclient import TestClient

    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    config = kwargs.pop("config", None) or ServeConfig(model_name="tiny", max_wait_ms=1)
    return TestClient(create_app(model, config=config, **kwargs))


def test_embeddings_have_openai_shape_and_equal_encode(tiny_encoder):
    with client_for(tiny_encoder) as client:
        response = client.post("/v1/embeddings", json={"input": TEXTS, "model": "tiny"})
        assert response.status_code == 200
        body = response.json()
        assert body["object"] == "list" and body["model"] == "tiny"
        assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]
        assert all(d["object"] == "embedding" for d in body["data"])
        tokens = sum(len(ids) for ids in tiny_encoder.tokenize_ids(TEXTS))
        assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
        got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, tiny_encoder.encode(TEXTS), atol=1e-5)

        one = client.post(
            "/v1/embeddings", json={"input": "the cat", "dimensions": 8, "encoding_format": "base64"}
        )
        vec = np.frombuffer(base64.b64decode(one.json()["data"][0]["embedding"]), dtype="<f4")
        np.testing.assert_allclose(vec, tiny_encoder.encode("the cat", dim=8), atol=1e-5)


def test_bad_requests_get_4xx_json_naming_the_field_and_the_server_keeps_serving(tiny_encoder):
    from embforge.serve.config import ServeConfig

    config = ServeConfig(model_name="tiny", max_inputs=3, max_chars=40, max_body_bytes=2000, max_wait_ms=1)
    with client_for(tiny_encoder, config=config) as client:
        cases = [
            ({"input": ["a", "b", "c", "d"]}, 413, "input"),
            ({"input": ["ok", "x" * 41]}, 413, "input[1]"),
            ({"input": 5}, 422, "input"),
            ({"input": []}, 422, "input"),
            ({"input": "a", "dimensions": 0}, 422, "dimensions"),
            ({"input": "a", "encoding_format": "hex"}, 422, "encoding_format"),
            ({"model": "tiny"}, 422, "input"),
        ]
        for payload, status, param in cases:
            response = client.post("/v1/embeddings", json=payload)
            assert response.status_code == status, payload
            assert response.json()["error"]["param"] == param, payload
            assert param in response.json()["error"]["message"]
        malformed = client.post(
            "/v1/embeddings", content=b'{"input": [', headers={"content-type": "application/json"}
        )
        assert malformed.status_code == 422 and "not valid JSON" in malformed.json()["error"]["message"]
        huge = client.post("/v1/embeddings", json={"input": ["word " * 500]})
        assert huge.status_code == 413 and huge.json()["error"]["param"] == "body"
        assert client.post("/v1/embeddings", json={"input": "still serving"}).status_code == 200
        metrics = client.get("/metrics").text
        assert 'embforge_errors_total{path="/v1/embeddings",status="413"} 3' in metrics
        # prometheus_client writes labels in name order
        assert 'embforge_requests_total{method="POST",path="/v1/embeddings",status="200"} 1.0' in metrics
        assert 'embforge_batch_size_count{model="embedding"} 1' in metrics
        assert 'embforge_model_seconds_count{model="embedding"} 1' in metrics  # where a request's time went
        model_time = float(metrics.split('embforge_model_seconds_sum{model="embedding"} ')[1].split()[0])
        latency = float(
            metrics.split('embforge_request_latency_seconds_sum{path="/v1/embeddings"} ')[1].split()[0]
        )
        assert 0 < model_time < latency
        assert "embforge_request_latency_seconds_bucket" in metrics


def test_api_key(tiny_encoder):
    from embforge.serve.config import ServeConfig

    with client_for(tiny_encoder, config=ServeConfig(api_key="s3cret", max_wait_ms=1)) as client:
        missing = client.post("/v1/embeddings", json={"input": "a cat"})
        wrong = client.post(
            "/v1/embeddings", json={"input": "a cat"}, headers={"Authorization": "Bearer nope"}
        )
        right = client.post(
            "/v1/embeddings", json={"input": "a cat"}, headers={"Authorization": "Bearer s3cret"}
        )
        assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
        assert missing.json()["error"]["type"] == "authentication_error"
        assert client.get("/metrics").status_code == 401
        assert client.get("/health").status_code == 200


def test_rerank_order_equals_cross_encoder_predict(tiny_encoder):
    import torch
    from transformers import BertForSequenceClassification

    from embforge.cross_encoder import CrossEncoder

    tokenizer = make_tokenizer()
    torch.manual_seed(1)
    config = tiny_bert_config(len(tokenizer), num_labels=1, max_position_embeddings=512)
    ce = CrossEncoder(BertForSequenceClassification(config), tokenizer, max_seq_length=64).eval()
    docs = [d["text"] for d in DOCS] + TEXTS
    expected = ce.predict([("a man with a guitar", d) for d in docs])
    with client_for(tiny_encoder, reranker=ce) as client:
        body = client.post(
            "/rerank",
            json={"query": "a man with a guitar", "documents": docs, "top_n": 5, "return_documents": True},
        ).json()
        assert [r["index"] for r in body["results"]] == list(np.argsort(-expected, kind="stable")[:5])
        np.testing.assert_allclose(
            [r["relevance_score"] for r in body["results"]], np.sort(expected)[::-1][:5], atol=1e-5
        )
        assert body["results"][0]["document"]["text"] == docs[body["results"][0]["index"]]
        tei = client.post("/rerank", json={"query": "q", "texts": ["a", "b"]}).json()
        assert sorted(r["index"] for r in tei["results"]) == [0, 1]
    with client_for(tiny_encoder) as client:
        assert client.post("/rerank", json={"query": "q", "documents": ["a"]}).status_code == 501


def test_similarity_is_cosine_of_encode(tiny_encoder):
    pairs = [["a man plays the guitar", "the cat"], ["oil price falls", "oil price falls"]]
    with client_for(tiny_encoder) as client:
        scores = client.post("/similarity", json={"pairs": pairs}).json()["scores"]
    emb = tiny_encoder.encode([t for p in pairs for t in p], normalize=True)
    np.testing.assert_allclose(scores, [emb[0] @ emb[1], emb[2] @ emb[3]], atol=1e-5)
    assert scores[1] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("kind", ["exact", "qdrant"])
def test_search_finds_documents_by_their_text_and_survives_a_restart(tiny_encoder, tmp_path: Path, kind: str):
    if kind == "qdrant":
        pytest.importorskip("qdrant_client")
    from embforge.serve.store import DocumentStore

    folder = tmp_path / "index"
    store = DocumentStore.open(folder, dim=tiny_encoder.dim, kind=kind)
    with client_for(tiny_encoder, store=store) as client:
        added = client.post("/index/documents", json={"documents": DOCS})
        assert added.json() == {"added": 4, "total": 4}
        dup = client.post(
            "/index/documents", json={"documents": [{"id": "d9", "text": "x"}, {"id": "d2", "text": "y"}]}
        )
        assert dup.status_code == 409 and dup.json()["error"]["param"] == "documents[1].id"
        body = client.post("/search", json={"query": [d["text"] for d in DOCS], "top_k": 2}).json()
        assert [r["hits"][0]["id"] for r in body["results"]] == ["d1", "d2", "d3", "d4"]
        assert body["results"][0]["hits"][0]["fields"] == {"lang": "en"}
        assert body["results"][0]["hits"][0]["score"] == pytest.approx(1.0, abs=1e-5)
    # the lifespan closed (and saved) the store; a new server on the same folder sees the documents
    reopened = DocumentStore.open(folder, dim=tiny_encoder.dim)
    assert reopened.kind == kind and len(reopened) == 4
    with client_for(tiny_encoder, store=reopened) as client:
        hit = client.post("/search", json={"query": "the stock market rises", "top_k": 1}).json()
        assert hit["results"][0]["hits"][0] == {
            "id": "d2",
            "score": pytest.approx(1.0, abs=1e-5),
            "text": "the stock market rises",
            "fields": {"n": 2},
        }
        assert client.get("/health").json()["documents"] == 4


def test_micro_batcher_merges_concurrent_requests():
    from embforge.serve.batcher import MicroBatcher

    calls: list[int] = []

    def fn(items):
        calls.append(len(items))
        time.sleep(0.02)
        return np.array([[x * 10] for x in items])

    async def main():
        batcher = MicroBatcher(fn, max_batch_size=8, max_wait_ms=50)
        batcher.start()
        results = await asyncio.gather(*(batcher.submit([i, i + 100]) for i in range(6)))
        await batcher.stop()
        return results

    results = asyncio.run(main())
    for i, rows in enumerate(results):
        assert rows[:, 0].tolist() == [i * 10, (i + 100) * 10]
    assert calls == [8, 4]  # 6 requests of 2 items -> one full batch of 8, then the rest


def test_micro_batcher_waits_only_while_requests_come_concurrently():
    from embforge.serve.batcher import MicroBatcher

    calls: list[int] = []

    def fn(items):
        calls.append(len(items))
        return np.array([[x] for x in items])

    async def main():
        batcher = MicroBatcher(fn, max_batch_size=8, max_wait_ms=300)
        batcher.start()
        lone = []
        for i in range(3):  # one client, one request at a time: no 300 ms wait for company
            started = time.perf_counter()
            await batcher.submit([i])
            lone.append(time.perf_counter() - started)
        await asyncio.gather(*(batcher.submit([i]) for i in range(4)))  # a burst merges...
        started = time.perf_counter()
        burst_then = asyncio.gather(batcher.submit([7]))
        await asyncio.sleep(0.05)
        await asyncio.gather(burst_then, batcher.submit([8]))  # ...and the next one waits for company
        waited = time.perf_counter() - started
        await batcher.stop()
        return lone, waited

    lone, waited = asyncio.run(main())
    assert max(lone) < 0.2
    assert calls[:3] == [1, 1, 1] and calls[3] == 4
    assert calls[4:] == [2] and waited >= 0.05


def test_real_uvicorn_on_loopback_with_graceful_shutdown(tiny_encoder, tmp_path: Path):
    import httpx
    import uvicorn

    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig
    from embforge.serve.store import DocumentStore

    slow_down(tiny_encoder, 0.3)
    store = DocumentStore.open(tmp_path / "index", dim=tiny_encoder.dim)
    app = create_app(tiny_encoder, store=store, config=ServeConfig(api_key="k", max_wait_ms=20))
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=10)
    )
    thread = start_uvicorn(server)
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": "Bearer k"}

    async def clients():
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=20) as http:
            added = await http.post("/index/documents", json={"documents": DOCS})
            assert added.status_code == 200
            responses = await asyncio.gather(*(http.post("/v1/embeddings", json={"input": t}) for t in TEXTS))
            return [r.json()["data"][0]["embedding"] for r in responses]

    vectors = asyncio.run(clients())
    np.testing.assert_allclose(np.array(vectors, dtype=np.float32), tiny_encoder.encode(TEXTS), atol=1e-5)

    # a request in flight when shutdown starts still gets its answer
    result: dict = {}

    def in_flight():
        result["response"] = httpx.post(
            f"{base}/v1/embeddings", json={"input": TEXTS}, headers=headers, timeout=20
        )

    worker = threading.Thread(target=in_flight)
    worker.start()
    deadline = time.time() + 10
    while not server.server_state.tasks and time.time() < deadline:  # the request is being served
        time.sleep(0.01)
    server.should_exit = True
    worker.join(20)
    thread.join(20)
    assert not thread.is_alive()
    assert result["response"].status_code == 200 and len(result["response"].json()["data"]) == 4
    assert len(DocumentStore.open(tmp_path / "index", dim=tiny_encoder.dim)) == 4


def test_onnx_backend_serves_the_same_vectors_as_its_encode(tiny_model_dir: Path, tmp_path: Path):
    pytest.importorskip("onnxruntime")
    from embforge.encoder import Encoder
    from embforge.onnx.export import export_onnx

    export_onnx(tiny_model_dir, tmp_path / "onnx", parity_texts=TEXTS)
    model = Encoder.load(tmp_path / "onnx", backend="onnx")
    with client_for(model) as client:
        body = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 16}).json()
        assert client.get("/health").json()["backend"] == "onnx"
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, model.encode(TEXTS, dim=16), atol=1e-5)
    np.testing.assert_allclose(got, Encoder.load(tiny_model_dir).encode(TEXTS, dim=16), atol=1e-5)


def test_a_failing_model_call_gives_a_json_500_and_the_server_keeps_serving(tiny_encoder):
    from fastapi.testclient import TestClient

    from embforge.serve.app import create_app

    fail_batches_of(tiny_encoder, 3)  # a model call that fails: 'out of memory'
    with TestClient(create_app(tiny_encoder), raise_server_exceptions=False) as client:
        failed = client.post("/v1/embeddings", json={"input": TEXTS[:3]})
        assert failed.status_code == 500 and "out of memory" in failed.json()["error"]["message"]
        assert client.post("/v1/embeddings", json={"input": TEXTS}).status_code == 200


def test_cli_serve_passes_its_options_to_the_server(monkeypatch: pytest.MonkeyPatch):
    import embforge.serve.runner as runner
    from embforge.cli import main

    seen: dict = {}
    monkeypatch.setattr(runner, "serve", lambda model, **kwargs: seen.update(model=model, **kwargs))
    argv = [
        "serve",
        "--model",
        "m",
        "--index",
        "idx",
        "--index-kind",
        "qdrant",
        "--qdrant-url",
        "http://q:6333",
    ]
    assert main([*argv, "--api-key", "k", "--max-batch-size", "8", "--truncate"]) == 0
    assert seen["model"] == "m" and seen["index_kind"] == "qdrant"
    assert seen["index_options"] == {"url": "http://q:6333"} and seen["allow_model_mismatch"] is False
    assert seen["host"] == "127.0.0.1" and seen["port"] == 8080
    config = seen["config"]
    assert (config.api_key, config.max_batch_size, config.truncate) == ("k", 8, True)
    assert (config.header_timeout_s, config.max_connections, config.reranker_name) == (10.0, 1024, None)
