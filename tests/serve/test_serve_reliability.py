"""Issue #15 (server side): one bad text never fails other users' requests, a bad document never jams the
store, concurrent adds of one id give exactly one 200, and /rerank names the reranker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import make_tokenizer, slow_down, tiny_bert_config

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

JSON = {"content-type": "application/json"}


def app_for(model, **kwargs):
    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    config = kwargs.pop("config", None) or ServeConfig(model_name="tiny", max_wait_ms=1)
    return create_app(model, config=config, **kwargs)


def client_for(model, **kwargs):
    from fastapi.testclient import TestClient

    return TestClient(app_for(model, **kwargs), raise_server_exceptions=False)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", b'{"input": "x\\ud800"}', "input[0]"),
        ("/v1/embeddings", b'{"input": ["the cat", "a \\udfff dog"]}', "input[1]"),
        ("/similarity", b'{"pairs": [["a", "b"], ["c", "\\ud83d"]]}', "pairs[1][1]"),
        ("/search", b'{"query": ["ok", "\\udc00"]}', "query[1]"),
        ("/index/documents", b'{"documents": [{"id": "a\\ud800", "text": "t"}]}', "documents[0].id"),
        ("/index/documents", b'{"documents": [{"id": "a", "text": "\\ud800"}]}', "documents[0].text"),
        (
            "/index/documents",
            b'{"documents": [{"id": "a", "text": "t"}, {"id": "b", "text": "t", "fields": {"k": ["x", "\\ud800"]}}]}',
            "documents[1].fields.k[1]",
        ),
        (
            "/index/documents",
            b'{"documents": [{"id": "a", "text": "t", "fields": {"n": NaN}}]}',
            "documents[0].fields.n",
        ),
    ],
)
def test_a_lone_surrogate_or_nan_gets_a_422_naming_the_field(tiny_encoder, path, body, param):
    from embforge.serve.store import DocumentStore

    with client_for(tiny_encoder, store=DocumentStore(tiny_encoder.dim)) as client:
        response = client.post(path, content=body, headers=JSON)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == param and param in error["message"]
        assert client.post("/v1/embeddings", json={"input": "still serving"}).status_code == 200


def test_a_good_surrogate_pair_is_one_character_and_is_served(tiny_encoder):
    with client_for(tiny_encoder) as client:
        response = client.post("/v1/embeddings", content=b'{"input": "a \\ud83d\\ude00 cat"}', headers=JSON)
        assert response.status_code == 200


def test_one_failing_request_in_a_merged_batch_fails_alone():
    from embforge.serve.batcher import MicroBatcher

    calls: list[int] = []

    def fn(items):
        calls.append(len(items))
        time.sleep(0.01)
        if "poison" in items:
            raise RuntimeError("the model cannot take 'poison'")
        return np.array([[len(x)] for x in items])

    async def main():
        batcher = MicroBatcher(fn, max_batch_size=64, max_wait_ms=50)
        batcher.start()
        await asyncio.gather(batcher.submit(["warm"]), batcher.submit(["up"]))  # later batches wait to merge
        requests = [["a", "bb"], ["ccc"], ["poison", "dd"], ["eeee"], ["f"], ["gg", "h"]]
        results = await asyncio.gather(*(batcher.submit(r) for r in requests), return_exceptions=True)
        await batcher.stop()
        return requests, results

    requests, results = asyncio.run(main())
    assert max(calls) > 3  # the requests were merged into one batch first
    for request, result in zip(requests, results):
        if "poison" in request:
            assert isinstance(result, RuntimeError) and "poison" in str(result)
        else:
            assert not isinstance(result, BaseException), result
            assert result[:, 0].tolist() == [len(x) for x in request]


def test_a_model_error_under_load_fails_only_the_request_that_caused_it(tiny_encoder):
    """Real app, concurrent clients: one request's text makes the model raise; everyone else gets 200."""
    original = tiny_encoder.embed_ids
    poison = tiny_encoder.tokenize_ids(["oil price falls"])[0]

    def picky(ids, **kwargs):
        time.sleep(0.02)  # let requests pile up and merge
        if any(list(x) == list(poison) for x in ids):
            raise RuntimeError("cannot embed this text")
        return original(ids, **kwargs)

    tiny_encoder.embed_ids = picky
    from embforge.serve.config import ServeConfig

    app = app_for(tiny_encoder, config=ServeConfig(max_wait_ms=20))

    async def main():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t") as http,
        ):
            texts = ["a man plays the guitar", "the cat", "oil price falls", "a red car"] * 6
            return texts, await asyncio.gather(
                *(http.post("/v1/embeddings", json={"input": t}) for t in texts)
            )

    texts, responses = asyncio.run(main())
    for text, response in zip(texts, responses):
        expected = 500 if text == "oil price falls" else 200
        assert response.status_code == expected, (text, response.text)


