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
        (["--retrieval-train", "beir"], "--retrieval-train"),
        (["--eval", "pairs.jsonl"], "--eval"),
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
        "model_type",
        "bidirectional",
        "max_seq_length",
        "matryoshka_dims",
        "data_mode",
        "max_bad_rows",
        "data_cache",
        "data_split",
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


def test_the_model_kind_and_the_reading_of_files_are_set_on_the_pipeline(tmp_path, tiny_model_dir):
    """What was refused before the single run became a one-stage pipeline: the model's kind, a decoder made
    bidirectional and how files are read are pipeline fields, set from the file or by the flag."""
    from embforge.training.pipeline_file import load_pipeline, with_overrides

    pipeline = load_pipeline(two_stages(tmp_path, tiny_model_dir))
    changed, given = with_overrides(
        pipeline, {"model_type": "cross", "data_mode": "stream", "max_bad_rows": 2}
    )
    assert (changed.model_type, changed.reading.mode, changed.reading.max_bad_rows) == ("cross", "stream", 2)
    assert given == {"model_type": "cross", "data_mode": "stream", "max_bad_rows": 2}
    path = two_stages(tmp_path, tiny_model_dir)
    path.write_text('model_type = "multivector"\ndata_mode = "mmap"\n' + path.read_text())
    parsed = load_pipeline(path)
    assert (parsed.model_type, parsed.reading.mode) == ("multivector", "mmap")


def test_a_stage_is_evaluated_during_training_and_keeps_its_best(tmp_path, tiny_model_dir, sts_csv, capsys):
    """A stage's ``eval`` (what --eval is for a single run) with ``eval_every`` and ``metric``: evaluated as it
    trains, the best kept, the metric named (these two fields were refused before)."""
    path = two_stages(tmp_path, tiny_model_dir)
    text = path.read_text().replace(
        "steps = 3\n",
        f'steps = 3\neval_every = 1\nmetric = "spearman"\neval = {{ data = "{sts_csv}", '
        'columns = "0=sentence1,1=sentence2,2=score" }\n',
        1,
    )
    path.write_text(text)
    out = tmp_path / "out"
    assert main(["train", str(path), "--output", str(out), "--quiet"]) == 0
    first, second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stages"]
    assert set(first["final"]) >= {"spearman", "pearson"} and first["best"] is not None
    assert second["final"] == {} and second["best"] is None  # the second stage names no evaluation
    metrics = [json.loads(line) for line in (out / "stage-1-one" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "eval" in m] == [1, 2, 3]
    assert (out / "stage-1-one" / "best").is_dir()
