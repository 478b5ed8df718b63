"""A ``gist`` task embeds each batch with its guide (training/tasks.py's hook): the guide's embeddings of the rows'
texts become the labels, the guide stays frozen, and the loss of the prepared task is the loss of those tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embforge.data.tables import Dataset
from embforge.encoder import Encoder
from embforge.losses import GISTLoss, get_loss
from embforge.training.tasks import Task, prepare
from tests.conftest import WORDS, make_cross_encoder, make_tokenizer


def texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 10)))) for _ in range(n)]


def pairs(n: int = 10, negatives: bool = False) -> Dataset:
    columns = {"anchor": texts(n, 1), "positive": texts(n, 2)}
    if negatives:
        columns["negative"] = texts(n, 3)
    return Dataset("memory.csv", columns, list(range(1, n + 1)))


@pytest.fixture
def guide_dir(tmp_path):
    """A guide unlike the student (another seed): its embeddings are not the student's."""
    from tests.conftest import make_bert

    tokenizer = make_tokenizer()
    guide = Encoder(
        make_bert(len(tokenizer), seed=7), tokenizer, pooling="mean", normalize=True, max_seq_length=64
    )
    guide.save(tmp_path / "guide")
    return tmp_path / "guide"


@pytest.mark.parametrize("negatives", [False, True])
def test_labels_are_the_guides_embeddings_and_the_loss_is_gists(tiny_encoder, guide_dir, negatives):
    data = pairs(negatives=negatives)
    task = Task("t", data, get_loss("gist", guide=str(guide_dir), temperature=0.05))
    prepared = prepare(task, tiny_encoder)
    rows = [0, 3, 4, 7, 9]
    labels = prepared.labels(rows)
    columns = data.text_columns
    reference = Encoder.load(guide_dir)
    expected = np.stack([reference.encode([data.columns[c][r] for r in rows]) for c in columns], axis=1)
    assert labels is not None and labels.shape == (len(rows), len(columns), reference.dim)
    np.testing.assert_allclose(labels.numpy(), expected, atol=1e-5)

    tiny_encoder.train()
    outputs = tiny_encoder(prepared.inputs(rows))
    loss = prepared.loss_fn(outputs, labels)
    by_hand = GISTLoss(temperature=0.05)(list(outputs.split(len(rows))), torch.from_numpy(expected))
    assert (
        float(loss.detach()) == pytest.approx(float(by_hand.detach()), rel=1e-5)
        and float(by_hand.detach()) > 0.01
    )
    loss.backward()
    assert any(p.grad is not None for p in tiny_encoder.parameters())
    guide = prepared.guide
    assert guide is not None and not any(p.requires_grad for p in guide.model.parameters())


def test_a_loss_without_a_guide_reads_the_datas_labels(tiny_encoder):
    prepared = prepare(Task("t", pairs(), get_loss("infonce")), tiny_encoder)
    assert prepared.guide is None and prepared.labels([0, 1]) is None


def test_a_cross_encoder_guide_is_refused(tiny_encoder, tmp_path):
    make_cross_encoder().save(tmp_path / "ce")
    with pytest.raises(ValueError, match="must be a dense or static embedding model"):
        prepare(Task("t", pairs(), get_loss("gist", guide=str(tmp_path / "ce"))), tiny_encoder)


def test_the_training_loop_runs_a_gist_task(tiny_encoder, guide_dir, tmp_path):
    from embforge.training.config import TrainConfig
    from embforge.training.loop import train

    before = {k: v.clone() for k, v in tiny_encoder.state_dict().items()}
    task = Task("t", pairs(16), get_loss("gist", guide=str(guide_dir), temperature=0.05))
    config = TrainConfig(output=str(tmp_path / "out"), max_steps=2, batch_size=8, save_every=0, quiet=True)
    summary = train(tiny_encoder, [task], config)
    assert summary["steps"] == 2
    changed = [k for k, v in tiny_encoder.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) > 10  # the student trained


def test_a_pipeline_file_s_guide_path_is_relative_to_the_file(
    tiny_model_dir, guide_dir, tmp_path, monkeypatch
):
    """``options = { guide = "guide" }`` names the folder beside the pipeline file, as ``teacher = ...`` does, not
    one in the working directory (where none is: the run failed to load it before)."""
    import json

    from embforge.cli import main
    from tests.conftest import pipeline_head

    rows = pairs(16)
    data = "".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in zip(*rows.columns.values()))
    (tmp_path / "pairs.jsonl").write_text(data)
    (tmp_path / "run.toml").write_text(
        pipeline_head(tiny_model_dir, save_every=0)
        + '[[stages]]\nname = "gist"\nsteps = 2\n  [[stages.tasks]]\n  name = "pairs"\n  data = "pairs.jsonl"\n'
        + '  loss = "gist"\n  options = { guide = "guide" }\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["train", str(tmp_path / "run.toml"), "--output", str(tmp_path / "out"), "--quiet"]) == 0
