"""Issue #48: every model kind (dense, static, sparse, multi-vector) is served by the one guarded app — the same
auth, limits, text checks, queue and timeout, error format and metrics, whatever the kind."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import running
from tests.serve.tiny_kinds import KINDS, Case, app_for, build

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

JSON = {"content-type": "application/json"}
KEY = {"Authorization": "Bearer k"}
ENDPOINTS = [
    ("POST", "/v1/embeddings", {"input": "a cat"}),
    ("POST", "/search", {"query": "a cat"}),
    ("POST", "/index/documents", {"documents": [{"id": "a", "text": "a cat"}]}),
    ("POST", "/similarity", {"pairs": [["a cat", "a dog"]]}),
    ("POST", "/rerank", {"query": "a cat", "documents": ["a dog"]}),
    ("GET", "/v1/models", None),
    ("GET", "/metrics", None),
    ("GET", "/docs", None),
    ("GET", "/openapi.json", None),
]


@pytest.fixture(scope="module", params=KINDS)
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    return build(request.param, tmp_path_factory.mktemp(request.param))


def client(app: Any) -> Any:
    from fastapi.testclient import TestClient

    return TestClient(app, raise_server_exceptions=False)


def slow(app: Any, seconds: float) -> None:
    """Make every batch of the served model take ``seconds`` longer (whatever its kind)."""
    batcher = app.state.models.embedders["tiny"].batcher
    original = batcher.fn

    def held(items: list[Any]) -> Any:
        time.sleep(seconds)
        return original(items)

    batcher.fn = held


async def concurrently(app: Any, requests: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as http,
    ):
        return await asyncio.gather(*(http.post(path, json=body) for path, body in requests))


def test_every_endpoint_but_health_needs_the_key(case: Case) -> None:
    with client(app_for(case, api_key="k")) as http:
        for method, path, body in ENDPOINTS:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                response = http.request(method, path, json=body, headers=headers)
                assert response.status_code == 401, (case.kind, path, headers, response.text)
                assert response.json()["error"]["type"] == "authentication_error"
        assert http.get("/health").status_code == 200
        assert http.get("/v1/models", headers=KEY).status_code == 200
        assert http.post("/v1/embeddings", json={"input": "a cat"}, headers=KEY).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/embeddings", {"input": ["a " * 1100]}, 413, "body"),
        ("/v1/embeddings", {"input": ["a cat", "x" * 41]}, 413, "input[1]"),
        ("/v1/embeddings", {"input": ["a", "b", "c", "d"]}, 413, "input"),
        ("/v1/embeddings", {"input": ["a cat", " \u200b "]}, 422, "input[1]"),
        ("/v1/embeddings", b'{"input": ["a cat", "x\\ud800"]}', 422, "input[1]"),
        ("/v1/embeddings", {"input": "a cat", "model": "nope"}, 404, "model"),
        ("/similarity", {"pairs": [["a cat", "a"]], "model": "nope"}, 404, "model"),
        ("/index/documents", {"documents": []}, 422, "documents"),
        ("/index/documents", {"documents": [{"id": "a", "text": "  "}]}, 422, "documents[0]"),
        ("/index/documents", b'{"documents": [{"id": "a", "text": "\\udfff"}]}', 422, "documents[0].text"),
        ("/search", {"query": ["a cat", ""]}, 422, "query[1]"),
        ("/search", {"query": "x" * 41}, 413, "query[0]"),
    ],
)
def test_limits_and_bad_bodies_get_the_one_json_error(case: Case, path, body, status, param) -> None:
    app = app_for(case, max_body_bytes=2000, max_chars=40, max_inputs=3)
    with client(app) as http:
        if isinstance(body, bytes):
            response = http.post(path, content=body, headers=JSON)
        else:
            response = http.post(path, json=body)
        assert response.status_code == status, (case.kind, response.text)
        error = response.json()["error"]
        assert error["param"] == param and error["message"], error
        assert (
            http.post("/v1/embeddings", json={"input": "still serving", "model": "tiny"}).status_code == 200
        )
        metrics = http.get("/metrics").text
        assert f'embforge_errors_total{{path="{path}",status="{status}"}} 1' in metrics


def test_embeddings_index_and_search_answer_in_the_kinds_shape(case: Case) -> None:
    with client(app_for(case)) as http:
        listing = http.get("/v1/models").json()["data"]
        assert [m["id"] for m in listing] == ["tiny"]
        answer = http.post("/v1/embeddings", json={"input": ["a cat", "the dog"], "input_type": "query"})
        assert answer.status_code == 200 and [d["index"] for d in answer.json()["data"]] == [0, 1]
        assert answer.json()["model"] == "tiny" and answer.json()["usage"]["prompt_tokens"] > 0
        docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(["a cat", "the stock market", "a red car"])]
        assert http.post("/index/documents", json={"documents": docs}).json() == {"added": 3, "total": 3}
        found = http.post("/search", json={"query": ["a cat"], "top_k": 2}).json()["results"][0]["hits"]
        assert len(found) == 2 and {h["id"] for h in found} <= {"d0", "d1", "d2"}
        assert all("text" in h for h in found)
        pairs = http.post("/similarity", json={"pairs": [["a cat", "a cat"], ["a cat", "a red car"]]})
        assert pairs.status_code == 200 and len(pairs.json()["scores"]) == 2
        health = http.get("/health").json()
        assert health["documents"] == 3 and health["model"] == "tiny"


def test_concurrent_adds_of_the_same_ids_store_them_once(case: Case) -> None:
    app = app_for(case, max_batch_size=2, max_wait_ms=0)
    slow(app, 0.02)
    docs = [{"id": f"d{i}", "text": f"a cat {i}"} for i in range(10)]
    responses = asyncio.run(concurrently(app, [("/index/documents", {"documents": docs})] * 4))
    assert sorted(r.status_code for r in responses) == [200, 409, 409, 409], [r.text for r in responses]
    conflict = next(r for r in responses if r.status_code == 409).json()["error"]
    assert conflict["param"].startswith("documents[") and conflict["param"].endswith("].id")
    assert len(app.state.store) == 10


def test_a_full_queue_gets_429_and_a_slow_model_503(case: Case) -> None:
    app = app_for(case, max_batch_size=1, max_queue=2, max_wait_ms=0)
    slow(app, 0.3)
    responses = asyncio.run(concurrently(app, [("/v1/embeddings", {"input": "a cat"})] * 6))
    codes = sorted(r.status_code for r in responses)
    assert codes[0] == 200 and 429 in codes, [r.text for r in responses]
    refused = next(r for r in responses if r.status_code == 429).json()["error"]
    assert refused["type"] == "overloaded" and refused["param"] == "model"
    late = app_for(case, request_timeout_s=0.05)
    slow(late, 0.5)
    (timed_out,) = asyncio.run(concurrently(late, [("/v1/embeddings", {"input": "a cat"})]))
    assert timed_out.status_code == 503 and timed_out.json()["error"]["type"] == "timeout"


def test_a_lone_surrogate_is_a_json_422_and_the_connection_stays_open(case: Case) -> None:
    pytest.importorskip("uvicorn")
    from embforge.serve.config import ServeConfig

    app = app_for(case)
    with running(app, ServeConfig()) as (port, _):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/v1/embeddings", body=b'{"input": "a \\ud800 cat"}', headers=JSON)
        bad = conn.getresponse()
        assert bad.status == 422 and bad.getheader("content-type") == "application/json"
        assert json.loads(bad.read())["error"]["param"] == "input[0]"
        assert bad.getheader("connection", "").lower() != "close"
        conn.request("POST", "/v1/embeddings", body=b'{"input": "a cat"}', headers=JSON)
        again = conn.getresponse()
        assert again.status == 200 and again.read()
        conn.close()


@pytest.mark.parametrize("kind", ["sparse", "multivector"])
@pytest.mark.parametrize(
    ("body", "param", "said"),
    [
        ({"dimensions": 8}, "dimensions", "cannot be truncated"),
        ({"encoding_format": "int8"}, "encoding_format", "int8"),
        ({"encoding_format": "binary"}, "encoding_format", "binary"),
    ],
)
def test_what_a_kind_cannot_honour_is_a_422_naming_the_field(kind, body, param, said, tmp_path: Path) -> None:
    case = build(kind, tmp_path)
    with client(app_for(case)) as http:
        response = http.post("/v1/embeddings", json={"input": "a cat", **body})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == param and said in error["message"] and kind in error["message"], error


def test_a_sparse_vector_has_no_base64_form_and_token_vectors_do(tmp_path: Path) -> None:
    import base64

    import numpy as np

    with client(app_for(build("sparse", tmp_path))) as http:
        refused = http.post("/v1/embeddings", json={"input": "a cat", "encoding_format": "base64"})
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "encoding_format"
    colbert = build("multivector", tmp_path).model
    with client(app_for(Case("multivector", colbert))) as http:
        item = http.post("/v1/embeddings", json={"input": "a cat", "encoding_format": "base64"}).json()
        got = np.frombuffer(base64.b64decode(item["data"][0]["embedding"]), dtype="<f4")
        expected = colbert.encode(["a cat"])[0]
        assert item["data"][0]["tokens"] == len(expected)
        np.testing.assert_allclose(got.reshape(expected.shape), expected, atol=1e-6)


def test_input_type_picks_a_dense_models_query_or_document_prompt(tmp_path: Path) -> None:
    import numpy as np

    case = build("dense", tmp_path)
    case.model.prompts = {"query": "query: ", "document": "passage: "}
    with client(app_for(case)) as http:
        for input_type, prompt in (("query", "query: "), ("document", "passage: ")):
            body = {"input": ["a cat"], "input_type": input_type}
            got = http.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
            np.testing.assert_allclose(got, case.model.encode([prompt + "a cat"])[0], atol=1e-5)
        plain = http.post("/v1/embeddings", json={"input": ["a cat"]}).json()["data"][0]["embedding"]
        np.testing.assert_allclose(plain, case.model.encode(["a cat"])[0], atol=1e-5)


def test_index_kind_plaid_reaches_the_multi_vector_store(tmp_path: Path, monkeypatch) -> None:
    uvicorn = pytest.importorskip("uvicorn")
    import embforge.serve.runner as runner
    from embforge.cli import main

    colbert = build("multivector", tmp_path).model
    apps: list[Any] = []
    monkeypatch.setattr(runner, "load_encoder", lambda *args, **kwargs: colbert)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *args: apps.append(self.config.app))
    assert main(["serve", "--model", "colbert", "--index-kind", "plaid"]) == 0
    assert apps[0].state.store.kind == "plaid"
    assert main(["serve", "--model", "colbert", "--index-kind", "hnsw"]) == 2


def test_a_server_holding_several_kinds_routes_each_request_to_its_model(tmp_path: Path) -> None:
    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    dense, sparse = build("dense", tmp_path).model, build("sparse", tmp_path).model
    app = create_app({"dense": dense, "splade": sparse}, config=ServeConfig(max_wait_ms=1))
    with client(app) as http:
        kinds = {m["id"]: m["kind"] for m in http.get("/v1/models").json()["data"]}
        assert kinds == {"dense": "embedding", "splade": "sparse"}
        vector = http.post("/v1/embeddings", json={"input": "a cat", "model": "dense"}).json()
        assert len(vector["data"][0]["embedding"]) == dense.dim
        terms = http.post("/v1/embeddings", json={"input": "a cat", "model": "splade"}).json()
        assert set(terms["data"][0]["embedding"]) == {"indices", "values", "dim"}
