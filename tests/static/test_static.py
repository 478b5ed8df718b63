"""Static embedding models: distill-static through model2vec, sentence-transformers' StaticEmbedding parity, training
through the usual loop and losses, model card, clear refusals (export, merge)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("model2vec")

TEXTS = ["a man plays the guitar", "the stock market rises", "a cat runs in the park", "zzz unknown words"]


@pytest.fixture
def static_dir(tmp_path: Path, tiny_model_dir: Path) -> Path:
    from embforge.cli import main

    out = tmp_path / "static"
    assert (
        main(
            [
                "distill-static",
                "--model",
                str(tiny_model_dir),
                "--output",
                str(out),
                "--pca-dims",
                "16",
                "--quiet",
            ]
        )
        == 0
    )
    return out


def test_distill_static_folder_loads_in_embforge_model2vec_and_sentence_transformers(static_dir):
    from model2vec import StaticModel
    from sentence_transformers import SentenceTransformer

    from embforge.kinds import ModelKind, folder_kind, load_any
    from embforge.static.model import StaticEncoder

    assert folder_kind(static_dir) is ModelKind.STATIC
    model = load_any(static_dir)
    assert isinstance(model, StaticEncoder) and model.dim == 16
    ours = model.encode(TEXTS)
    assert np.abs(ours - SentenceTransformer(str(static_dir)).encode(TEXTS)).max() <= 1e-5
    # model2vec itself drops unknown tokens (a text of unknown words is a zero vector there): known words only
    assert np.abs(ours[:2] - StaticModel.from_pretrained(str(static_dir)).encode(TEXTS[:2])).max() <= 1e-5
    # the mean of the tokens' rows (no special tokens), normalised
    ids = model.tokenizer.encode(TEXTS[0], add_special_tokens=False).ids
    mean = model.embedding.weight[ids].mean(0).detach().numpy()
    assert np.allclose(ours[0], mean / np.linalg.norm(mean), atol=1e-6)


def test_static_model_trains_evaluates_saves_and_loads_in_sentence_transformers(
    static_dir, sts_csv, tmp_path
):
    from sentence_transformers import SentenceTransformer

    from embforge.cli import main
    from embforge.data.tables import read_table
    from embforge.evaluate.sts import evaluate_sts
    from embforge.static.model import StaticEncoder

    before = evaluate_sts(StaticEncoder.load(static_dir), read_table(sts_csv))["spearman"]
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--model",
                str(static_dir),
                "--model-type",
                "static",
                "--train",
                str(sts_csv),
                "--eval",
                str(sts_csv),
                "--loss",
                "cosent",
                "--lr",
                "0.05",
                "--epochs",
                "3",
                "--batch-size",
                "8",
                "--output",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    trained = StaticEncoder.load(out)
    after = evaluate_sts(trained, read_table(sts_csv))["spearman"]
    assert after > before  # CoSENT moved the table towards the scores it was trained on
    assert np.abs(trained.encode(TEXTS) - SentenceTransformer(str(out)).encode(TEXTS)).max() <= 1e-5
    card = (out / "README.md").read_text()
    assert "static embedding" in card and "StaticEncoder.load" in card
    assert json.loads((out / "config.json").read_text())["hidden_dim"] == 16

    from fastapi.testclient import TestClient

    from embforge.serve.app import create_app
    from embforge.serve.runner import load_encoder

    served = load_encoder(str(out))  # the server's loader reads the folder's kind
    assert isinstance(served, StaticEncoder)
    with TestClient(create_app(served)) as client:
        body = client.post("/v1/embeddings", json={"input": TEXTS}).json()
    vectors = np.array([item["embedding"] for item in body["data"]])
    assert np.abs(vectors - trained.encode(TEXTS)).max() <= 1e-5


def test_static_models_are_refused_clearly_by_export_and_merge_as_static(static_dir, tmp_path):
    from embforge.merge import Merger
    from embforge.onnx.export import export_onnx

    with pytest.raises(ValueError, match="static embedding model: there is no transformer to export"):
        export_onnx(static_dir, tmp_path / "onnx")
    assert Merger([static_dir, static_dir]).merge().kind.value == "static"  # #52: every kind merges


def test_encode_cli_writes_a_static_models_vectors(static_dir, tmp_path):
    from embforge.cli import main
    from embforge.static.model import StaticEncoder

    texts = tmp_path / "texts.txt"
    texts.write_text("".join(t + "\n" for t in TEXTS))
    out = tmp_path / "vectors.npy"
    assert (
        main(["encode", "--model", str(static_dir), "--input", str(texts), "--output", str(out), "--quiet"])
        == 0
    )
    assert np.abs(np.load(out) - StaticEncoder.load(static_dir).encode(TEXTS)).max() <= 1e-6


def test_lora_on_a_static_model_is_refused_clearly(static_dir):
    from embforge.training.run import load_model, spec_from_dict

    spec = spec_from_dict({"model": str(static_dir), "model_type": "static", "lora_r": 8})
    with pytest.raises(ValueError, match="LoRA is not supported for static models"):
        load_model(spec)
