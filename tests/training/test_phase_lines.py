"""Every phase of a run longer than a few seconds says what it does in one line on stderr, even in a quiet run
(issue #48): mining a task's negatives, the prototypes' starting values, the training loop without its bar,
an evaluation. Quick phases print nothing (``progress.PHASE_DELAY``, as bars wait ``BAR_DELAY``)."""

from __future__ import annotations

import json
import time

from embforge import progress
from embforge.cli import main
from embforge.training.config import TrainConfig
from tests.conftest import pipeline_head
from tests.training.test_pipeline import PAIRS as PIPELINE_PAIRS

PAIRS = PIPELINE_PAIRS[:6]


def _mining_pipeline(tmp_path, model_dir):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in PAIRS))
    path = tmp_path / "mine.toml"
    path.write_text(
        pipeline_head(model_dir, save_every=0)
        + '[[stages]]\nname = "one"\nsteps = 2\n'
        + '  [[stages.tasks]]\n  name = "passages"\n  data = "pairs.jsonl"\n  loss = "infonce"\n'
        + '  mine = { method = "bm25", num_negatives = 1 }\n'
    )
    return path


def test_a_phase_says_what_it_does_only_when_it_takes_long(monkeypatch, capsys):
    monkeypatch.setattr(progress, "PHASE_DELAY", 0.2, raising=False)
    with progress.phase("quick ..."):
        pass
    with progress.phase("slow: sleeping ..."):
        time.sleep(0.6)
    time.sleep(0.3)  # a timer of the quick phase would have fired by now
    assert capsys.readouterr().err.splitlines() == ["slow: sleeping ..."]


def test_a_quiet_run_with_a_mining_task_prints_the_mining_line(tmp_path, tiny_model_dir, monkeypatch, capfd):
    from embforge.training.refresh import NegativeRefresher

    monkeypatch.setattr(progress, "PHASE_DELAY", 0.2, raising=False)
    real = NegativeRefresher.build_tasks

    def slow_mine(*args, **kwargs):  # BM25 over six pairs is instant; a real corpus takes minutes
        time.sleep(0.8)
        return real(*args, **kwargs)

    monkeypatch.setattr(NegativeRefresher, "build_tasks", slow_mine)
    monkeypatch.chdir(tmp_path)
    assert main(["train", str(_mining_pipeline(tmp_path, tiny_model_dir)), "--quiet"]) == 0
    err = capfd.readouterr().err.splitlines()
    where = f"train: {tmp_path / 'mine.toml'}: stage 1 ('one'), task 'passages'"
    assert [line for line in err if "mining" in line] == [
        f"{where}: mining 1 BM25 negative per query (6 rows) ..."
    ]
    assert f"{where}: reading pairs.jsonl ..." not in err  # six rows: read at once, nothing said


def test_reading_a_task_s_data_says_so_when_it_takes_long(tmp_path, tiny_model_dir, monkeypatch, capfd):
    import embforge.training.stage_tasks as stage_tasks

    monkeypatch.setattr(progress, "PHASE_DELAY", 0.2, raising=False)
    real = stage_tasks.open_source

    def slow_read(*args, **kwargs):  # a large file, or a built-in set converted on first use
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(stage_tasks, "open_source", slow_read)
    monkeypatch.chdir(tmp_path)
    assert main(["train", str(_mining_pipeline(tmp_path, tiny_model_dir)), "--quiet"]) == 0
    where = f"train: {tmp_path / 'mine.toml'}: stage 1 ('one'), task 'passages'"
    assert f"{where}: reading pairs.jsonl ..." in capfd.readouterr().err.splitlines()


def test_a_quiet_training_loop_says_how_many_steps(tmp_path, tiny_encoder, sts_csv, monkeypatch, capfd):
    from embforge.data.tables import read_table
    from embforge.losses import get_loss
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    monkeypatch.setattr(progress, "PHASE_DELAY", 0.0, raising=False)
    config = TrainConfig(output=str(tmp_path / "run"), max_steps=2, batch_size=4, quiet=True, save_every=0)
    train(tiny_encoder, [Task("sts", read_table(sts_csv), get_loss("cosent"))], config)
    err = capfd.readouterr().err
    assert (
        f"train: 2 steps of batch 4 over 1 task -> {tmp_path / 'run'} (quiet: no bar) ..." in err.splitlines()
    )


def test_the_prototypes_starting_values_say_what_they_embed(tmp_path, tiny_encoder, monkeypatch, capfd):
    from embforge.data.tables import read_table
    from embforge.training.run import make_loss

    topics = tmp_path / "topics.jsonl"
    topics.write_text(
        "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in [("a cat", 0), ("a dog", 1)])
    )
    monkeypatch.setattr(progress, "PHASE_DELAY", 0.0, raising=False)
    make_loss("prototype", model=tiny_encoder, data=read_table(topics))
    assert capfd.readouterr().err.splitlines() == [
        f"prototype loss: embedding the 2 texts of {topics} for its 2 class prototypes ..."
    ]
