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


def test_identical_calibration_texts_are_refused_saying_how_many_were_distinct(tiny_encoder, tmp_path):
    """Three identical lines gave ranges of zero width: every int8 vector was -128."""
    from embforge.quantization import read_texts

    with pytest.raises(ValueError, match=r"zero width .* 3 texts, 1 distinct.*more varied"):
        calibrate(tiny_encoder, ["the cat"] * 3)
    same = tmp_path / "calibration.txt"
    same.write_text("the cat\nthe cat\nthe cat\n")
    with pytest.raises(ValueError, match=r"calibration\.txt: 3 lines but 1 distinct text.*more varied"):
        read_texts(same)


def test_calibration_of_a_directory_is_one_line_naming_the_flag(tmp_path):
    from embforge.quantization import read_texts

    with pytest.raises(ValueError, match=r"--calibration .*is a directory; a text file .*is expected"):
        read_texts(tmp_path)


def test_calibration_of_a_sparse_model_is_refused():
    from transformers import BertForMaskedLM

    from embforge.sparse.model import SparseEncoder
    from tests.conftest import make_tokenizer, tiny_bert_config

    tokenizer = make_tokenizer()
    model = SparseEncoder(BertForMaskedLM(tiny_bert_config(len(tokenizer))), tokenizer, max_seq_length=32)
    model.name_or_path = "my-splade"
    with pytest.raises(
        ValueError, match=r"^int8/uint8 calibration applies to dense embedding models; my-splade is sparse"
    ):
        calibrate(model, CALIBRATION)


def _saved(folder, record) -> None:
    import json

    from embforge.quantization import RANGES_FILE

    (folder / RANGES_FILE).write_text(json.dumps(record))


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        (
            {"min": [0.0, float("nan")], "max": [1.0, 1.0]},
            r"not finite \(NaN or infinity\) in 1 of 2 dimensions",
        ),
        ({"min": [0.0, float("-inf")], "max": [1.0, 1.0]}, r"not finite"),
        ({"min": [0.0, 2.0], "max": [1.0, 1.0]}, r"min >= max in 1 of 2 dimensions \(first: dimension 1"),
        ({"min": [0.0, 1.0, 2.0], "max": [1.0, 2.0]}, r"'min' has 3 values but 'max' has 2"),
        ({"max": [1.0, 2.0]}, r"no 'min' \(a ranges file holds 'min' and 'max'"),
        ({"min": [0.0, "x"], "max": [1.0, 2.0]}, r"'min' and 'max' must be lists of numbers"),
    ],
)
def test_saved_ranges_are_checked_when_read(tmp_path, record, problem):
    """NaN/Infinity or min > max gave zeros or garbage with status 200; a file without min/max said "error: 'min'"."""
    _saved(tmp_path, record)
    with pytest.raises(ValueError, match=rf"embforge_quantization\.json: {problem}"):
        read_ranges(tmp_path)


def test_saved_ranges_of_another_width_are_refused(tmp_path):
    _saved(tmp_path, {"min": [0.0, 0.0], "max": [1.0, 1.0]})
    np.testing.assert_array_equal(read_ranges(tmp_path, dim=2), [[0, 0], [1, 1]])
    with pytest.raises(ValueError, match=r"embforge_quantization\.json: 2 dimensions, but the model has 4"):
        read_ranges(tmp_path, dim=4)
    (tmp_path / "embforge_quantization.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"embforge_quantization\.json: not JSON \("):
        read_ranges(tmp_path)


def test_the_server_refuses_ranges_of_another_width_before_it_starts(tiny_encoder, tmp_path):
    """Ranges of another model's width: the server started, then every int8 request was a 500."""
    pytest.importorskip("fastapi")
    from embforge.serve.app import create_app

    other = np.stack([np.zeros(8), np.ones(8)]).astype(np.float32)
    with pytest.raises(
        ValueError,
        match=rf"calibration ranges given for .*: 8 dimensions, but the model has {tiny_encoder.dim}",
    ):
        create_app({"tiny": tiny_encoder}, ranges={"tiny": other})
    bad = np.stack([np.zeros(tiny_encoder.dim), np.full(tiny_encoder.dim, np.nan)]).astype(np.float32)
    with pytest.raises(ValueError, match=r"calibration ranges given for .*: not finite"):
        create_app({"tiny": tiny_encoder}, ranges={"tiny": bad})


def test_the_server_refuses_a_broken_saved_ranges_file_instead_of_ignoring_it(tiny_model_dir):
    pytest.importorskip("fastapi")
    from embforge.encoder import Encoder
    from embforge.serve.app import create_app

    model = Encoder.load(tiny_model_dir)
    _saved(tiny_model_dir, {"min": [0.0] * model.dim, "max": [float("inf")] * model.dim})
    with pytest.raises(ValueError, match=r"tiny/embforge_quantization\.json: not finite"):
        create_app(model)
    _saved(tiny_model_dir, {"min": [0.0] * 3, "max": [1.0] * 3})  # copied from another model
    with pytest.raises(
        ValueError,
        match=rf"embforge_quantization\.json: 3 dimensions, but the model has {model.dim}",
    ):
        create_app(model)
