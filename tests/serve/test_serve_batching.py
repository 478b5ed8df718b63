"""Token-budget batching (the batches the model receives), several models in one server (routing, /v1/models,
one model's overload never failing another's requests)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from tests.conftest import make_bert, make_cross_encoder, make_tokenizer, tiny_bert_config

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")


def long_encoder(seed: int = 0):
    """A tiny random BERT that takes 512-token texts."""
    from transformers import BertModel

    from embforge.encoder import Encoder

    tokenizer = make_tokenizer()
    import torch

    torch.manual_seed(seed)
    config = tiny_bert_config(len(tokenizer), num_hidden_layers=1, max_position_embeddings=512)
    return Encoder(BertModel(config), tokenizer, pooling="mean", max_seq_length=512)


class Gate:
    """Wraps a model's ``embed_ids``: records the token lengths of every batch; the first call waits for
    ``release()`` (so that the requests sent meanwhile queue up and arrive at the batcher together)."""

    def __init__(self, model) -> None:
        self.original = model.embed_ids
        self.batches: list[list[int]] = []
        self.opened = threading.Event()
        self.entered = threading.Event()
        model.embed_ids = self

    def __call__(self, ids, **kwargs):
        self.entered.set()
        self.opened.wait(30)
        self.batches.append([len(x) for x in ids])
        return self.original(ids, **kwargs)

    def release(self) -> None:
        self.opened.set()

    async def busy(self) -> None:
        """Wait until the model is inside its first (held) call."""
        await asyncio.to_thread(self.entered.wait, 30)


async def wait_queued(app, name: str, n: int) -> None:
    served = app.state.models.embedders[name]
    for _ in range(3000):
        if served.batcher.queued >= n:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"{served.batcher.queued} items queued, expected {n}")


def test_one_long_text_does_not_pad_63_short_ones():
    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    model = long_encoder()
    gate = Gate(model)
    config = ServeConfig(model_name="m", max_batch_size=64, max_batch_tokens=4096, max_wait_ms=1)
    app = create_app(model, config=config)
    long_text = " ".join(["cat"] * 600)  # cut to 512 tokens
    short = [f"a man plays the {w}" for w in ("guitar", "piano", "flute")] * 21

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as http,
        ):
            warm = asyncio.ensure_future(http.post("/v1/embeddings", json={"input": "warm up"}))
            await gate.busy()  # the model is now busy with the warm-up request (held by the gate)
            sent = [http.post("/v1/embeddings", json={"input": t}) for t in [long_text, *short]]
            requests = [asyncio.ensure_future(r) for r in sent]
            await wait_queued(app, "m", 64)
            gate.release()
            return await warm, await asyncio.gather(*requests)

    warm, responses = asyncio.run(main())
    assert warm.status_code == 200 and all(r.status_code == 200 for r in responses)
    short_len = len(model.tokenize_ids([short[0]])[0])
    assert gate.batches[0] == [len(model.tokenize_ids(["warm up"])[0])]
    # the 63 short texts arrived with the long one and form their own batch, before it; the long one runs alone
    assert gate.batches[1:] == [[short_len] * 63, [512]]
    for batch in gate.batches:
        assert max(batch) * len(batch) <= config.max_batch_tokens or len(batch) == 1
    vectors = np.array([r.json()["data"][0]["embedding"] for r in responses], dtype=np.float32)
    np.testing.assert_allclose(vectors, model.encode([long_text, *short]), atol=1e-4)


def test_a_count_only_batcher_would_have_padded_them_together():
    """The same arrival with the token budget lifted: one batch of 64 texts, all padded to 512 (the contrast)."""
    from embforge.serve.batcher import MicroBatcher

    batches: list[list[int]] = []

    def fn(items):
        batches.append(list(items))
        return np.zeros((len(items), 1), np.float32)

    async def main(tokens):
        batcher = MicroBatcher(fn, max_batch_size=64, max_batch_tokens=tokens, max_wait_ms=0)
        batcher.start()
        await asyncio.gather(*(batcher.submit([n], [n]) for n in [512] + [9] * 63))
        await batcher.stop()

    asyncio.run(main(None))
    assert [len(b) for b in batches] == [64] and max(batches[0]) * 64 == 32768
    batches.clear()
    asyncio.run(main(4096))
    assert batches == [[9] * 63, [512]]


def test_a_long_text_is_not_starved_by_a_stream_of_short_ones():
    from embforge.serve.batcher import MicroBatcher

    batches: list[list[int]] = []

    def fn(items):
        batches.append(list(items))
        return np.zeros((len(items), 1), np.float32)

    async def main():
        batcher = MicroBatcher(fn, max_batch_size=4, max_batch_tokens=64, max_wait_ms=0, patience=3)
        batcher.start()
        long = asyncio.ensure_future(batcher.submit([60], [60]))
        shorts = [asyncio.ensure_future(batcher.submit([5] * 4, [5] * 4)) for _ in range(10)]
        await asyncio.gather(long, *shorts)
        await batcher.stop()

    asyncio.run(main())
    at = next(i for i, b in enumerate(batches) if 60 in b)
    assert at <= 3 and batches[at] == [60]  # passed over at most `patience` times, then it leads a batch
    assert sum(len(b) for b in batches) == 41


def test_a_request_split_over_batches_gets_its_rows_in_order():
    from embforge.serve.batcher import MicroBatcher

    def fn(items):
        return np.array([[x, x * 2] for x in items], dtype=np.float32)

    async def main():
        batcher = MicroBatcher(fn, max_batch_size=3, max_batch_tokens=100, max_wait_ms=0)
        batcher.start()
        items = [7, 1, 50, 3, 2, 30, 9]
        got = await batcher.submit(items, items)
        await batcher.stop()
        return items, got

    items, got = asyncio.run(main())
    assert got[:, 0].tolist() == items and got[:, 1].tolist() == [2 * x for x in items]


def test_several_models_route_by_name_and_one_overloaded_model_never_fails_the_others():
    from embforge.encoder import Encoder
    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    tokenizer = make_tokenizer()
    busy = Encoder(make_bert(len(tokenizer), seed=1), tokenizer, max_seq_length=64)
    other = Encoder(make_bert(len(tokenizer), seed=2), tokenizer, max_seq_length=64, normalize=True)
    reranker = make_cross_encoder().eval()
    gate = Gate(busy)
    config = ServeConfig(max_batch_size=4, max_queue=8, max_wait_ms=1)
    app = create_app({"busy": busy, "other": other}, reranker={"rr": reranker}, config=config)
    texts = ["a man plays the guitar", "the cat", "oil price falls", "a red car"]

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as http,
        ):
            listing = (await http.get("/v1/models")).json()
            flood = [
                asyncio.ensure_future(http.post("/v1/embeddings", json={"input": texts, "model": "busy"}))
            ]
            await gate.busy()
            flood += [
                asyncio.ensure_future(http.post("/v1/embeddings", json={"input": texts, "model": "busy"}))
                for _ in range(5)
            ]
            await wait_queued(
                app, "busy", 8
            )  # one request in the (held) model, two queued: the queue is full
            rest = await asyncio.gather(*flood[3:])
            others = await asyncio.gather(
                *(http.post("/v1/embeddings", json={"input": texts, "model": "other"}) for _ in range(2)),
                http.post("/rerank", json={"query": "a man", "documents": texts, "model": "rr"}),
            )
            unknown = await http.post("/v1/embeddings", json={"input": "a", "model": "nope"})
            gate.release()
            return listing, rest, await asyncio.gather(*flood[:3]), others, unknown

    listing, refused, served, others, unknown = asyncio.run(main())
    assert [(m["id"], m["kind"]) for m in listing["data"]] == [
        ("busy", "embedding"),
        ("other", "embedding"),
        ("rr", "rerank"),
    ]
    assert [r.status_code for r in refused] == [429] * 3
    assert (
        refused[0].json()["error"]["type"] == "overloaded" and "busy" in refused[0].json()["error"]["message"]
    )
    assert [r.status_code for r in served] == [200] * 3
    assert [r.status_code for r in others] == [200] * 3  # its own queue (8 texts) holds both requests
    got = np.array([d["embedding"] for d in others[0].json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, other.encode(texts), atol=1e-5)
    assert others[0].json()["model"] == "other" and others[-1].json()["model"] == "rr"
    expected = reranker.predict([("a man", t) for t in texts])
    assert others[-1].json()["results"][0]["index"] == int(np.argmax(expected))
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    assert "busy, other" in unknown.json()["error"]["message"]


def test_with_two_streams_a_second_batch_runs_while_the_first_is_held():
    """concurrency=2: while one batch is inside the model, the next is formed and run at once (a model with two
    inference streams); concurrency=1 keeps one batch in the model at a time."""
    from embforge.serve.batcher import MicroBatcher

    def run(concurrency: int) -> tuple[int, list[list[str]]]:
        held = threading.Event()
        inside: list[int] = []
        most = [0]
        batches: list[list[str]] = []
        lock = threading.Lock()

        def fn(items):
            with lock:
                inside.append(1)
                most[0] = max(most[0], len(inside))
                batches.append(list(items))
            if items == ["first"]:
                held.wait(1.0)  # released by the second batch when both run at once; else gives up
            else:
                held.set()
            with lock:
                inside.pop()
            return np.array([[len(x)] for x in items])

        async def main():
            batcher = MicroBatcher(fn, max_batch_size=8, max_wait_ms=0, concurrency=concurrency)
            batcher.start()
            first = asyncio.ensure_future(batcher.submit(["first"]))
            await asyncio.sleep(0.05)
            second = await batcher.submit(["second", "third"])
            results = [await first, second]
            await batcher.stop()
            return results

        results = asyncio.run(main())
        assert results[1][:, 0].tolist() == [6, 5]
        return most[0], batches

    assert run(2) == (2, [["first"], ["second", "third"]])
    assert run(1)[0] == 1
    with pytest.raises(ValueError, match="concurrency"):
        MicroBatcher(lambda items: items, concurrency=0)


def test_with_two_streams_the_queued_work_is_shared_between_them():
    """64 one-text requests queued at once on a two-stream model: two batches of 32 (one per stream), not one
    batch of 64 that leaves the second stream idle until the clients send again (16 clients x 4 texts on a
    2-core OpenVINO server used one core)."""
    from embforge.serve.batcher import MicroBatcher

    sizes: list[int] = []

    def fn(items):
        sizes.append(len(items))
        return np.array([[len(x)] for x in items])

    async def main():
        batcher = MicroBatcher(fn, max_batch_size=64, max_wait_ms=50, concurrency=2)
        batcher.start()
        # created in one go: every submit runs before the worker wakes (asyncio runs ready tasks in order)
        results = await asyncio.gather(*(batcher.submit([f"t{i}"]) for i in range(64)))
        await batcher.stop()
        return results

    results = asyncio.run(main())
    assert [int(r[0, 0]) for r in results] == [len(f"t{i}") for i in range(64)]
    assert sizes == [32, 32]


def test_an_error_after_the_model_call_answers_the_request_instead_of_leaving_it_waiting():
    """A failure outside the model call (here the metrics hook) fails the batch's requests with that error;
    before, the batch task died with the error and its requests waited for the server's timeout."""
    from embforge.serve.batcher import MicroBatcher

    def hook(n: int, seconds: float) -> None:
        raise RuntimeError("metrics broke")

    async def main():
        batcher = MicroBatcher(lambda items: np.ones((len(items), 1)), on_batch=hook)
        batcher.start()
        try:
            return await asyncio.wait_for(batcher.submit(["a", "b"]), 5.0)
        finally:
            await batcher.stop()

    with pytest.raises(RuntimeError, match="metrics broke"):
        asyncio.run(main())


