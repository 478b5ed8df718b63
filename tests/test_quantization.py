"""Quantised embeddings: parity with sentence-transformers' quantize_embeddings (the reference, tests only), saved
calibration ranges, and the server's encoding_format int8/uint8/binary/ubinary."""

from __future__ import annotations

import numpy as np
import pytest

from embforge.quantization import calibrate, quantize, read_ranges, unpack_bits, write_ranges

TEXTS = ["a man plays the guitar", "the cat", "oil price falls", "a red car drives on the road"]


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
@pytest.mark.parametrize("dim", [16, 13])
def test_quantize_equals_sentence_transformers(precision: str, dim: int):
    st_quantize = pytest.importorskip("sentence_transformers").quantize_embeddings
    rng = np.random.default_rng(0)
    calibration = rng.normal(size=(200, dim)).astype(np.float32)
    x = rng.normal(scale=1.3, size=(50, dim)).astype(np.float32)  # some values fall outside the ranges
    x[0, :3] = 0.0  # exactly zero: not a set bit
    ranges = np.stack([calibration.min(0), calibration.max(0)])
    ranges[:, 1] = 0.25  # a dimension with a zero range
    expected = st_quantize(x, precision, ranges=ranges)
    got = quantize(x, precision, ranges)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    if precision.endswith("binary"):
        np.testing.assert_array_equal(unpack_bits(got, dim), (x > 0).astype(np.uint8))


def test_int8_needs_ranges_of_the_right_width():
    with pytest.raises(ValueError, match=r"calibration ranges of shape \(2, 4\)"):
        quantize(np.zeros((2, 4)), "int8")
    with pytest.raises(ValueError, match="unknown precision"):
        quantize(np.zeros((2, 4)), "int4")


def test_served_quantised_formats_equal_the_reference_on_the_served_vectors(tiny_encoder, tmp_path):
    pytest.importorskip("fastapi")
    st_quantize = pytest.importorskip("sentence_transformers").quantize_embeddings
    from fastapi.testclient import TestClient

    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    calibration = [
        "a woman eats food",
        "the stock market rises",
        "a child reads a book",
        "rain on the river",
    ] * 3
    ranges = calibrate(tiny_encoder, calibration)
    write_ranges(tmp_path, ranges, texts=len(calibration))
    np.testing.assert_array_equal(read_ranges(tmp_path), ranges)
    app = create_app(tiny_encoder, config=ServeConfig(model_name="tiny"), ranges={"tiny": ranges})
    floats = tiny_encoder.encode(TEXTS)
    with TestClient(app) as client:
        for precision in ("int8", "uint8", "binary", "ubinary"):
            body = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": precision}).json()
            got = np.array([d["embedding"] for d in body["data"]])
            np.testing.assert_array_equal(got, st_quantize(floats, precision, ranges=ranges).astype(int))
        cut = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "int8", "dimensions": 8})
        assert cut.status_code == 422 and cut.json()["error"]["param"] == "encoding_format"
        listing = client.get("/v1/models").json()["data"][0]
        assert set(listing["quantized_formats"]) == {"int8", "uint8", "binary", "ubinary"}
    with TestClient(create_app(tiny_encoder)) as client:  # no ranges: int8 is refused, binary works
        refused = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "uint8"})
        assert refused.status_code == 422 and "--calibration" in refused.json()["error"]["message"]
        ok = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "ubinary"})
        assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == tiny_encoder.dim // 8


CALIBRATION = ["a woman eats food", "the stock market rises", "a child reads a book", "rain on the river"] * 3


def test_export_saves_the_calibration_ranges_and_the_server_quantises_with_them(tiny_model_dir, tmp_path):
    """``export_onnx(calibration=...)`` writes the ranges of the graph's embeddings beside it; a server of that
    export (no ranges given) serves int8/uint8 with exactly those ranges. A re-export without calibration
    removes them (int8 refused again); ``serve --calibration`` saves its ranges with an exported model."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from embforge.cli import main
    from embforge.onnx.export import export_onnx
    from embforge.onnx.runtime import OnnxEncoder
    from embforge.quantization import RANGES_FILE
    from embforge.serve.app import create_app
    from embforge.serve.runner import calibrated

    out = tmp_path / "export"
    report = export_onnx(tiny_model_dir, out, calibration=CALIBRATION)
    assert report["quantization"] == {"ranges": RANGES_FILE, "texts": len(CALIBRATION)}
    model = OnnxEncoder.load(out)
    saved = read_ranges(out)
    assert saved is not None
    np.testing.assert_allclose(saved, calibrate(model, CALIBRATION), atol=1e-6)
    floats = model.encode(TEXTS)
    with TestClient(create_app(model)) as client:
        assert "int8" in client.get("/v1/models").json()["data"][0]["quantized_formats"]
        for precision in ("int8", "uint8"):
            body = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": precision}).json()
            got = np.array([d["embedding"] for d in body["data"]])
            np.testing.assert_array_equal(got, quantize(floats, precision, saved).astype(int))
    export_onnx(tiny_model_dir, out)
    assert read_ranges(out) is None
    with TestClient(create_app(OnnxEncoder.load(out))) as client:
        refused = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "int8"})
        assert refused.status_code == 422
    ranges = calibrated(OnnxEncoder.load(out), CALIBRATION)  # what serve --calibration does with an export
    np.testing.assert_array_equal(read_ranges(out), ranges)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(CALIBRATION) + "\n")
    cli_out = tmp_path / "cli"
    argv = ["export", "onnx", "--model", str(tiny_model_dir), "--output", str(cli_out)]
    assert main([*argv, "--calibration", str(texts)]) == 0
    np.testing.assert_allclose(read_ranges(cli_out), saved, atol=1e-6)
