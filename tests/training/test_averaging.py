"""Weight averaging within a run (EMA, soup of the last k checkpoints): the final model is the average."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from embforge.cli import main
from embforge.data.tables import read_table
from embforge.encoder import Encoder
from embforge.losses import get_loss
from embforge.training.averaging import WeightAverage
from embforge.training.config import TrainConfig
from embforge.training.extras import Averaged, build_extras
from embforge.training.loop import train
from embforge.training.tasks import Task
from tests.conftest import make_bert, make_tokenizer

STEPS = 6


def _model() -> Encoder:
    tokenizer = make_tokenizer()
    return Encoder(make_bert(len(tokenizer), seed=0), tokenizer, pooling="mean", max_seq_length=64)


def _run(out: Path, sts_csv: Path, *, on_step=None, resume: bool = False, **options) -> tuple[Encoder, dict]:
    config = TrainConfig(
        output=str(out), batch_size=4, lr=1e-3, quiet=True, amp="no", device="cpu", resume=resume,
        **{"max_steps": STEPS, "save_every": 0, **options},
    )  # fmt: skip
    model = _model()
    data = read_table(sts_csv, columns="0=sentence1,1=sentence2,2=score")
    summary = train(model, [Task("sts", data, get_loss("cosent"))], config, on_step=on_step)
    return model, summary


def crash_after_checkpoint_2(out: Path, sts_csv: Path, **options) -> None:
    """A run of ``options`` (``save_every=2``) killed at step 3, after its checkpoint-2 (a resume starts there)."""

    def crash(step: int) -> None:
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(out, sts_csv, on_step=crash, **options)


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}


@pytest.fixture
def trajectory(tmp_path, sts_csv) -> dict[int, dict[str, torch.Tensor]]:
    """The plain run's weights after every step (averaging never changes the steps, only the final model)."""
    states: dict[int, dict[str, torch.Tensor]] = {}
    model = _model()
    data = read_table(sts_csv, columns="0=sentence1,1=sentence2,2=score")
    config = TrainConfig(
        output=str(tmp_path / "plain"), max_steps=STEPS, batch_size=4, lr=1e-3, quiet=True, amp="no",
        device="cpu", save_every=0,
    )  # fmt: skip
    train(
        model,
        [Task("sts", data, get_loss("cosent"))],
        config,
        on_step=lambda s: states.update({s: _weights(model)}),
    )
    return states


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 0.0) -> None:
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0 if atol == 0 else 1e-5, msg=k)


def test_ema_with_decay_0_is_the_plain_run(tmp_path, sts_csv, trajectory):
    model, summary = _run(tmp_path / "ema0", sts_csv, ema_decay=0.0)
    _assert_equal(_weights(model), trajectory[STEPS])
    assert summary["averaged"] == {"kind": "ema", "decay": 0.0, "start": 0, "count": STEPS}


def test_ema_equals_the_hand_average_from_its_start_step(tmp_path, sts_csv, trajectory):
    model, _ = _run(tmp_path / "ema", sts_csv, ema_decay=0.5, ema_start=3)
    expected = {k: v.clone() for k, v in trajectory[3].items()}
    for step in range(4, STEPS + 1):
        expected = {k: 0.5 * expected[k] + 0.5 * trajectory[step][k] for k in expected}
    _assert_equal(_weights(model), expected, atol=1e-6)
    assert not torch.equal(_weights(model)["backbone.embeddings.word_embeddings.weight"],
                           trajectory[STEPS]["backbone.embeddings.word_embeddings.weight"])  # fmt: skip


def test_soup_equals_the_mean_of_the_last_k_checkpoint_steps(tmp_path, sts_csv, trajectory):
    model, summary = _run(tmp_path / "soup", sts_csv, soup_last=3, save_every=2)  # steps 2, 4, 6
    assert summary["averaged"]["steps"] == [2, 4, 6]
    expected = {k: (trajectory[2][k] + trajectory[4][k] + trajectory[6][k]) / 3 for k in trajectory[6]}
    _assert_equal(_weights(model), expected, atol=1e-6)
    saved = _weights(Encoder.load(tmp_path / "soup"))  # the saved model is the soup too
    _assert_equal(saved, expected, atol=1e-6)
    log = [json.loads(line) for line in (tmp_path / "soup" / "metrics.jsonl").read_text().splitlines()]
    assert {"event": "averaged", "kind": "soup", "steps": [2, 4, 6], "count": 3} in log
    assert "| `soup_last` | `3` |" in (tmp_path / "soup" / "README.md").read_text()  # the model card says so


