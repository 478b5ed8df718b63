"""The loop reads the loss from the device only when it logs (or evaluates, or saves): no sync per micro-step, as
nanoGPT does; a loss that is NaN or infinite still stops the run, naming its step and task, before a checkpoint."""

from __future__ import annotations

import pytest
import torch

from embforge.data.tables import read_table
from embforge.encoder import Encoder
from embforge.losses import CoSENTLoss
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.tasks import Task

READS = ("item", "tolist", "__bool__", "__float__")  # what makes the host wait for a tensor's value


def _config(out, **fields) -> TrainConfig:
    return TrainConfig(
        output=str(out),
        batch_size=4,
        lr=1e-3,
        quiet=True,
        amp="no",
        device="cpu",
        **{"save_every": 0, **fields},
    )


def test_the_loss_is_read_only_at_the_steps_that_log(tmp_path, tiny_model_dir, sts_csv, monkeypatch):
    step = [1]  # the step being taken
    reads: list[int] = []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            # the micro-step's dropout seed is an integer drawn on the CPU: not a read of the device
            if self.is_floating_point():
                reads.append(step[0])
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    data = read_table(sts_csv, columns="0=sentence1,1=sentence2,2=score")
    config = _config(tmp_path / "run", max_steps=8, log_every=4, grad_accum=2)
    train(
        Encoder.load(tiny_model_dir),
        [Task("sts", data, CoSENTLoss())],
        config,
        on_step=lambda done: step.__setitem__(0, done + 1),
    )
    assert sorted(set(reads)) == [4, 8]  # the two log lines; nothing in the 14 other micro-steps
    assert reads.count(4) == 1  # one read for the 4 steps' 8 losses


class Diverging(CoSENTLoss):
    """CoSENT whose third call (step 3's loss) is NaN."""

    calls = 0

    def forward(self, embeddings, labels):
        self.calls += 1
        loss = super().forward(embeddings, labels)
        return loss * float("nan") if self.calls == 3 else loss


def test_a_nan_loss_stops_the_run_naming_its_step_and_task_before_a_checkpoint(
    tmp_path, tiny_model_dir, sts_csv
):
    data = read_table(sts_csv, columns="0=sentence1,1=sentence2,2=score")
    config = _config(tmp_path / "run", max_steps=8, log_every=100, save_every=4, keep_training_state=True)
    with pytest.raises(FloatingPointError, match=r"loss became nan at step 3 \(task 'sts'\)"):
        train(Encoder.load(tiny_model_dir), [Task("sts", data, Diverging())], config)
    assert not (tmp_path / "run" / "checkpoints" / "checkpoint-4").exists()  # checked before it is written
