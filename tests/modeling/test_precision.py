"""Mixed-precision inference: the settings, the CLI's ``--amp``, and cached corpus embeddings keyed on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embforge.cli import main
from embforge.modeling.precision import amp_dtype, autocast_tag, check_amp, inference_autocast
from embforge.retrieval.corpus_cache import encode_corpus, fingerprint


def test_settings_map_to_dtypes():
    cpu = torch.device("cpu")
    assert amp_dtype("no", cpu) is None
    assert amp_dtype("bf16", cpu) is torch.bfloat16
    assert amp_dtype("fp16", cpu) is torch.float16
    assert amp_dtype("auto", cpu) in (None, torch.bfloat16)
    with pytest.raises(ValueError, match="amp must be one of auto, no, fp16, bf16, got 'half'"):
        check_amp("half")


def test_bf16_inference_is_close_to_fp32_and_not_identical(tiny_encoder):
    texts = ["a cat sat on the mat", "the dog runs", "a bird sings in the tree today"]
    full = tiny_encoder.encode(texts)
    with inference_autocast("bf16"):
        assert autocast_tag() == "cpu:bfloat16"
        half = tiny_encoder.encode(texts)
    assert autocast_tag() == "fp32"
    assert half.dtype == np.float32
    assert not np.array_equal(full, half)  # the matrix products really ran in bf16
    cos = (full * half).sum(1) / np.linalg.norm(full, axis=1) / np.linalg.norm(half, axis=1)
    assert cos.min() > 0.99


def test_cross_encoder_scores_under_bf16_are_float32_and_close():
    from tests.conftest import make_cross_encoder
    from tests.losses.test_cross_losses import PAIRS

    model = make_cross_encoder(num_labels=1)
    full = model.predict(PAIRS)
    with inference_autocast("bf16"):
        half = model.predict(PAIRS)
        chunked = model.predict(PAIRS, max_tokens=64)  # the padding-free path too
    assert half.dtype == np.float32 and not np.array_equal(full, half)
    np.testing.assert_allclose(half, full, atol=0.05)
    np.testing.assert_allclose(chunked, full, atol=0.05)


def test_a_corpus_cache_written_in_fp32_is_not_reused_under_bf16(tiny_encoder, tmp_path):
    texts, ids = ["one doc", "another doc here", "third"], ["a", "b", "c"]
    full = np.array(encode_corpus(tiny_encoder, texts, ids, tmp_path, show_progress=False))
    fp32_key = fingerprint(ids, texts, "m", 8)
    with inference_autocast("bf16"):
        assert fingerprint(ids, texts, "m", 8) != fp32_key
        half = np.array(encode_corpus(tiny_encoder, texts, ids, tmp_path, show_progress=False))
    assert not np.array_equal(full, half)  # re-encoded, not read back from the fp32 cache
    again = np.array(encode_corpus(tiny_encoder, texts, ids, tmp_path, show_progress=False))
    np.testing.assert_allclose(again, full, atol=1e-6)


def test_encode_verb_takes_amp(tmp_path, tiny_model_dir, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("a cat\nthe dog runs\n")
    args = ["encode", "--model", str(tiny_model_dir), "--input", str(texts)]
    assert main([*args, "--output", str(tmp_path / "fp32.npy")]) == 0
    assert main([*args, "--output", str(tmp_path / "bf16.npy"), "--amp", "bf16"]) == 0
    full, half = np.load(tmp_path / "fp32.npy"), np.load(tmp_path / "bf16.npy")
    assert full.shape == half.shape and not np.array_equal(full, half)
    np.testing.assert_allclose(half, full, atol=0.05)
    with pytest.raises(SystemExit):
        main([*args, "--output", str(tmp_path / "x.npy"), "--amp", "half"])