def test_resume_restores_the_ema_state(tmp_path, sts_csv):
    full, _ = _run(tmp_path / "full", sts_csv, ema_decay=0.7, ema_start=1, save_every=2)
    # killed after checkpoint-2: the resumed run must start from its EMA, not from the weights
    crash_after_checkpoint_2(tmp_path / "crash", sts_csv, ema_decay=0.7, ema_start=1, save_every=2)
    state = torch.load(tmp_path / "crash" / "checkpoints" / "checkpoint-2" / "trainer_state.pt")
    assert state["averaging"]["count"] == 2
    resumed, _ = _run(tmp_path / "crash", sts_csv, resume=True, ema_decay=0.7, ema_start=1, save_every=2)
    _assert_equal(_weights(resumed), _weights(full), atol=1e-5)


def test_soup_members_count_back_from_the_last_step():
    average = WeightAverage(_model(), total_steps=10, soup_last=3, soup_every=4)
    assert average.members() == [2, 6, 10]
    assert WeightAverage(_model(), total_steps=5, soup_last=9, soup_every=2).members() == [1, 3, 5]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ema_decay": 1.0}, "ema_decay must be in"),
        ({"ema_decay": 0.9, "soup_last": 2}, "not both"),
        ({"soup_last": -1}, ">= 0"),
    ],
)
def test_bad_averaging_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**options)


def cli_summary(out: Path, model_dir: Path, sts_csv: Path, *flags: str) -> dict:
    """``embforge train`` of 2 steps on the tiny model with ``flags``; its ``train_summary.json``."""
    code = main([
        "train", "--model", str(model_dir), "--train", str(sts_csv), "--columns",
        "0=sentence1,1=sentence2,2=score", "--output", str(out), "--max-steps", "2", "--batch-size", "4",
        "--device", "cpu", "--amp", "no", "--save-every", "0", *flags,
    ])  # fmt: skip
    assert code in (0, None)
    return json.loads((out / "train_summary.json").read_text())


def test_cli_flags_reach_the_config(tmp_path, tiny_model_dir, sts_csv):
    summary = cli_summary(tmp_path / "cli", tiny_model_dir, sts_csv, "--ema-decay", "0.9", "--ema-start", "1")
    assert summary["averaged"] == {"kind": "ema", "decay": 0.9, "start": 1, "count": 2}


def _trajectory_average(model: nn.Module, **options) -> tuple[Averaged, dict[int, dict[str, torch.Tensor]]]:
    """The run's weight average (``options``) fed 8 seeded steps of random moves of ``model``; the weights after
    each step."""
    (extra,) = build_extras(model, [], TrainConfig(**options), total_steps=8)
    assert isinstance(extra, Averaged)
    generator = torch.Generator().manual_seed(0)
    states = {}
    for step in range(1, 9):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator), alpha=1e-2)
        states[step] = _weights(model)
        extra.after_step(model, step=step, lr=1e-3)
    return extra, states


def test_the_ema_is_the_hand_ema_of_the_weights_after_each_step():
    """The EMA of torch.optim.swa_utils (issue #50) is the float64 hand EMA within float32 rounding."""
    model = _model()
    extra, states = _trajectory_average(model, ema_decay=0.8, ema_start=3)
    extra.at_end(model)
    expected = {k: v.double() for k, v in states[3].items()}
    for step in range(4, 9):
        expected = {k: 0.8 * expected[k] + 0.2 * states[step][k].double() for k in expected}
    _assert_equal(_weights(model), {k: v.float() for k, v in expected.items()}, atol=1e-6)
    assert extra.describe() == {"kind": "ema", "decay": 0.8, "start": 3, "count": 6}


def test_an_average_saved_as_a_name_to_tensor_map_resumes():
    """A checkpoint's ``averaging`` entry (``{"count", "average": {weight name: float32 tensor}}``, as every
    embforge version wrote it) restores the average; its state is saved the same way."""
    model = _model()
    extra, _ = _trajectory_average(model, ema_decay=0.5)
    state = extra.state_dict()
    assert state["count"] == 8 and set(state["average"]) >= {n for n, _ in model.named_parameters()}
    saved = {"count": 8, "average": {k: v.clone() + 1.0 for k, v in state["average"].items()}}
    other = _model()
    (restored,) = build_extras(other, [], TrainConfig(ema_decay=0.5), total_steps=8)
    restored.load_state_dict(saved)
    restored.at_end(other)
    params = dict(other.named_parameters())
    for name, param in params.items():
        torch.testing.assert_close(param.detach(), saved["average"][name], msg=name)
    assert restored.describe()["count"] == 8
