"""What a run leaves for people: a model card in the model folder, and an HTML report of the run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from embforge.cli import main
from embforge.data.tables import read_table
from embforge.encoder import Encoder
from embforge.evaluate.sts import sts_evaluator
from embforge.losses import get_loss
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.model_card import task_info, write_model_card
from embforge.training.report import nice_ticks, write_report
from embforge.training.tasks import Task


@pytest.fixture
def finished_run(tmp_path, tiny_model_dir, sts_csv):
    """A two-task run with dynamic task weights and an evaluation every 2 steps (8 steps)."""
    model = Encoder.load(tiny_model_dir)
    data = read_table(sts_csv)
    tasks = [Task("sts", data, get_loss("cosent")), Task("sts-mse", data, get_loss("mse"))]
    config = TrainConfig(
        output=str(tmp_path / "run"),
        batch_size=8,
        lr=1e-3,
        eval_every=2,
        log_every=1,
        save_every=0,
        dynamic_weights_every=2,
        quiet=True,
    )
    summary = train(model, tasks, config, evaluator=sts_evaluator(data))
    return model, tasks, config, summary


def test_model_card_says_what_how_how_well_and_how_to_reproduce(finished_run, tiny_model_dir):
    model, tasks, config, summary = finished_run
    card = write_model_card(
        config.output,
        base_model="all-MiniLM-L6-v2",
        tasks_info=[task_info(t) for t in tasks],
        config=config,
        eval_results=summary["final"],
        best=summary["best"],
        seconds=summary["seconds"],
        steps=summary["steps"],
        device="cpu",
        command="embforge train --train sts.csv --output run",
    ).read_text()
    assert card.startswith("---\nlibrary_name: sentence-transformers\n")
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in card
    assert re.search(r"\| sts \| `[^`]*sts\.csv` \| 32 \| sentence1, sentence2, score \| `cosent` \|", card)
    assert "| sts-mse |" in card and "`mse`" in card and "64 training rows in all." in card
    assert "| `lr` | `0.001` |" in card and "| `dynamic_weights_every` | `2` |" in card
    assert f"| spearman | {summary['final']['spearman']:.2f} |" in card
    assert "| Output dimensionality | 32 |" in card and "| Pooling | mean |" in card
    assert "- Optimiser steps: 8" in card and "logical CPU cores" in card
    assert "embforge train --train sts.csv --output run" in card and "- embforge: " in card
    assert "| step | spearman |" in card  # the evaluations over steps, from metrics.jsonl
    st = pytest.importorskip("sentence_transformers")
    peer = st.SentenceTransformer(config.output, device="cpu")  # the card does not get in its way
    np.testing.assert_allclose(peer.encode(["a cat"]), model.encode(["a cat"]), atol=1e-5)


def test_train_leaves_a_model_card_and_no_training_state(tmp_path, tiny_model_dir, sts_csv):
    config = TrainConfig(output=str(tmp_path / "run"), batch_size=8, save_every=2, quiet=True)
    train(Encoder.load(tiny_model_dir), [Task("sts", read_table(sts_csv), get_loss("cosent"))], config)
    assert (tmp_path / "run" / "README.md").exists()
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_report_draws_the_run(finished_run, capsys):
    _, _, config, _ = finished_run
    run = config.output
    refreshes = [
        {
            "event": "refresh",
            "started_step": 2,
            "applied_step": 4,
            "stall_seconds": 0.0,
            "mining_seconds": 3.1,
        },
        {
            "event": "refresh",
            "started_step": 6,
            "applied_step": 8,
            "stall_seconds": 1.5,
            "mining_seconds": 4.2,
        },
    ]
    Path(run, "refresh.jsonl").write_text("".join(json.dumps(r) + "\n" for r in refreshes))
    assert main(["report", run]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    page = Path(result["report"]).read_text(encoding="utf-8")
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", page)
    assert captions[:2] == ["Training loss", "Learning rate"]
    assert "Evaluation (0-100)" in captions and "Task weights (dynamic)" in captions
    assert any(c.startswith("Negative refreshes") for c in captions)
    assert result["charts"] == len(captions) == page.count("<svg")
    assert "loss: sts-mse" in page  # one loss line per task
    assert "Training stalled 1.5 s in all for 2 refreshes." in page
    assert "<script" not in page and not re.search(r"(src|href)=['\"]?http", page)  # self-contained


def test_report_of_a_pipeline_and_of_a_wrong_folder(tmp_path, capsys):
    for stage in ("stage-1-a", "stage-2-b"):
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "metrics.jsonl").write_text(
            '{"step": 1, "loss": 2.0, "lr": 0.1}\n{"step": 2, "lo'
        )
    result = write_report(tmp_path)
    assert result["sections"] == 2 and result["charts"] == 4  # the torn last line is skipped
    assert main(["report", str(tmp_path / "stage-1-a" / "nothing")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_equal_metrics_share_one_line_and_others_get_their_own_chart(tmp_path):
    evals = [
        {"step": s, "eval": {"spearman": v, "spearman_dot": v, "margin": 150.0, "n": 9.0}}
        for s, v in [(1, 70.0), (2, 80.0)]
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    result = write_report(tmp_path)
    page = Path(result["report"]).read_text()
    assert re.findall(r"<figcaption>(.*?)</figcaption>", page) == [
        "Evaluation (0-100)",
        "Evaluation: margin",
    ]
    assert "spearman = spearman_dot" in page and "Evaluation: n" not in page


def test_nice_ticks():
    assert nice_ticks(0, 180) == [0, 50, 100, 150, 200]
    assert nice_ticks(3.0, 3.0)[0] < 3.0 < nice_ticks(3.0, 3.0)[-1]
