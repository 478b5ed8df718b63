"""Flags given with a pipeline file (issue #49): each one overrides its field in every stage, and the run says
so, or is refused in one line naming the flag; none is dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embforge.cli import main
from tests.conftest import pipeline_head
from tests.training.test_pipeline import PAIRS as PIPELINE_PAIRS

PAIRS = PIPELINE_PAIRS[:6]


def two_stages(tmp_path: Path, model_dir: Path) -> Path:
    (tmp_path / "pairs.jsonl").write_text(
        "".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in PAIRS)
    )
    path = tmp_path / "two.toml"
    stage = '\n[[stages]]\nname = "{name}"\nlr = 1e-3\nsteps = 3\n  [[stages.tasks]]\n  name = "pairs"\n'
    stage += '  data = "pairs.jsonl"\n  loss = "infonce"\n'
    path.write_text(
        pipeline_head(model_dir, save_every=0) + stage.format(name="one") + stage.format(name="two")
    )
    return path


def _settings(folder: Path) -> dict[str, str]:
    """The ``| field | value |`` rows of the model card a stage saved."""
    card = (folder / "README.md").read_text()
    rows = [line.split("|") for line in card.splitlines() if line.count("|") >= 3]
    return {row[1].strip(" `"): row[2].strip(" `") for row in rows}


def test_training_flags_override_every_stage_and_are_reported(tmp_path, tiny_model_dir, capsys):
    path, out = two_stages(tmp_path, tiny_model_dir), tmp_path / "out"
    flags = ["--lr", "0.5", "--batch-size", "3", "--max-steps", "2", "--warmup-ratio", "0", "--seed", "5"]
    assert main(["train", str(path), "--output", str(out), *flags]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    overridden = {"lr": 0.5, "batch_size": 3, "max_steps": 2, "warmup_ratio": 0.0, "seed": 5}
    assert result["overridden"] == overridden
    assert [s["steps"] for s in result["stages"]] == [2, 2]
    for stage in ("stage-1-one", "stage-2-two"):
        settings = _settings(out / stage)
        assert (settings["lr"], settings["batch_size"], settings["max_steps"], settings["seed"]) == (
            "0.5",
            "3",
            "2",
            "5",
        )


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--loss", "bce"], "--loss"),
        (["--model-type", "cross"], "--model-type"),
        (["--train", "pairs.jsonl"], "--train"),
        (["--columns", "0=anchor,1=positive"], "--columns"),
        (["--lr", "0.5", "--loss", "bce", "--batch-size", "3"], "--loss"),
    ],
)
def test_task_flags_are_refused_naming_the_flag(tmp_path, tiny_model_dir, capsys, flags, named):
    path, out = two_stages(tmp_path, tiny_model_dir), tmp_path / "out"
    assert main(["train", str(path), "--output", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "pipeline" in err, err
    assert not out.exists()  # refused before anything ran


def test_every_flag_overrides_a_field_of_every_stage_or_is_refused():
    """A flag's field either lands in each stage's TrainConfig (or the pipeline's model / Matryoshka settings) or
    declares why a pipeline cannot take it: a new field cannot be dropped silently."""
    from embforge.cli.train import _fields
    from embforge.training.config import FLAT_FIELDS
    from embforge.training.pipeline_file import refusal

    settable = set(FLAT_FIELDS) | {
        "model",
        "max_seq_length",
        "matryoshka_dims",
    }
    for item, _ in _fields():
        reason = refusal(item.name)
        assert reason or item.name in settable, f"--{item.name} would be dropped with a pipeline file"
    assert refusal("loss") and "tasks" in str(refusal("loss")) and refusal("lr") is None


def test_overrides_of_a_parsed_pipeline(tmp_path, tiny_model_dir):
    from embforge.training.pipeline_file import PipelineError, load_pipeline, with_overrides

    pipeline = load_pipeline(two_stages(tmp_path, tiny_model_dir))
    changed, given = with_overrides(
        pipeline, {"epochs": 2, "lr": None, "model": "other", "matryoshka_dims": [8]}
    )
    assert given == {"epochs": 2, "model": "other", "matryoshka_dims": [8], "max_steps": None}
    assert [(s.config.optim.epochs, s.config.optim.max_steps, s.config.optim.lr) for s in changed.stages] == [
        (2, None, 1e-3)
    ] * 2
    assert changed.model == "other" and [s.matryoshka_dims for s in changed.stages] == [[8], [8]]
    assert [s.config.optim.max_steps for s in pipeline.stages] == [3, 3]  # the parsed pipeline is unchanged
    with pytest.raises(PipelineError, match="lr must be a finite number > 0"):
        with_overrides(pipeline, {"lr": -1.0})
    with pytest.raises(PipelineError, match=r"num_negatives cannot be set for a pipeline: .*mine = "):
        with_overrides(pipeline, {"num_negatives": 2})


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("lora_r = 8", "lora_r"),
        ("lora_dropout = 0.1", "lora_dropout"),
        ("eval_every = 5", "eval_every"),
        ("metric = 'spearman'", "metric"),
    ],
)
def test_a_stage_field_the_pipeline_cannot_honour_is_refused_not_ignored(
    tmp_path, tiny_model_dir, line, field
):
    from embforge.training.pipeline_file import PipelineError, load_pipeline

    path = two_stages(tmp_path, tiny_model_dir)
    path.write_text(path.read_text().replace("lr = 1e-3\n", f"lr = 1e-3\n{line}\n", 1))
    with pytest.raises(PipelineError, match=rf"stage 1 \('one'\): field '{field}': a pipeline"):
        load_pipeline(path)
