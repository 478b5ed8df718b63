"""The loop's Progress keeps the on-disk ``progress.json`` of earlier versions, so their checkpoints resume."""

from __future__ import annotations

import json

from embforge.data.tables import read_table
from embforge.encoder import Encoder
from embforge.losses import get_loss
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.state import Progress
from embforge.training.tasks import Task

# checkpoint-5/progress.json as the loop that kept its progress in a dict of strings wrote it (two tasks,
# loss-share task weights, an evaluator), plus a refresh step and a key this version does not know
EARLIER = """{
  "step": 5,
  "epoch": 0,
  "position": 5,
  "best": {"step": 3, "metric": "spearman", "value": 1.0},
  "pairs": 40,
  "cursors": [2, 3],
  "dynamic_weights": {
    "weights": [0.5292877644834442, 0.4707122355165558],
    "sums": [3.031151294708252, 0.0],
    "counts": [1, 0],
    "means": [3.2029666900634766, 1.2134430408477783],
    "initial": [3.2029666900634766, 1.5724356174468994]
  },
  "refreshed_at": 4,
  "run_id": "79bd9e8f8343409fa6e1dc9ac3009576",
  "written_by": "a later version"
}"""


def test_an_earlier_progress_json_reads_and_writes_back_unchanged():
    values = json.loads(EARLIER)
    progress = Progress.from_dict(values)
    assert (progress.step, progress.epoch, progress.position, progress.cursors) == (5, 0, 5, [2, 3])
    assert progress.best == {"step": 3, "metric": "spearman", "value": 1.0}
    assert progress.refreshed_at == 4 and progress.extra == {"written_by": "a later version"}
    assert json.dumps(progress.to_dict()) == json.dumps(values)  # the same keys, in the same order


def test_a_progress_without_the_optional_keys_writes_none_of_them():
    assert list(Progress(step=1, cursors=[1]).to_dict()) == [
        "step",
        "epoch",
        "position",
        "best",
        "pairs",
        "cursors",
    ]


def test_a_run_writes_progress_json_in_the_earlier_layout(tmp_path, tiny_model_dir, sts_csv):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("anchor,positive\n" + "".join(f"a{i} text,b{i} text\n" for i in range(24)))
    tasks = [
        Task("sts", read_table(sts_csv), get_loss("cosent")),
        Task("pairs", read_table(pairs), get_loss("infonce"), weight=2.0),
    ]
    config = TrainConfig(
        output=str(tmp_path / "run"),
        max_steps=5,
        batch_size=8,
        save_every=5,
        dynamic_weights_every=2,
        keep_training_state=True,
        quiet=True,
    )
    train(Encoder.load(tiny_model_dir), tasks, config, evaluator=lambda m: {"spearman": 1.0})
    written = json.loads((tmp_path / "run" / "checkpoints" / "checkpoint-5" / "progress.json").read_text())
    earlier = json.loads(EARLIER)
    del earlier["refreshed_at"], earlier["written_by"]
    assert list(written) == list(earlier)
    assert list(written["dynamic_weights"]) == list(earlier["dynamic_weights"])
    assert written["step"] == 5 and written["position"] == 5 and sum(written["cursors"]) == 5
    assert written["best"] == {"step": 5, "metric": "spearman", "value": 1.0}
    assert written["pairs"] == 40
