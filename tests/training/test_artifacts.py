"""A finished run keeps the model, not the training state (issue #16: one STS-B run took 435 MB)."""

from __future__ import annotations

import json

import numpy as np

from embforge.cli import build_parser, main
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
    assert spec_from_dict({"keep_training_state": True}).config.checkpoints.keep_training_state is True
    assert TrainConfig().checkpoints.keep_training_state is False


def _cli_train(tiny_model_dir, sts_csv, out, *extra):
    args = ["train", "--model", str(tiny_model_dir), "--train", str(sts_csv), "--output", str(out)]
    return main([*args, "--max-steps", "2", "--batch-size", "8", "--save-every", "1", "--quiet", *extra])


def test_a_used_output_folder_is_refused_without_resume_or_overwrite(
    tmp_path, tiny_model_dir, sts_csv, capsys
):
    out = tmp_path / "run"
    assert _cli_train(tiny_model_dir, sts_csv, out, "--eval", str(sts_csv)) == 0
    assert (out / "best").is_dir()
    before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert _cli_train(tiny_model_dir, sts_csv, out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(out) in err and "--resume" in err and "--overwrite" in err
    assert (out / "metrics.jsonl").read_text() == before  # nothing written, nothing mixed
    # --overwrite: the previous run's files are gone (best/ of a run with --eval too), a link's target is kept
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    (out / "link").symlink_to(elsewhere, target_is_directory=True)
    assert _cli_train(tiny_model_dir, sts_csv, out, "--overwrite") == 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2] and not (out / "best").exists() and not (out / "link").exists()
    assert (elsewhere / "keep.txt").read_text() == "mine"
    # --resume continues the run there (here: finished, nothing to do); both flags at once are refused
    assert _cli_train(tiny_model_dir, sts_csv, out, "--resume") == 0
    capsys.readouterr()
    assert _cli_train(tiny_model_dir, sts_csv, out, "--resume", "--overwrite") == 2
    assert "pass one of them" in capsys.readouterr().err


def test_overwrite_clears_only_a_previous_runs_folder(tmp_path, tiny_model_dir, sts_csv, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("not a run")
    assert _cli_train(tiny_model_dir, sts_csv, notes, "--overwrite") == 2
    err = capsys.readouterr().err
    assert str(notes) in err and "no previous run" in err
    assert (notes / "todo.txt").read_text() == "not a run"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _cli_train(tiny_model_dir, sts_csv, empty) == 0  # an empty folder is a new run's


def test_a_pipeline_output_is_refused_and_overwritten_the_same_way(tmp_path, tiny_model_dir, sts_csv, capsys):
    from tests.training.test_pipeline import write_pipeline

    path = write_pipeline(tmp_path, tiny_model_dir, sts_csv)
    out = tmp_path / "piped"
    assert main(["train", str(path), "--output", str(out)]) == 0
    (out / "stray.txt").write_text("left by hand")
    capsys.readouterr()
    assert main(["train", str(path), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "--resume" in err and "--overwrite" in err
    assert main(["train", str(path), "--output", str(out), "--overwrite"]) == 0
    assert not (out / "stray.txt").exists() and (out / "final" / "modules.json").exists()


def test_a_run_stopped_after_mining_its_negatives_is_a_run_overwrite_empties(tmp_path):
    """A retrieval run killed after mining its first negatives (``refresh/``) but before writing anything else: a
    new run with ``--overwrite`` empties the folder like any earlier run's, not refused as someone else's files."""
    from embforge.training.artifacts import claim_output

    out = tmp_path / "run"
    (out / "refresh" / "retrieval").mkdir(parents=True)
    (out / "refresh" / "retrieval" / "negatives-0.jsonl").write_text('{"anchor": "a", "positive": "b"}\n')
    claim_output(out, resume=False, overwrite=True)
    assert list(out.iterdir()) == []
