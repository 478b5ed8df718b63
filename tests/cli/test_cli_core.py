"""The ``embforge`` command: --help everywhere, JSON last lines, and the STS evaluator against scipy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from embforge.cli import build_parser, main
from embforge.data.tables import read_table
from embforge.encoder import Encoder
from embforge.evaluate.sts import evaluate_sts
from tests.conftest import requires_data, requires_minilm, shared_data


def _all_verb_paths():
    parser = build_parser()
    paths = []
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for name, sub in action.choices.items():
            paths.append([name])
            for sub_action in getattr(sub, "_subparsers", None)._group_actions if sub._subparsers else []:
                paths.extend([name, kind] for kind in sub_action.choices)
    return paths


@pytest.mark.parametrize("path", _all_verb_paths(), ids=" ".join)
def test_every_verb_has_help(path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*path, "--help"])
    assert exit_info.value.code == 0
    assert "usage: embforge" in capsys.readouterr().out


def last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_train_eval_encode_from_the_command_line(tmp_path, tiny_model_dir, sts_csv, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--model",
            str(tiny_model_dir),
            "--train",
            str(sts_csv),
            "--eval",
            str(sts_csv),
            "--output",
            str(out),
            "--batch-size",
            "8",
            "--lr",
            "1e-3",
            "--quiet",
        ]
    )
    assert code == 0
    summary = last_json(capsys)
    assert summary["steps"] == 4 and summary["best"]["step"] == 4
    assert main(["eval", "sts", "--model", str(out), "--data", str(sts_csv)]) == 0
    metrics = last_json(capsys)
    assert metrics["spearman"] == pytest.approx(summary["final"]["spearman"])
    texts = tmp_path / "texts.txt"
    texts.write_text("a cat\na dog\n")
    assert (
        main(["encode", "--model", str(out), "--input", str(texts), "--output", str(tmp_path / "e.npy")]) == 0
    )
    emb = np.load(tmp_path / "e.npy")
    np.testing.assert_allclose(emb, Encoder.load(out).encode(["a cat", "a dog"]), atol=1e-6)


def test_toml_config_and_flag_override(tmp_path, tiny_model_dir, sts_csv, capsys):
    config = tmp_path / "run.toml"
    config.write_text(
        f'model = "{tiny_model_dir}"\ntrain = ["{sts_csv}"]\nloss = "mse"\nbatch_size = 16\n'
        f'output = "{tmp_path / "out"}"\nquiet = true\n'
    )
    assert main(["train", "--config", str(config), "--epochs", "2"]) == 0
    assert last_json(capsys)["steps"] == 4  # 32 rows / 16 per batch * 2 epochs
    config.write_text("batch_sise = 3\n")
    assert main(["train", "--config", str(config)]) == 2
    assert "unknown key(s) batch_sise" in capsys.readouterr().err


def test_sts_evaluator_matches_scipy(tiny_encoder, sts_csv):
    data = read_table(sts_csv)
    metrics = evaluate_sts(tiny_encoder, data)
    a = tiny_encoder.encode(data.columns["sentence1"])
    b = tiny_encoder.encode(data.columns["sentence2"])
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert metrics["spearman"] == pytest.approx(100 * spearmanr(cosine, data.labels()).statistic, abs=1e-4)
    assert metrics["pearson"] == pytest.approx(100 * pearsonr(cosine, data.labels()).statistic, abs=1e-4)
    dist = -np.linalg.norm(a - b, axis=1)
    assert metrics["spearman_euclidean"] == pytest.approx(
        100 * spearmanr(dist, data.labels()).statistic, abs=1e-4
    )


@pytest.mark.integration
@requires_minilm
@requires_data
def test_zero_shot_minilm_on_stsb_test(capsys):
    assert main(["eval", "sts", "--data", str(shared_data() / "stsb_en" / "stsb-en-test.csv")]) == 0
    assert last_json(capsys)["spearman"] == pytest.approx(82.03, abs=0.01)


def test_train_takes_the_cached_step_and_checkpointing_flags(tmp_path, tiny_model_dir, sts_csv, capsys):
    """``--mini-batch-size`` and ``--gradient-checkpointing`` (issue #13) reach the run's TrainConfig."""
    out = tmp_path / "out"
    flags = f"--model {tiny_model_dir} --train {sts_csv} --output {out} --loss infonce --batch-size 16"
    flags += " --mini-batch-size 4 --gradient-checkpointing --max-steps 1 --quiet"
    code = main(["train", *flags.split()])
    assert code == 0
    card = next(out.rglob("README.md")).read_text()
    assert "mini_batch_size" in card and "gradient_checkpointing" in card
    settings = {
        line.split("|")[1].strip(" `"): line.split("|")[2].strip(" `")
        for line in card.splitlines()
        if line.count("|") >= 3
    }
    assert (settings.get("mini_batch_size"), settings.get("gradient_checkpointing")) == ("4", "True")
