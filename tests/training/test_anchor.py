"""The anchor to the starting weights (embforge/training/anchor.py): L2-SP after every step, WiSE-FT at the end."""

from __future__ import annotations

import pytest
import torch

from embforge.encoder import Encoder
from embforge.training.config import TrainConfig
from tests.training.test_averaging import (  # noqa: F401 (trajectory: a fixture)
    STEPS,
    _assert_equal,
    _model,
    _run,
    _weights,
    cli_summary,
    crash_after_checkpoint_2,
    trajectory,
)

WORDS = "backbone.embeddings.word_embeddings.weight"


def _start() -> dict[str, torch.Tensor]:
    return _weights(_model())  # every run starts from the same seeded tiny model


def test_wise_ft_0_gives_back_the_starting_weights_and_saves_them(tmp_path, sts_csv):
    model, summary = _run(tmp_path / "w0", sts_csv, wise_ft=0.0)
    _assert_equal(_weights(model), _start())
    _assert_equal(_weights(Encoder.load(tmp_path / "w0")), _start())
    assert summary["anchored"]["wise_ft"] == 0.0


def test_wise_ft_is_the_linear_mix_of_the_start_and_the_plain_run(tmp_path, sts_csv, trajectory):  # noqa: F811
    model, _ = _run(tmp_path / "w", sts_csv, wise_ft=0.25)
    start = _start()
    expected = {k: 0.75 * start[k] + 0.25 * trajectory[STEPS][k] for k in start}
    _assert_equal(_weights(model), expected, atol=1e-6)


def test_lines_scales_each_weights_change_by_its_depth(tmp_path, sts_csv, trajectory):  # noqa: F811
    """LiNeS: the embeddings keep ``lines`` of their change, layer l of L ``a + (1 - a)(l + 1)/L``, the last layer
    all of it — the same weights ``embforge merge --layer-scaling`` gives from the plain run and the start."""
    from embforge.merge import merge_state_dicts

    model, summary = _run(tmp_path / "lines", sts_csv, lines=0.25)
    start, plain = _start(), trajectory[STEPS]
    merged = merge_state_dicts([plain], [1.0], method="task_arithmetic", base=start, layer_scaling=0.25)
    _assert_equal(_weights(model), merged, atol=1e-6)
    layers = _layers(start)
    for key, share in [(WORDS, 0.25), (_layer_key(0), 0.25 + 0.75 / layers), (_layer_key(layers - 1), 1.0)]:
        expected = start[key] + share * (plain[key] - start[key])
        torch.testing.assert_close(_weights(model)[key], expected, atol=1e-6, rtol=1e-5)
    assert summary["anchored"]["lines"] == 0.25


def test_lines_and_wise_ft_multiply(tmp_path, sts_csv, trajectory):  # noqa: F811
    model, _ = _run(tmp_path / "both", sts_csv, lines=0.0, wise_ft=0.5)
    start, plain, weights = _start(), trajectory[STEPS], _weights(model)
    torch.testing.assert_close(weights[WORDS], start[WORDS], atol=0, rtol=0)  # depth 0 at lines 0: the start
    last = _layer_key(_layers(start) - 1)  # depth 1: half its change (wise_ft)
    torch.testing.assert_close(
        weights[last], start[last] + 0.5 * (plain[last] - start[last]), atol=1e-6, rtol=0
    )


def _layers(weights: dict[str, torch.Tensor]) -> int:
    return 1 + max(int(k.split("layer.")[1].split(".")[0]) for k in weights if "layer." in k)


def _layer_key(layer: int) -> str:
    return f"backbone.encoder.layer.{layer}.attention.self.query.weight"


def test_one_l2sp_step_pulls_lr_times_lambda_of_the_way_back(tmp_path, sts_csv):
    plain, _ = _run(tmp_path / "plain1", sts_csv, max_steps=1)
    anchored, _ = _run(tmp_path / "l2sp1", sts_csv, max_steps=1, l2sp=200.0)
    start, moved = _start(), _weights(plain)
    rate = 1e-3 * 200.0  # the step's learning rate (no warm-up in a 1-step run) times lambda
    expected = {k: moved[k] + rate * (start[k] - moved[k]) for k in start}
    _assert_equal(_weights(anchored), expected, atol=1e-6)
    assert not torch.equal(_weights(anchored)[WORDS], moved[WORDS])


def test_an_l2sp_run_ends_nearer_the_start_than_the_plain_run(tmp_path, sts_csv, trajectory):  # noqa: F811
    anchored, _ = _run(tmp_path / "l2sp", sts_csv, l2sp=100.0)
    start = _start()

    def distance(weights: dict[str, torch.Tensor]) -> float:
        return sum(float((weights[k] - start[k]).norm() ** 2) for k in start) ** 0.5

    assert distance(_weights(anchored)) < 0.9 * distance(trajectory[STEPS])


def test_resume_pulls_toward_the_run_start_not_the_checkpoint(tmp_path, sts_csv):
    options = {"l2sp": 100.0, "wise_ft": 0.5, "save_every": 2}
    full, _ = _run(tmp_path / "full", sts_csv, **options)
    crash_after_checkpoint_2(tmp_path / "crash", sts_csv, **options)
    state = torch.load(tmp_path / "crash" / "checkpoints" / "checkpoint-2" / "trainer_state.pt")
    torch.testing.assert_close(state["anchor"]["starts"][WORDS], _start()[WORDS], rtol=0, atol=0)
    resumed, _ = _run(tmp_path / "crash", sts_csv, resume=True, **options)
    _assert_equal(_weights(resumed), _weights(full), atol=1e-5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"l2sp": -1.0}, "l2sp must be a finite number >= 0"),
        ({"wise_ft": 1.5}, r"wise_ft must be in \[0, 1\]"),
        ({"lines": -0.1}, r"lines must be in \[0, 1\]"),
    ],
)
def test_bad_anchor_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**options)


def test_cli_flags_reach_the_config(tmp_path, tiny_model_dir, sts_csv):
    summary = cli_summary(
        tmp_path / "cli", tiny_model_dir, sts_csv, "--l2sp", "500", "--wise-ft", "0.8", "--lines", "0.5"
    )
    assert summary["anchored"]["l2sp"] == 500.0 and summary["anchored"]["wise_ft"] == 0.8
    assert summary["anchored"]["lines"] == 0.5
