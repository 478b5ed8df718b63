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
