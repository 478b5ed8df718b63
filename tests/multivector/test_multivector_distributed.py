"""torchrun with a multi-vector model: 2 gloo processes compute the gradient of one process (plain and cached step).

The token matrices are fixed-width ``(texts, width, dim)`` tensors, so the trainer's all-gather
(:func:`~embforge.training.distributed.gather_slices`) and the cached step carry them like dense embeddings.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.distributed_helpers import save_step_gradients, spawn

ROWS = [
    ("a cat plays", "a cat plays the piano."),
    ("the dog runs", "a dog runs, kicks a ball!"),
    ("stock market", "the stock market rises"),
    ("oil price", "oil price falls"),
    ("a woman sings", "a woman sings a song"),
    ("red car", "a red car drives on the road"),
    ("a child reads", "a child reads a book"),
    ("the sun", "the sun in the sky"),
]


def one_step(model_dir: str, data: str, output: str) -> None:
    """Plain and cached step on all rows (sharded under torchrun); rank 0 saves the model's gradients."""
    from embforge.data.tables import read_table
    from embforge.losses.late import MaxSimInfoNCELoss
    from embforge.multivector import MultiVectorEncoder
    from embforge.training.tasks import Task, prepare

    model = MultiVectorEncoder.load(model_dir)
    task = prepare(Task("pairs", read_table(data), MaxSimInfoNCELoss()), model)
    save_step_gradients(model, task, tuple(range(len(ROWS))), output, mini_batch_size=3)


def test_two_processes_compute_the_gradient_of_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    from embforge.multivector import MultiVectorEncoder

    model = MultiVectorEncoder.load(tiny_model_dir, dim=16)
    model.backbone.config.hidden_dropout_prob = model.backbone.config.attention_probs_dropout_prob = 0.0
    model.settings.query_length, model.settings.document_length = 8, 24
    model.save(tmp_path / "colbert")
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"anchor": q, "positive": d}) + "\n" for q, d in ROWS))
    spawn(one_step, str(tmp_path / "colbert"), str(data), str(tmp_path / "two"), world=2)
    one_step(str(tmp_path / "colbert"), str(data), str(tmp_path / "one"))
    for mode in ("plain", "cached"):
        two, one = torch.load(tmp_path / "two" / f"{mode}.pt"), torch.load(tmp_path / "one" / f"{mode}.pt")
        assert two.keys() == one.keys() and "projection.linear.weight" in one
        for name, grad in one.items():
            torch.testing.assert_close(two[name], grad, atol=1e-6, rtol=1e-4, msg=f"{mode} {name}")
