"""A finished run keeps the model, not the training state (issue #16: one STS-B run took 435 MB)."""

from __future__ import annotations

import numpy as np

from embforge.cli import build_parser
from embforge.data.tables import read_table
from embforge.encoder import Encoder
from embforge.evaluate.sts import sts_evaluator
from embforge.losses import get_loss
from embforge.training.artifacts import disk_bytes, finalize_run
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.run import spec_from_dict
from embforge.training.tasks import Task


def _finished_run(tiny_model_dir, sts_csv, out):
    model = Encoder.load(tiny_model_dir)
    data = read_table(sts_csv)
    # the training state kept by train() itself, so that finalize_run can be tested on it
    config = TrainConfig(
        output=str(out), batch_size=8, lr=1e-3, save_every=2, quiet=True, keep_training_state=True
    )
    train(model, [Task("sts", data, get_loss("cosent"))], config, evaluator=sts_evaluator(data))
    return model


def test_finished_run_keeps_the_model_once_and_drops_the_training_state(tmp_path, tiny_model_dir, sts_csv):
    out = tmp_path / "run"
    model = _finished_run(tiny_model_dir, sts_csv, out)
    weights = (out / "model.safetensors").stat().st_size
    before = disk_bytes(out)
    assert (out / "checkpoints").is_dir() and before > 3 * weights  # final + best + checkpoint (+ optimizer)
    kept = finalize_run(out, keep_training_state=False)
    assert kept == disk_bytes(out) < before
    assert not (out / "checkpoints").exists()
    assert kept < 1.2 * weights + 2_000_000  # the weights once, plus tokenizer and configs
    # best/ (the last step here) shares the final weights' file, and both folders still load
    assert (out / "best" / "model.safetensors").stat().st_ino == (out / "model.safetensors").stat().st_ino
    for folder in (out, out / "best"):
        np.testing.assert_allclose(Encoder.load(folder).encode(["a cat"]), model.encode(["a cat"]), atol=1e-6)


def test_keep_training_state_keeps_what_resume_needs(tmp_path, tiny_model_dir, sts_csv):
    out = tmp_path / "run"
    _finished_run(tiny_model_dir, sts_csv, out)
    finalize_run(out, keep_training_state=True)
    assert (out / "checkpoints" / "latest").exists()
    assert list((out / "checkpoints").glob("checkpoint-*/trainer_state.pt"))


def test_keep_training_state_flag_reaches_the_config():
    args = build_parser().parse_args(["train", "--train", "x.csv", "--keep-training-state"])
    assert args.keep_training_state is True
    assert spec_from_dict({"keep_training_state": True}).config.keep_training_state is True
    assert TrainConfig().keep_training_state is False
