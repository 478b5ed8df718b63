"""Checkpoints that refuse what they should (issue #15 item 5): pruning within the run, ``latest`` never dangling,
``--resume`` with nothing to resume says so, and corrupted or truncated files are caught by name."""

from __future__ import annotations

import json
import re
import shutil
import warnings

import pytest

from embforge.encoder import Encoder
from embforge.training.checkpoints import (
    CheckpointError,
    ResumeWarning,
    find_latest,
    load_trainer_state,
    start_run,
    verify_checkpoint,
)
from tests.conftest import make_bert, make_tokenizer, train_sts


def _train(out, model_dir, csv, *, steps, keep=1, **fields):
    return train_sts(out, model_dir, csv, max_steps=steps, keep_checkpoints=keep, **fields)[0]


def _events(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _names(folder):
    return sorted(p.name for p in folder.glob("checkpoint-*") if p.is_dir())


def test_an_earlier_runs_checkpoint_does_not_prune_the_new_ones(tmp_path, tiny_model_dir, sts_csv):
    """The issue's case: checkpoint-20 left by an earlier run, a new 6-step run, then --resume."""
    out = tmp_path / "out"
    _train(out, tiny_model_dir, sts_csv, steps=20, save_every=20)
    _train(out, tiny_model_dir, sts_csv, steps=6, save_every=2)
    checkpoints = out / "checkpoints"
    assert _names(checkpoints) == ["checkpoint-20", "checkpoint-6"]
    assert (checkpoints / "latest").read_text().strip() == "checkpoint-6"
    _train(out, tiny_model_dir, sts_csv, steps=8, save_every=2, resume=True)
    resumed = [e for e in _events(out) if e.get("event") == "resume"]
    assert resumed[-1]["from"] == "checkpoint-6" and resumed[-1]["step"] == 6
    assert _names(checkpoints) == ["checkpoint-20", "checkpoint-8"]


def test_keep_counts_only_this_runs_checkpoints(tmp_path, tiny_model_dir, sts_csv):
    out = tmp_path / "out"
    _train(out, tiny_model_dir, sts_csv, steps=20, save_every=10, keep=5)
    _train(out, tiny_model_dir, sts_csv, steps=8, save_every=2, keep=2)
    assert _names(out / "checkpoints") == ["checkpoint-10", "checkpoint-20", "checkpoint-6", "checkpoint-8"]


def test_resume_with_nothing_to_resume_warns_on_stderr_and_in_metrics(tmp_path, tiny_model_dir, sts_csv):
    out = tmp_path / "fresh"
    with pytest.warns(ResumeWarning, match=r"nothing to resume in .*checkpoints.*starts at step 0"):
        summary = _train(out, tiny_model_dir, sts_csv, steps=2, save_every=0, resume=True)
    assert summary["steps"] == 2
    first = _events(out)[0]
    assert first["event"] == "resume" and first["from"] is None and "nothing to resume" in first["warning"]


def test_a_dangling_latest_is_an_error_naming_it(tmp_path, tiny_model_dir, sts_csv):
    checkpoints = tmp_path / "out" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "latest").write_text("checkpoint-99\n")
    with pytest.raises(CheckpointError, match=r"latest: points to checkpoint-99, which does not exist"):
        _train(tmp_path / "out", tiny_model_dir, sts_csv, steps=2, save_every=1, resume=True)
    (checkpoints / "latest").write_text("../../etc\n")
    with pytest.raises(CheckpointError, match=r"latest: '\.\./\.\./etc' is not a checkpoint name"):
        find_latest(checkpoints)


def test_checkpoints_without_a_latest_pointer_are_not_ignored(tmp_path, tiny_model_dir, sts_csv):
    out = tmp_path / "out"
    _train(out, tiny_model_dir, sts_csv, steps=4, save_every=2)
    (out / "checkpoints" / "latest").unlink()
    with pytest.raises(CheckpointError, match=r"latest: missing, but .* holds checkpoint-4"):
        _train(out, tiny_model_dir, sts_csv, steps=6, save_every=2, resume=True)


