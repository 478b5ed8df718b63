"""The library's configs refuse what the CLI refuses (issue #48): NaN, the infinities and out-of-range numbers in
``TrainConfig`` and ``ServeConfig``, from Python and from TOML files, in one line naming the field (and the file)."""

from __future__ import annotations

import math

import pytest

from embforge.serve.config import ServeConfig
from embforge.training.config import TrainConfig, planned_steps
from embforge.training.pipeline_file import PipelineError, load_pipeline
from embforge.training.run import spec_from_dict

NAN, INF = math.nan, math.inf

# (config class, field, a value it must refuse)
REFUSED = [
    (TrainConfig, "lr", NAN),
    (TrainConfig, "lr", INF),
    (TrainConfig, "lr", 0.0),
    (TrainConfig, "warmup_ratio", NAN),
    (TrainConfig, "warmup_ratio", 1.5),
    (TrainConfig, "warmup_ratio", -0.1),
    (TrainConfig, "weight_decay", NAN),
    (TrainConfig, "weight_decay", -0.01),
    (TrainConfig, "weight_decay", INF),
    (TrainConfig, "max_grad_norm", NAN),
    (TrainConfig, "max_grad_norm", -1.0),
    (TrainConfig, "max_steps", 0),
    (TrainConfig, "max_steps", -5),
    (TrainConfig, "max_steps", 2.5),
    (TrainConfig, "save_every", -1),
    (TrainConfig, "eval_every", -1),
    (TrainConfig, "log_every", 0),
    (TrainConfig, "epochs", True),
    (TrainConfig, "batch_size", 0),
    (TrainConfig, "layer_lr_decay", NAN),
    (TrainConfig, "l2sp", NAN),
    (TrainConfig, "l2sp", -1.0),
    (TrainConfig, "ewc", NAN),
    (TrainConfig, "ewc", INF),
    (TrainConfig, "lora_alpha", NAN),
    (TrainConfig, "seed", -1),
    (ServeConfig, "max_wait_ms", NAN),
    (ServeConfig, "max_wait_ms", -1.0),
    (ServeConfig, "request_timeout_s", NAN),
    (ServeConfig, "request_timeout_s", 0.0),
    (ServeConfig, "header_timeout_s", NAN),
    (ServeConfig, "body_timeout_s", NAN),
    (ServeConfig, "keep_alive_s", NAN),
    (ServeConfig, "keep_alive_s", INF),
    (ServeConfig, "max_batch_size", 0),
]


@pytest.mark.parametrize(("kind", "name", "value"), REFUSED, ids=lambda v: str(v))
def test_a_value_out_of_range_is_refused_naming_the_field(kind, name, value):
    with pytest.raises(ValueError, match=rf"\b{name} must be ") as info:
        kind(**{name: value})
    assert f"got {value!r}" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("kind", "values"),
    [
        (TrainConfig, {"max_steps": None, "warmup_ratio": 0.0, "weight_decay": 0, "max_grad_norm": 0.0}),
        (TrainConfig, {"max_steps": 1, "warmup_ratio": 1.0, "save_every": 0, "eval_every": 0, "l2sp": 0}),
        (TrainConfig, {"lr": 1, "chunk_tokens": None, "lora_alpha": None}),
        (ServeConfig, {"max_wait_ms": 0.0, "request_timeout_s": 0.5, "keep_alive_s": 1}),
    ],
)
def test_values_in_range_are_kept(kind, values):
    config = kind(**values)
    # TrainConfig is made of parts: its flat fields
    fields = config.flat() if isinstance(config, TrainConfig) else vars(config)
    assert {k: fields[k] for k in values} == values


def test_planned_steps_takes_max_steps_as_given():
    config = TrainConfig(max_steps=1, batch_size=2)
    assert planned_steps([100], config) == 1
    config.optim.max_steps = 0  # set after construction: never a full epoch in its place
    with pytest.raises(ValueError, match="max_steps must be a positive integer, got 0"):
        planned_steps([100], config)


def test_a_config_file_is_named_with_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"^run\.toml: lr must be a finite number > 0, got nan$"):
        spec_from_dict({"lr": NAN}, source="run.toml")


def test_a_pipeline_file_is_named_with_the_stage_and_field(tmp_path):
    path = tmp_path / "pipe.toml"
    path.write_text(
        '[[stages]]\nname = "one"\nwarmup_ratio = nan\n'
        '[[stages.tasks]]\nname = "sts"\ndata = "x.csv"\nloss = "cosent"\n'
    )
    with pytest.raises(
        PipelineError, match=r"pipe\.toml: stage 1 \('one'\): warmup_ratio must be a number in \[0, 1\]"
    ):
        load_pipeline(path)
