"""TrainConfig is made of parts that check themselves; every flat field name (TOML files, flags, keyword arguments)
lives in exactly one part, so run files written for the flat config load unchanged (issue #49)."""

from __future__ import annotations

import dataclasses

import pytest

from embforge.fields import described, flat_fields
from embforge.training.anchor import Anchoring
from embforge.training.averaging import Averaging
from embforge.training.config import FLAT_FIELDS, Optimisation, TrainConfig
from embforge.training.pipeline_file import parse_pipeline
from embforge.training.spec import load_toml, spec_from_dict
from embforge.training.weighting import DynamicWeighting

# the flat TrainConfig's fields before the parts (embforge 699f0b5), with their defaults
FLAT_DEFAULTS = {
    "output": "output", "epochs": 1, "max_steps": None, "batch_size": 32, "lr": 5e-05, "weight_decay": 0.01,
    "layer_lr_decay": 1.0, "warmup_ratio": 0.1, "max_grad_norm": 1.0, "grad_accum": 1, "amp": "auto", "seed": 42,
    "eval_every": 0, "save_every": 200, "keep_checkpoints": 1, "log_every": 10, "group_by_length": False,
    "chunk_tokens": None, "metric": None, "device": "auto", "sampling": "epoch", "shuffle_window": 0,
    "sampling_alpha": 0.5, "dynamic_weights_every": 0, "dynamic_weights_smoothing": 0.5,
    "dynamic_weights_relative": False, "resume": False, "allow_data_change": False, "quiet": False,
    "keep_training_state": False, "mini_batch_size": 0, "gradient_checkpointing": False, "gather_negatives": True,
    "lora_r": 0, "lora_alpha": None, "lora_dropout": 0.0, "lora_targets": "all-linear", "merge_lora": False,
    "ema_decay": None, "ema_start": 0, "soup_last": 0, "soup_every": 0, "l2sp": 0.0, "wise_ft": None,
    "lines": None, "ewc": 0.0, "ewc_texts": 2048,
    "adapter_name": None,  # added since (#52: task adapters)
}  # fmt: skip
# the flags `embforge train` generated from it
FLAGS = [
    "--adapter-name", "--allow-data-change", "--amp", "--batch-size", "--chunk-tokens", "--device", "--ema-decay", "--ema-start",
    "--epochs", "--eval-every", "--ewc", "--gather-negatives", "--grad-accum", "--gradient-checkpointing",
    "--group-by-length", "--keep-training-state", "--l2sp", "--layer-lr-decay", "--lines", "--lora-alpha",
    "--lora-dropout", "--lora-r", "--lora-targets", "--lr", "--max-grad-norm", "--max-steps", "--merge-lora",
    "--mini-batch-size", "--output", "--quiet", "--resume", "--save-every", "--seed", "--shuffle-window",
    "--soup-every", "--soup-last", "--warmup-ratio", "--weight-decay", "--wise-ft",
]  # fmt: skip
# a run file of the flat config, one value off its default in every part
OLD_RUN = """
train = ["pairs.csv"]
output = "runs/old"
lr = 1e-4
batch_size = 16
amp = "no"
mini_batch_size = 8
sampling = "temperature"
shuffle_window = 64
eval_every = 5
metric = "spearman"
save_every = 10
keep_training_state = true
lora_r = 4
lora_targets = "query,value"
dynamic_weights_every = 3
ema_decay = 0.9
l2sp = 100.0
wise_ft = 0.5
"""


def test_every_flat_name_lives_in_exactly_one_place_with_its_old_default():
    homes = [item.name for _, item in flat_fields(TrainConfig)]
    assert len(homes) == len(set(homes)) == len(FLAT_FIELDS)
    assert TrainConfig().flat() == FLAT_DEFAULTS  # the same names, the same defaults


def test_the_flags_are_the_flat_configs():
    assert sorted(info.flag_of(item.name) for item, info in described(TrainConfig)) == FLAGS


def test_a_flat_run_file_fills_the_parts(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(OLD_RUN)
    config = spec_from_dict(load_toml(path), source=str(path)).config
    assert (config.output, config.optim.lr, config.optim.batch_size) == ("runs/old", 1e-4, 16)
    assert (config.scale.amp, config.scale.mini_batch_size) == ("no", 8)
    assert (config.data.sampling, config.data.shuffle_window) == ("temperature", 64)
    assert (config.evaluation.eval_every, config.evaluation.metric) == (5, "spearman")
    assert (config.checkpoints.save_every, config.checkpoints.keep_training_state) == (10, True)
    assert config.lora.adapter().r == 4 and config.lora.adapter().targets == "query,value"
    assert config.weighting == DynamicWeighting(dynamic_weights_every=3)
    assert config.averaging == Averaging(ema_decay=0.9)
    assert config.anchor == Anchoring(l2sp=100.0, wise_ft=0.5)
    assert TrainConfig(**config.flat()) == config  # the flat fields give the config back


def test_a_flat_pipeline_file_fills_every_stages_parts(tmp_path):
    values = {
        "defaults": {"lr": 1e-4, "ema_decay": 0.5},
        "stages": [
            {"name": "a", "steps": 3, "tasks": [{"data": "x.csv", "loss": "cosent"}]},
            {"name": "b", "l2sp": 10.0, "tasks": [{"data": "x.csv", "loss": "cosent"}]},
        ],
    }
    first, second = parse_pipeline(values, base_dir=tmp_path).stages
    assert (first.config.optim.lr, first.config.optim.max_steps, first.config.averaging.ema_decay) == (
        1e-4,
        3,
        0.5,
    )
    assert second.config.anchor.l2sp == 10.0 and first.config.anchor.l2sp == 0.0


def test_parts_and_flat_names_combine():
    config = TrainConfig(optim=Optimisation(lr=1e-3, batch_size=8), lr=2e-3, output="x")
    assert (config.optim.lr, config.optim.batch_size, config.output) == (2e-3, 8, "x")
    changed = config.changed(batch_size=4, resume=True)
    assert (changed.optim.lr, changed.optim.batch_size, changed.checkpoints.resume) == (2e-3, 4, True)
    assert config.optim.batch_size == 8 and not config.checkpoints.resume  # a copy
    assert dataclasses.replace(config, ema_decay=0.5).averaging.ema_decay == 0.5
    assert TrainConfig(optim={"lr": 1e-3}).optim.lr == 1e-3


def test_each_part_checks_itself():
    with pytest.raises(ValueError, match="choose one weight average"):
        Averaging(ema_decay=0.5, soup_last=2)
    with pytest.raises(ValueError, match="wise_ft must be in"):
        Anchoring(wise_ft=1.5)
    with pytest.raises(ValueError, match="dynamic_weights_smoothing must be"):
        DynamicWeighting(dynamic_weights_smoothing=2.0)
    with pytest.raises(ValueError, match="layer_lr_decay must be"):
        TrainConfig(layer_lr_decay=0.0)


def test_a_flat_name_read_on_the_whole_config_names_its_part():
    config = TrainConfig()
    with pytest.raises(AttributeError, match=r"TrainConfig\.lr is now TrainConfig\.optim\.lr"):
        _ = config.lr  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match=r"TrainConfig\.shuffle_window is now TrainConfig\.data\."):
        config.shuffle_window = 64  # type: ignore[attr-defined]
    with pytest.raises(
        TypeError, match="TrainConfig has no field 'lrate'; its fields: adapter_name, allow_data_change"
    ):
        TrainConfig(lrate=1.0)