def test_a_document_the_store_cannot_keep_does_not_jam_it(tiny_encoder, tmp_path: Path):
    from embforge.serve.store import DocumentStore

    folder = tmp_path / "docs"
    with client_for(tiny_encoder, store=DocumentStore.open(folder, dim=tiny_encoder.dim)) as client:
        bad = client.post(
            "/index/documents",
            content=b'{"documents": [{"id": "x", "text": "the cat", "fields": {"k": "\\ud800"}}]}',
            headers=JSON,
        )
        assert bad.status_code == 422
        ok = client.post("/index/documents", json={"documents": [{"id": "y", "text": "a red car"}]})
        assert ok.status_code == 200 and ok.json() == {"added": 1, "total": 1}
        retry = client.post("/index/documents", json={"documents": [{"id": "x", "text": "the cat"}]})
        assert retry.status_code == 200 and retry.json()["total"] == 2
        assert client.post("/search", json={"query": "the cat", "top_k": 5}).status_code == 200
    reopened = DocumentStore.open(folder, dim=tiny_encoder.dim)
    assert sorted(reopened.docs) == ["x", "y"]


def test_concurrent_adds_of_one_id_give_exactly_one_200_and_the_rest_409(tiny_encoder, tmp_path: Path):
    from embforge.serve.store import DocumentStore

    slow_down(tiny_encoder, 0.02)
    store = DocumentStore.open(tmp_path / "docs", dim=tiny_encoder.dim)
    from embforge.serve.config import ServeConfig

    app = app_for(tiny_encoder, store=store, config=ServeConfig(max_batch_size=1, max_wait_ms=0))

    async def main():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t") as http,
        ):
            body = {"documents": [{"id": "same", "text": "the cat"}]}
            return await asyncio.gather(*(http.post("/index/documents", json=body) for _ in range(8)))

    responses = asyncio.run(main())
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] + [409] * 7, [r.text for r in responses]
    conflict = next(r for r in responses if r.status_code == 409).json()["error"]
    assert conflict["param"] == "documents[0].id" and "'same'" in conflict["message"]
    assert len(store) == 1


def test_rerank_reports_the_reranker_name(tiny_encoder):
    import torch
    from transformers import BertForSequenceClassification

    from embforge.cross_encoder import CrossEncoder
    from embforge.serve.config import ServeConfig

    tokenizer = make_tokenizer()
    torch.manual_seed(1)
    config = tiny_bert_config(len(tokenizer), num_hidden_layers=1, num_labels=1, max_position_embeddings=512)
    ce = CrossEncoder(BertForSequenceClassification(config), tokenizer, max_seq_length=64).eval()
    cfg = ServeConfig(model_name="my-embedder", reranker_name="my-reranker", max_wait_ms=1)
    with client_for(tiny_encoder, reranker=ce, config=cfg) as client:
        body = client.post("/rerank", json={"query": "q", "documents": ["a", "b"]}).json()
        assert body["model"] == "my-reranker"
        assert client.post("/v1/embeddings", json={"input": "a"}).json()["model"] == "my-embedder"


def test_framework_errors_are_json_errors_too(tiny_encoder):
    """Found by the schemathesis run: a body that is not UTF-8 got FastAPI's {"detail": ...}, not our error."""
    with client_for(tiny_encoder) as client:
        bad = client.post("/v1/embeddings", content=b"\xa6J\xa1\xdb", headers=JSON)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "body"
        assert "UTF-8" in bad.json()["error"]["message"]
        assert client.get("/nowhere").json()["error"]["message"] == "Not Found"
        wrong = client.get("/v1/embeddings")
        assert wrong.status_code == 405 and wrong.json()["error"]["message"] == "Method Not Allowed"
