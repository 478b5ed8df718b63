"""The base every model kind shares (:mod:`embforge.modeling.module`): one ``inference()`` for all of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from embforge.modeling.module import SavedModule
from tests.conftest import make_cross_encoder, make_tokenizer, tiny_bert_config

TEXTS = ["a cat runs in the park", "the dog", "a man plays the guitar ."]


def _dense(folder: Path) -> SavedModule:
    from embforge.encoder import Encoder

    return Encoder.load(folder)


def _sparse(folder: Path) -> SavedModule:
    from transformers import BertForMaskedLM

    from embforge.sparse.model import SparseEncoder

    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    return SparseEncoder(BertForMaskedLM(tiny_bert_config(len(tokenizer))), tokenizer)


def _multivector(folder: Path) -> SavedModule:
    from embforge.multivector.model import MultiVectorEncoder

    return MultiVectorEncoder.load(folder, dim=8)


def _static(folder: Path) -> SavedModule:
    from embforge.static.model import StaticEncoder

    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    return StaticEncoder(torch.randn(len(tokenizer), 8), tokenizer.backend_tokenizer)


def _cross(folder: Path) -> SavedModule:
    return make_cross_encoder()


def _outputs(model: SavedModule) -> np.ndarray:
    """What the model gives for :data:`TEXTS` at inference, as one array."""
    if model.kind == "cross":
        return model.predict([(t, t) for t in TEXTS])
    out = model.encode(TEXTS)
    if model.kind == "sparse":
        return out.toarray()
    if model.kind == "multivector":
        return np.concatenate(out)
    return out


KINDS: dict[str, Callable[[Path], SavedModule]] = {
    "dense": _dense,
    "sparse": _sparse,
    "multivector": _multivector,
    "static": _static,
    "cross": _cross,
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_runs_inference_in_eval_mode_without_autograd_and_gives_its_mode_back(
    kind, tiny_model_dir
):
    model = KINDS[kind](tiny_model_dir)
    assert model.kind == kind
    assert type(model).inference is SavedModule.inference  # one home, whatever the bases' order
    model.train()
    with model.inference():
        assert not model.training
        assert torch.is_inference_mode_enabled()
    assert model.training
    assert not torch.is_inference_mode_enabled()
    with pytest.raises(RuntimeError, match="stop"), model.inference():
        raise RuntimeError("stop")
    assert model.training  # given back after an error too


@pytest.mark.parametrize("kind", ["dense", "sparse", "multivector", "cross"])
def test_a_model_left_in_training_mode_encodes_without_dropout_and_stays_in_it(kind, tiny_model_dir):
    model = KINDS[kind](tiny_model_dir)
    model.train()
    first = _outputs(model)
    assert model.training
    assert np.ptp(first) > 0  # outputs that differ, so equality below means something
    np.testing.assert_array_equal(_outputs(model), first)  # dropout (0.1 in the tiny BERT) was off


def test_predict_gives_the_training_mode_back_when_a_batch_fails():
    ce = make_cross_encoder()
    ce.train()
    score_ids = ce.score_ids
    calls: list[int] = []

    def failing(items, **options):
        calls.append(len(items))
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return score_ids(items, **options)

    ce.score_ids = failing
    with pytest.raises(RuntimeError, match="out of memory"):
        ce.predict([(t, t) for t in TEXTS], batch_size=2)
    assert calls == [2, 1]
    assert ce.training  # as after a predict that succeeds
