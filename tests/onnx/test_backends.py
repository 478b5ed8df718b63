"""Runtimes of a bi-encoder: export on the fly (cached), ONNX Runtime fp32/int8 and OpenVINO fp32/static int8 agree
with PyTorch, and ``embforge serve`` takes several named models and a backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

TEXTS = ["a man plays the guitar", "the cat", "a woman is reading a small red book .", "oil price falls"]
CALIBRATION = [
    "a woman eats food",
    "the stock market rises",
    "a child reads a book",
    "rain on the river",
    "a man is playing the piano in the park",
    "the dog runs",
] * 4


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def test_each_backend_serves_the_torch_vectors_and_the_export_is_cached(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    pytest.importorskip("onnxruntime")
    import embforge.onnx.export
    from embforge.encoder import Encoder
    from embforge.onnx.backends import load_embedder

    exports: list[str] = []
    original = embforge.onnx.export.export_onnx

    def counting(*args, **kwargs):
        exports.append(str(args[1]))
        return original(*args, **kwargs)

    monkeypatch.setattr(embforge.onnx.export, "export_onnx", counting)
    reference = Encoder.load(tiny_model_dir).encode(TEXTS)
    backends = {"torch": 0.99999, "onnx": 0.99999, "onnx-int8": 0.95}
    try:
        import nncf  # noqa: F401
        import openvino  # noqa: F401

        backends.update({"openvino": 0.99999, "openvino-int8": 0.9})
    except ImportError:
        pass
    for backend, floor in backends.items():
        model = load_embedder(
            tiny_model_dir, backend=backend, calibration=CALIBRATION, cache=tmp_path / "cache"
        )
        got = model.encode(TEXTS)
        assert got.shape == reference.shape
        assert cosines(got, reference).min() >= floor, backend
    assert len(exports) == 1 and exports[0].startswith(str(tmp_path / "cache" / "exports"))
    if "openvino-int8" in backends:
        assert (Path(exports[0]) / "openvino_int8.xml").is_file()
    with pytest.raises(ValueError, match="calibration"):
        load_embedder(tiny_model_dir, backend="openvino-int8", cache=tmp_path / "other")
    with pytest.raises(ValueError, match="unknown backend"):
        load_embedder(tiny_model_dir, backend="tpu")


def test_auto_picks_openvino_int8_only_with_calibration_texts():
    from embforge.onnx.backends import choose_backend

    pytest.importorskip("onnxruntime")
    assert choose_backend() == "onnx-int8"
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    assert choose_backend(calibration=CALIBRATION) == "openvino-int8"


def test_cli_serve_takes_several_named_models_and_rerankers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import embforge.serve.runner as runner
    from embforge.cli import main

    seen: dict = {}
    monkeypatch.setattr(runner, "serve", lambda model, **kwargs: seen.update(model=model, **kwargs))
    calibration = tmp_path / "texts.txt"
    calibration.write_text("\n".join(CALIBRATION))
    argv = ["serve", "--model", "small=m1", "--model", "big=path/to/m2", "--reranker", "rr=ce"]
    assert (
        main([*argv, "--calibration", str(calibration), "--max-batch-tokens", "2048", "--max-queue", "9"])
        == 0
    )
    assert seen["model"] == {"small": "m1", "big": "path/to/m2"} and seen["reranker"] == {"rr": "ce"}
    assert seen["backend"] == "auto" and seen["calibration"] == str(calibration)
    config = seen["config"]
    assert (config.model_name, config.max_batch_tokens, config.max_queue) == ("small", 2048, 9)
    assert main(["serve", "--model", "m", "--backend", "onnx-int8"]) == 0
    assert seen["model"] == "m" and seen["backend"] == "onnx-int8" and seen["config"].model_name == "m"
    assert main(["serve", "--model", "a=x", "--model", "a=y"]) != 0  # one name twice


PAIRS = [
    ("a man plays the guitar", "a man is playing guitar"),
    ("a man plays the guitar", "oil price falls"),
    ("the cat", "a cat runs in the park"),
    ("the stock market rises", "the stock market rises and a woman is reading a small red book ."),
    ("a child reads a book", "rain"),
]


def test_each_reranker_backend_gives_the_torch_scores(tmp_path: Path):
    """A tiny random cross-encoder exported on the fly (once, cached) and run by ONNX Runtime fp32 / int8 and
    OpenVINO: the scores of PyTorch (fp32 graphs within the export's 1e-3 gate), and the same order."""
    pytest.importorskip("onnxruntime")
    from embforge.onnx.backends import load_scorer
    from tests.conftest import make_cross_encoder

    folder = tmp_path / "ce"
    make_cross_encoder().save(folder)
    from embforge.cross_encoder import CrossEncoder

    reference = CrossEncoder.load(folder).predict(PAIRS)
    tolerance = {"torch": 1e-6, "onnx": 1e-3, "onnx-int8": 0.05}
    try:
        import openvino  # noqa: F401

        tolerance["openvino"] = 1e-3
    except ImportError:
        pass
    cache = tmp_path / "cache"
    for backend, atol in tolerance.items():
        scorer = load_scorer(folder, backend=backend, cache=cache)
        got = scorer.predict(PAIRS)
        assert got.shape == reference.shape, backend
        np.testing.assert_allclose(got, reference, atol=atol, err_msg=backend)
        if atol <= 1e-3:
            assert np.argsort(-got).tolist() == np.argsort(-reference).tolist(), backend
    assert len(list((cache / "exports").iterdir())) == 1  # one export, reused by every runtime
    with pytest.raises(ValueError, match="unknown reranker backend"):
        load_scorer(folder, backend="tpu")


def test_openvino_streams_run_batches_at_once_and_change_no_vector(tiny_model_dir: Path, tmp_path: Path):
    """Two streams (throughput mode): two infer requests, batches encoded concurrently, the same vectors as one
    stream; the server's batcher keeps that many batches in flight."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    from embforge.onnx.backends import load_embedder
    from embforge.serve.app import create_app

    one = load_embedder(tiny_model_dir, backend="openvino", cache=tmp_path)
    two = load_embedder(tiny_model_dir, backend="openvino", cache=tmp_path, streams=2)
    assert (one.parallel_batches, two.parallel_batches) == (1, 2)
    texts = TEXTS * 5
    np.testing.assert_allclose(two.encode(texts, batch_size=2), one.encode(texts, batch_size=2), atol=1e-5)
    app = create_app({"a": two, "b": one})
    assert [m.batcher.concurrency for m in app.state.models.embedders.values()] == [2, 1]


def test_a_reranker_on_openvino_is_served_beside_embedders_with_the_torch_scores(
    tiny_model_dir: Path, tmp_path: Path
):
    """The multi-model server with an exported embedder and an OpenVINO reranker (two streams, two batches in
    flight): /rerank answers with PyTorch's order and scores, /v1/models names each model's backend."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from embforge.cross_encoder import CrossEncoder
    from embforge.onnx.backends import load_embedder, load_scorer
    from embforge.serve.app import create_app
    from tests.conftest import make_cross_encoder

    folder = tmp_path / "ce"
    make_cross_encoder().save(folder)
    query, docs = PAIRS[0][0], [d for _, d in PAIRS]
    reference = CrossEncoder.load(folder).predict([(query, d) for d in docs])
    scorer = load_scorer(folder, backend="openvino", cache=tmp_path / "cache", streams=2)
    embedder = load_embedder(tiny_model_dir, backend="onnx", cache=tmp_path / "cache")
    app = create_app({"e": embedder}, reranker={"rr": scorer})
    with TestClient(app) as client:
        listing = {m["id"]: m["backend"] for m in client.get("/v1/models").json()["data"]}
        body = client.post("/rerank", json={"query": query, "documents": docs, "model": "rr"}).json()
    assert listing == {"e": "onnx", "rr": "openvino"}
    assert [r["index"] for r in body["results"]] == np.argsort(-reference).tolist()
    got = np.array([r["relevance_score"] for r in sorted(body["results"], key=lambda r: r["index"])])
    np.testing.assert_allclose(got, reference, atol=1e-3)
    assert app.state.models.rerankers["rr"].batcher.concurrency == 2


@pytest.mark.parametrize("backend", ["torch", "onnx", "openvino", "auto"])
def test_a_bi_encoder_is_refused_as_a_reranker_on_every_backend_before_any_export(
    tiny_model_dir: Path, tmp_path: Path, backend: str
):
    """A bi-encoder given as ``--reranker`` was served with a random head (or exported as a bi-encoder first)."""
    from embforge.onnx.backends import load_scorer

    with pytest.raises(ValueError, match=r"is a dense embedding model .*not a cross-encoder"):
        load_scorer(tiny_model_dir, backend=backend, cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
