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
