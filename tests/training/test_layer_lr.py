"""Layer-wise learning-rate decay (``TrainConfig.layer_lr_decay``, embforge/training/trainer.py)."""

from __future__ import annotations

import pytest
import torch

from embforge.training.config import TrainConfig
from embforge.training.trainer import layer_lr_factors
from tests.training.test_anchor import WORDS, _layer_key, _layers, _start
from tests.training.test_averaging import _run, _weights, cli_summary


def test_each_layer_runs_at_decay_times_the_rate_of_the_one_above():
    names = list(_start())
    layers = _layers(_start())
    factors = layer_lr_factors(names, 0.5)
    assert factors[WORDS] == 0.5**layers  # the embeddings: below the first layer
    assert factors[_layer_key(0)] == 0.5 ** (layers - 1)
    assert factors[_layer_key(layers - 1)] == 1.0
    assert all(factors[n] == 1.0 for n in names if "pooler" in n)  # what follows the layers: the full rate


def test_one_step_moves_each_weight_by_its_layers_share_of_the_plain_step(tmp_path, sts_csv):
    """AdamW's first step is proportional to the learning rate (the gradients are the plain run's), so each
    weight's change is its factor times the plain run's change."""
    plain, _ = _run(tmp_path / "plain", sts_csv, max_steps=1)
    decayed, _ = _run(tmp_path / "decayed", sts_csv, max_steps=1, layer_lr_decay=0.5)
    start, moved, moved_decayed = _start(), _weights(plain), _weights(decayed)
    factors = layer_lr_factors(list(start), 0.5)
    for key in (WORDS, _layer_key(0), _layer_key(_layers(start) - 1)):
        expected = start[key] + factors[key] * (moved[key] - start[key])
        torch.testing.assert_close(moved_decayed[key], expected, atol=1e-7, rtol=1e-5)
    assert not torch.equal(moved_decayed[WORDS], moved[WORDS])


def test_a_model_without_numbered_layers_is_refused_by_name():
    with pytest.raises(ValueError, match=r"layer_lr_decay: .*no numbered layers"):
        layer_lr_factors(["embedding.weight", "linear.weight"], 0.8)


@pytest.mark.parametrize("value", [0.0, -0.5, 1.5])
def test_a_decay_outside_0_to_1_is_refused(value):
    with pytest.raises(ValueError, match=r"layer_lr_decay must be a number in \(0, 1\]"):
        TrainConfig(layer_lr_decay=value)


def test_the_cli_flag_reaches_the_run(tmp_path, tiny_model_dir, sts_csv):
    plain = cli_summary(tmp_path / "plain", tiny_model_dir, sts_csv)
    decayed = cli_summary(tmp_path / "decayed", tiny_model_dir, sts_csv, "--layer-lr-decay", "0.5")
    assert plain["steps"] == decayed["steps"] == 2
    from embforge.encoder import Encoder

    words = [_weights(Encoder.load(tmp_path / run))[WORDS] for run in ("plain", "decayed")]
    assert not torch.equal(*words)
