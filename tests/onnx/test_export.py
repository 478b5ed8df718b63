"""ONNX export: graph parity with PyTorch (tiny models), the onnx backend's encode(), int8, cross-encoders, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import make_bert, make_tokenizer, requires_minilm, tiny_bert_config

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

SENTENCES = [
    "a man plays the guitar",
    "the cat",
    "a woman is reading a small red book in the park .",
    "oil price falls",
    "a child kicks the ball and runs",
]


def test_bi_encoder_graph_matches_torch_with_dynamic_axes(tiny_model_dir: Path, tmp_path: Path):
    import onnx

    from embforge.encoder import Encoder
    from embforge.onnx.export import export_onnx
    from embforge.onnx.runtime import OnnxEncoder

    out = tmp_path / "onnx"
    report = export_onnx(tiny_model_dir, out, parity_texts=SENTENCES)
    assert report["parity"]["fp32_min_cosine"] >= 0.9999
    assert {"model.onnx", "embforge_onnx.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    graph = onnx.load(str(out / "model.onnx"))
    dims = {
        i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.graph.input
    }
    assert dims == {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"]}

    torch_model = Encoder.load(tiny_model_dir)
    onnx_model = Encoder.load(out, backend="onnx")
    assert isinstance(onnx_model, OnnxEncoder)
    # different batch sizes and lengths than the trace (dynamic axes), padding inside batches
    for batch_size in (1, 3, 8):
        np.testing.assert_allclose(
            onnx_model.encode(SENTENCES, batch_size=batch_size),
            torch_model.encode(SENTENCES, batch_size=batch_size),
            atol=1e-5,
        )
    np.testing.assert_allclose(
        onnx_model.encode(SENTENCES, dim=8, normalize=True),
        torch_model.encode(SENTENCES, dim=8, normalize=True),
        atol=1e-5,
    )
    assert onnx_model.encode("a cat").shape == (32,)


def test_pooling_normalisation_and_truncation_live_inside_the_graph(tmp_path: Path):
    import onnxruntime as ort

    from embforge.encoder import Encoder
    from embforge.onnx.export import export_onnx

    tokenizer = make_tokenizer()
    model = Encoder(
        make_bert(len(tokenizer), seed=3), tokenizer, pooling="cls", normalize=True, max_seq_length=32
    )
    model.save(tmp_path / "m")
    export_onnx(tmp_path / "m", tmp_path / "onnx", dim=16, parity_texts=SENTENCES)
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    enc = tokenizer(SENTENCES, padding=True, return_tensors="np", return_token_type_ids=False)
    raw = session.run(None, {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})[0]
    # the bare graph (no embforge code around it) already gives 16-d unit vectors equal to PyTorch's
    assert raw.shape == (len(SENTENCES), 16)
    np.testing.assert_allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(raw, Encoder.load(tmp_path / "m").encode(SENTENCES, dim=16), atol=1e-5)
    with pytest.raises(ValueError, match="fixed at export time"):
        Encoder.load(tmp_path / "onnx", backend="onnx", normalize=False)


def test_parity_failure_fails_the_export(tiny_model_dir: Path, tmp_path: Path):
    from embforge.onnx.export import ExportParityError, export_onnx

    with pytest.raises(ExportParityError, match=r"model\.onnx: parity check failed"):
        export_onnx(tiny_model_dir, tmp_path / "onnx", min_cosine=1.5)


def test_int8_graph_is_written_and_close(tiny_model_dir: Path, tmp_path: Path):
    from embforge.encoder import Encoder
    from embforge.onnx.export import export_onnx

    report = export_onnx(tiny_model_dir, tmp_path / "onnx", quantize="int8", parity_texts=SENTENCES)
    assert (tmp_path / "onnx" / "model_int8.onnx").stat().st_size < (
        tmp_path / "onnx" / "model.onnx"
    ).stat().st_size
    q = Encoder.load(tmp_path / "onnx" / "model_int8.onnx", backend="onnx").encode(SENTENCES)
    ref = Encoder.load(tiny_model_dir).encode(SENTENCES)
    cos = (q * ref).sum(1) / np.linalg.norm(q, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() > 0.95
    assert report["parity"]["int8_min_cosine"] == pytest.approx(cos.min(), abs=1e-4)


def test_cross_encoder_export_matches_predict(tmp_path: Path):
    import torch
    from transformers import BertForSequenceClassification

    from embforge.cross_encoder import CrossEncoder
    from embforge.onnx.export import export_onnx
    from embforge.onnx.runtime import OnnxCrossEncoder

    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    config = tiny_bert_config(len(tokenizer), num_labels=1)
    ce = CrossEncoder(BertForSequenceClassification(config), tokenizer, max_seq_length=64)
    ce.save(tmp_path / "ce")
    report = export_onnx(tmp_path / "ce", tmp_path / "onnx", parity_texts=SENTENCES)
    assert report["kind"] == "cross-encoder"
    pairs = [("a man plays", d) for d in SENTENCES]
    expected = CrossEncoder.load(tmp_path / "ce").predict(pairs)
    got = OnnxCrossEncoder.load(tmp_path / "onnx").predict(pairs, batch_size=2)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_cli_export_prints_report(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    from embforge.cli import main

    parity = tmp_path / "parity.txt"
    parity.write_text("\n".join(SENTENCES) + "\n")
    code = main(
        [
            "export",
            "onnx",
            "--model",
            str(tiny_model_dir),
            "--output",
            str(tmp_path / "o"),
            "--parity-data",
            str(parity),
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["kind"] == "bi-encoder" and report["parity"]["sentences"] == len(SENTENCES)
    assert json.loads((tmp_path / "o" / "embforge_onnx.json").read_text())["dim"] == 32


@pytest.mark.integration
@requires_minilm
def test_minilm_export_parity_and_int8(tmp_path: Path):
    from embforge.onnx.export import export_onnx

    report = export_onnx("all-MiniLM-L6-v2", tmp_path / "onnx", quantize="int8")
    assert report["parity"]["fp32_min_cosine"] >= 0.9999
    assert report["parity"]["int8_mean_cosine"] > 0.98
    assert report["dim"] == 384 and report["normalize"] is True and report["pooling"] == "mean"
