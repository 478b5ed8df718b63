"""A folder is refused, in one line naming it, when it is not what the loader needs: a bi-encoder, an encoder
without a trained head or another kind given as a cross-encoder (it would score pairs with a random head), a
weights file that is not safetensors, a tokenizer file that is not JSON."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from embforge.cross_encoder import CrossEncoder
from embforge.encoder import Encoder
from tests.conftest import make_cross_encoder, make_tokenizer, tiny_bert_config
from tests.losses.test_cross_losses import PAIRS


def test_a_bi_encoder_folder_is_refused_as_a_cross_encoder(tiny_model_dir: Path):
    with pytest.raises(ValueError) as error:
        CrossEncoder.load(tiny_model_dir)
    message = str(error.value)
    assert message.startswith(f"{tiny_model_dir} is a dense embedding model (sentence-transformers folder)")
    assert "not a cross-encoder" in message and "--model" in message and "\n" not in message
    (tiny_model_dir / "config_sentence_transformers.json").unlink()  # modules.json alone says it too
    with pytest.raises(ValueError, match="is a dense embedding model"):
        CrossEncoder.load(tiny_model_dir)


def test_a_plain_encoder_checkpoint_is_refused_as_a_cross_encoder(tmp_path: Path):
    from transformers import BertModel

    tokenizer = make_tokenizer()
    BertModel(tiny_bert_config(len(tokenizer))).save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    with pytest.raises(
        ValueError, match=r"bert is a Hugging Face BertModel checkpoint .*not a cross-encoder"
    ):
        CrossEncoder.load(tmp_path / "bert")


def test_a_cross_encoder_without_its_classifier_weights_is_refused(tmp_path: Path):
    """A folder that says it is a cross-encoder but whose checkpoint lacks the head: Hugging Face would
    initialise it at random (scores ~0.5, different at every start)."""
    folder = tmp_path / "ce"
    make_cross_encoder().save(folder)
    weights = load_file(str(folder / "model.safetensors"))
    save_file(
        {k: v for k, v in weights.items() if not k.startswith("classifier.")},
        str(folder / "model.safetensors"),
    )
    with pytest.raises(ValueError, match=r"ce: classifier\.bias, classifier\.weight .*not in the checkpoint"):
        CrossEncoder.load(folder)


def test_a_cross_encoder_loaded_with_new_head_keeps_its_trained_head(tmp_path: Path):
    """Training asks for ``new_head=True`` (a bi-encoder base gets one, test_cross_encoder.py); a cross-encoder
    folder given to it continues with its own head."""
    trained = make_cross_encoder()
    trained.save(tmp_path / "ce")
    again = CrossEncoder.load(tmp_path / "ce", new_head=True)
    np.testing.assert_allclose(again.predict(PAIRS), trained.predict(PAIRS), atol=1e-6)


def test_serve_refuses_a_bi_encoder_as_reranker_in_one_line(tiny_model_dir: Path, capsys, monkeypatch):
    pytest.importorskip("uvicorn")
    from embforge.cli import main

    def never(*args, **kwargs):
        raise AssertionError("the server was built with a bi-encoder as its reranker")

    monkeypatch.setattr("embforge.serve.app.create_app", never)

    argv = ["serve", "--model", str(tiny_model_dir), "--reranker", str(tiny_model_dir), "--backend", "torch"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("embforge serve: error: ") and "is a dense embedding model" in err
    assert "\n" not in err


def _copy(tiny_model_dir: Path, name: str) -> Path:
    folder = tiny_model_dir.parent / name
    shutil.copytree(tiny_model_dir, folder)
    return folder


def test_weights_that_are_not_safetensors_are_named(tiny_model_dir: Path, tmp_path: Path):
    folder = _copy(tiny_model_dir, "bad-weights")
    (folder / "model.safetensors").write_text("<html>404 not found</html>")
    with pytest.raises(ValueError, match=r"bad-weights/model\.safetensors: not a safetensors file \("):
        Encoder.load(folder)
    make_cross_encoder().save(tmp_path / "ce")
    (tmp_path / "ce" / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match=r"ce/model\.safetensors: not a safetensors file \("):
        CrossEncoder.load(tmp_path / "ce")


def test_a_tokenizer_file_that_is_not_json_is_named(tiny_model_dir: Path, tmp_path: Path):
    folder = _copy(tiny_model_dir, "bad-tokenizer")
    (folder / "tokenizer.json").write_text('{"version": "1.0", truncated')
    with pytest.raises(ValueError, match=r"bad-tokenizer/tokenizer\.json: not JSON \("):
        Encoder.load(folder)
    make_cross_encoder().save(tmp_path / "ce")
    (tmp_path / "ce" / "tokenizer.json").write_text("")
    with pytest.raises(ValueError, match=r"ce/tokenizer\.json: not JSON \("):
        CrossEncoder.load(tmp_path / "ce")