def test_a_fresh_run_retires_the_previous_runs_pointer(tmp_path, tiny_model_dir, sts_csv):
    """A new run killed before its first checkpoint must not --resume the previous run's last checkpoint."""
    out = tmp_path / "out"
    _train(out, tiny_model_dir, sts_csv, steps=4, save_every=4)
    checkpoints = out / "checkpoints"
    assert start_run(checkpoints, resume=False) is None
    assert not (checkpoints / "latest").exists()
    with pytest.warns(ResumeWarning, match=r"checkpoint-4 belongs to an earlier run"):
        assert start_run(checkpoints, resume=True) is None


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """One tiny model, a small STS file and a run of 4 steps with a checkpoint at step 4, shared by the
    corruption tests (each corrupts its own copy)."""
    root = tmp_path_factory.mktemp("base")
    tokenizer = make_tokenizer()
    model = Encoder(make_bert(len(tokenizer)), tokenizer, pooling="mean", normalize=False, max_seq_length=64)
    model.save(root / "tiny")
    pairs = [("a man plays the guitar", "a man is playing guitar", 4.8), ("the sun in the sky", "rain", 0.8)]
    (root / "sts.csv").write_text("".join(f"{a},{b},{s}\n" for a, b, s in pairs * 10))
    _train(root / "run", root / "tiny", root / "sts.csv", steps=4, save_every=2)
    return root


@pytest.fixture
def saved(base_run, tmp_path):
    """A copy of the base run's folder (checkpoint-4), and a function resuming it to step 6."""
    out = tmp_path / "run"
    shutil.copytree(base_run / "run", out)

    def resume():
        return _train(out, base_run / "tiny", base_run / "sts.csv", steps=6, save_every=2, resume=True)

    return out / "checkpoints" / "checkpoint-4", resume


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path):
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40  # a bit of the last tensor's data: 3.4e38-style garbage, same size
    path.write_bytes(bytes(data))


def _garbage(path):
    path.write_text("{not json", encoding="utf-8")


CORRUPTIONS = {
    "truncated": _truncate,
    "bit-flipped": _flip,
    "garbage": _garbage,
    "deleted": lambda p: p.unlink(),
}
FILES = [
    "model/model.safetensors",
    "losses.safetensors",
    "trainer_state.pt",
    "progress.json",
    "model/config.json",
]


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("corruption", ["truncated", "bit-flipped", "deleted"])
def test_a_corrupted_checkpoint_file_is_named(saved, name, corruption):
    checkpoint, resume = saved
    CORRUPTIONS[corruption](checkpoint / name)
    expected = {
        "truncated": r"\d+ bytes, but the checkpoint wrote \d+",
        "bit-flipped": r"SHA-256",
        "deleted": r"missing",
    }[corruption]
    with pytest.raises(CheckpointError, match=rf"checkpoint-4/{name}: .*{expected}"):
        resume()


def test_a_broken_manifest_is_named(saved):
    checkpoint, resume = saved
    _garbage(checkpoint / "manifest.json")
    with pytest.raises(CheckpointError, match=r"checkpoint-4/manifest\.json: unreadable"):
        resume()


@pytest.mark.parametrize(
    ("name", "corruption"),
    [
        ("progress.json", "garbage"),
        ("trainer_state.pt", "truncated"),
        ("model/model.safetensors", "truncated"),
        ("losses.safetensors", "truncated"),
    ],
)
def test_checkpoints_without_a_manifest_still_name_broken_files(saved, name, corruption):
    """Checkpoints written before manifests: no checksums, but unreadable files are named, not tracebacks."""
    checkpoint, _ = saved
    (checkpoint / "manifest.json").unlink()
    CORRUPTIONS[corruption](checkpoint / name)
    expected = {"garbage": "not valid JSON", "truncated": "cannot be read"}[corruption]
    named = rf"{re.escape(name)}: {expected}"
    with pytest.warns(ResumeWarning, match="no manifest"), pytest.raises(CheckpointError, match=named):
        load_trainer_state(checkpoint)


def test_an_intact_checkpoint_verifies_and_resumes(saved):
    checkpoint, resume = saved
    verify_checkpoint(checkpoint)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resume()["steps"] == 6


def test_a_copied_run_folder_resumes(saved, tmp_path):
    """The manifest holds relative paths: a run folder moved elsewhere still verifies."""
    checkpoint, _ = saved
    moved = tmp_path / "moved"
    shutil.copytree(checkpoint.parent.parent, moved)
    verify_checkpoint(moved / "checkpoints" / "checkpoint-4")