def test_with_two_streams_a_free_stream_does_not_wait_for_a_batch_to_fill_while_the_other_runs():
    """A merged batch (two requests) is inside the model on one stream; a third request arrives: the free stream
    runs it at once instead of waiting ``max_wait_ms`` for more to join (16 clients on a 2-core, two-stream
    OpenVINO server: the wait left each stream idle a quarter of the time, 1,059 vs 1,188 texts/s with no wait).
    Counted by the model calls started while the first is held, not by time: the wait here is 60 s."""
    from embforge.serve.batcher import MicroBatcher

    held, late_started = threading.Event(), threading.Event()
    calls: list[list[str]] = []

    def fn(items):
        calls.append(list(items))
        if "a" in items:
            held.wait(30.0)
        elif "eeeee" in items:
            late_started.set()
        return np.array([[len(x)] for x in items])

    async def main():
        batcher = MicroBatcher(fn, max_batch_size=8, max_wait_ms=60_000, concurrency=2)
        batcher.start()
        # four requests at once: two merged batches of two, one per stream; the one with "a" stays inside
        first = asyncio.gather(*(batcher.submit([t]) for t in ["a", "bb", "ccc", "dddd"]))
        await asyncio.sleep(0.05)
        late = asyncio.ensure_future(batcher.submit(["eeeee"]))
        started = await asyncio.get_running_loop().run_in_executor(None, late_started.wait, 10.0)
        held.set()
        results = [*(await first), await late]
        await batcher.stop()
        return started, results

    started, results = asyncio.run(main())
    assert started and calls == [["a", "bb"], ["ccc", "dddd"], ["eeeee"]]
    assert [int(r[0, 0]) for r in results] == [1, 2, 3, 4, 5]


def test_an_exported_graph_runs_the_short_texts_of_a_batch_apart_from_a_long_one(tiny_model_dir, tmp_path):
    """A padded graph pads a call to its longest text: three 4-token texts in one call with a 44-token one cost
    4 x 44 padded tokens, two calls 3 x 4 + 44 (and one more call's fixed cost). The vectors stay the same."""
    pytest.importorskip("onnxruntime")
    from fastapi.testclient import TestClient

    from embforge.encoder import Encoder
    from embforge.onnx.export import export_onnx
    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    export_onnx(tiny_model_dir, tmp_path / "onnx", parity_texts=["the cat", "a dog"])
    model = Encoder.load(tmp_path / "onnx", backend="onnx")
    calls: list[list[int]] = []
    original = model.embed_batch

    def recorded(ids):
        calls.append(sorted(len(x) for x in ids))
        return original(ids)

    model.embed_batch = recorded
    texts = ["the cat", " ".join(["the cat sat on the mat ."] * 6), "a dog", "the sun"]
    with TestClient(create_app(model, config=ServeConfig(max_wait_ms=0))) as client:
        body = client.post("/v1/embeddings", json={"input": texts}).json()
    assert calls == [[4, 4, 4], [44]]
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, model.encode(texts), atol=1e-5)
