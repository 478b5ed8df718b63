"""Multi-stage pipelines: validation before training, and a run killed in stage 2 resumes there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from embforge.cli import main
from embforge.encoder import Encoder
from embforge.kinds import ModelKind
from embforge.training.pipeline import PipelineError, load_pipeline, run_pipeline, validate_pipeline
from tests.conftest import pipeline_head

PAIRS = [
    ("a man plays the guitar", "a man is playing guitar"),
    ("a woman eats food", "a woman is eating"),
    ("a cat runs in the park", "a cat is in the park"),
    ("the stock market rises", "the price rises"),
    ("a child reads a book", "a child is reading"),
    ("a plane is taking off", "the plane takes off"),
    ("the sun in the sky", "sun and sky"),
    ("a woman sings a song", "a woman is singing"),
]
TOPICS = [("guitar piano song", 0), ("bank money price", 1), ("tree river sky", 2)]


def _toml_value(value) -> str:
    return json.dumps(value)


def write_pipeline(tmp_path: Path, model_dir: Path, sts_csv: Path, *, overrides: dict | None = None) -> Path:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in PAIRS))
    topics = tmp_path / "topics.jsonl"
    topics.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in TOPICS * 6))
    o = {"s1_loss": "infonce", "s2_data": str(sts_csv), "s3_dims": "[32, 16]", **(overrides or {})}
    text = (
        pipeline_head(model_dir, save_every=2)
        + f"""
[[stages]]
name = "warmup"
lr = 1e-3
steps = 3
  [[stages.tasks]]
  name = "pairs"
  data = "pairs.jsonl"
  loss = "{o["s1_loss"]}"

[[stages]]
name = "multi"
lr = 5e-4
steps = 6
sampling = "weight"
dynamic_weights_every = 2
  [[stages.tasks]]
  name = "sts"
  data = {_toml_value(o["s2_data"])}
  columns = "0=sentence1,1=sentence2,2=score"
  loss = "cosent"
  weight = 2.0
  [[stages.tasks]]
  name = "topics"
  data = "topics.jsonl"
  loss = "prototype"
  options = {{ temperature = 0.1 }}

[[stages]]
name = "mrl"
lr = 1e-4
steps = 2
matryoshka_dims = {o["s3_dims"]}
  [[stages.tasks]]
  name = "pairs-again"
  data = "pairs.jsonl"
  loss = "infonce"
"""
    )
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    return path


class Killed(Exception):
    pass


def test_pipeline_killed_in_stage_two_resumes_there(tmp_path, tiny_model_dir, sts_csv):
    path = write_pipeline(tmp_path, tiny_model_dir, sts_csv)
    reference = run_pipeline(load_pipeline(path), output=str(tmp_path / "reference"))
    assert [s["steps"] for s in reference["stages"]] == [3, 6, 2]

    out = tmp_path / "killed"
    seen: list[tuple[int, int]] = []

    def kill_at_stage_two_step_five(stage: int, step: int) -> None:
        seen.append((stage, step))
        if (stage, step) == (2, 5):
            raise Killed

    with pytest.raises(Killed):
        run_pipeline(load_pipeline(path), output=str(out), on_step=kill_at_stage_two_step_five)
    stage1_done = (out / "stage-1-warmup" / "stage_done.json").read_text()
    assert not (out / "stage-2-multi" / "stage_done.json").exists()

    seen.clear()
    result = run_pipeline(load_pipeline(path), output=str(out), on_step=lambda s, k: seen.append((s, k)))
    # stage 1 was not run again; stage 2 restarted from its step-4 checkpoint; stage 3 ran
    assert seen == [(2, 5), (2, 6), (3, 1), (3, 2)]
    assert (out / "stage-1-warmup" / "stage_done.json").read_text() == stage1_done
    events = [json.loads(line) for line in (out / "stage-2-multi" / "metrics.jsonl").read_text().splitlines()]
    # the rerun resumed from checkpoint-4 (the first start was a fresh stage, not a resume)
    assert [e["from"] for e in events if e.get("event") == "resume"] == ["checkpoint-4"]
    assert any("task_weights" in e for e in events)  # dynamic weights were logged
    assert result["final"] == str(out / "final")
    # and the resumed run ends with the same weights as the uninterrupted one
    a = Encoder.load(reference["final"]).state_dict()
    b = Encoder.load(result["final"]).state_dict()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4)


def test_a_fresh_pipeline_warns_of_nothing_to_resume(tmp_path, tiny_model_dir, sts_csv):
    """Each stage that starts for the first time is a new run, not a resume with nothing to resume."""
    import warnings

    from embforge.training.checkpoints import ResumeWarning

    path = write_pipeline(tmp_path, tiny_model_dir, sts_csv)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeWarning)
        run_pipeline(load_pipeline(path), output=str(tmp_path / "fresh"))
    for stage in ("stage-1-warmup", "stage-2-multi", "stage-3-mrl"):
        events = (tmp_path / "fresh" / stage / "metrics.jsonl").read_text().splitlines()
        assert not [e for e in map(json.loads, events) if e.get("event") == "resume"]


def test_rerun_without_resume_refuses_to_overwrite(tmp_path, tiny_model_dir, sts_csv):
    path = write_pipeline(tmp_path, tiny_model_dir, sts_csv)
    (tmp_path / "out" / "stage-1-warmup").mkdir(parents=True)
    with pytest.raises(PipelineError, match="--resume"):
        run_pipeline(load_pipeline(path), output=str(tmp_path / "out"), resume=False)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"s1_loss": "ranknet"},
            r"stage 1 \('warmup'\), task 'pairs': field 'loss' = 'ranknet': unknown loss",
        ),
        # anchor,positive pairs for the CoSENT loss (needs a score)
        (
            {"s1_loss": "cosent"},
            r"stage 1 \('warmup'\), task 'pairs': field 'data' = 'pairs.jsonl' does not fit the loss: "
            r".*pairs.jsonl:1: .*needs a 'score' or 'label' column",
        ),
        (
            {"s2_data": "missing.csv"},
            r"stage 2 \('multi'\), task 'sts': field 'data' = 'missing.csv': no such file",
        ),
        (
            {"s3_dims": "[64, 16]"},
            r"stage 3 \('mrl'\): field 'matryoshka_dims': 64 is larger than the model's dimension 32",
        ),
    ],
)
def test_bad_pipelines_fail_before_any_training(tmp_path, tiny_model_dir, sts_csv, overrides, expected):
    path = write_pipeline(tmp_path, tiny_model_dir, sts_csv, overrides=overrides)
    with pytest.raises(PipelineError, match=expected) as info:
        run_pipeline(load_pipeline(path), output=str(tmp_path / "out"))
    assert str(path) in str(info.value)
    assert not (tmp_path / "out").exists()  # nothing trained, not even the valid stages before the bad one


def test_unknown_field_names_stage_and_task(tmp_path, tiny_model_dir, sts_csv):
    path = write_pipeline(tmp_path, tiny_model_dir, sts_csv)
    path.write_text(path.read_text().replace('  loss = "cosent"', '  loss = "cosent"\n  wieght = 2'))
    with pytest.raises(
        PipelineError, match=r"stage 2 \('multi'\), task 1 \('sts'\): unknown field\(s\) wieght"
    ):
        load_pipeline(path)


def test_cli_train_runs_a_pipeline_file_and_reports_errors(tmp_path, tiny_model_dir, sts_csv, capsys):
    path = write_pipeline(tmp_path, tiny_model_dir, sts_csv, overrides={"s3_dims": "[99]"})
    assert main(["train", str(path), "--output", str(tmp_path / "cli")]) == 2
    assert "field 'matryoshka_dims'" in capsys.readouterr().err
    path = write_pipeline(tmp_path, tiny_model_dir, sts_csv)
    assert main(["train", str(path), "--output", str(tmp_path / "cli")]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [s["name"] for s in result["stages"]] == ["warmup", "multi", "mrl"]
    assert (tmp_path / "cli" / "final" / "modules.json").exists()


def test_stages_are_checked_for_the_model_kind_without_a_model(tmp_path, sts_csv):
    """Validation builds each loss from its name, the model's declared kind and dimension: no model is loaded,
    a cross-encoder's ``bce`` passes, and the same name for a bi-encoder is an error naming stage and field."""
    path = tmp_path / "rerank.toml"
    path.write_text(
        f"""
[[stages]]
name = "rerank"
steps = 2
  [[stages.tasks]]
  name = "sts"
  data = {_toml_value(str(sts_csv))}
  loss = "bce"
  options = {{ label_max = 5.0 }}
"""
    )
    pipeline = load_pipeline(path)
    validate_pipeline(pipeline, dim=32, kind=ModelKind.CROSS)
    with pytest.raises(PipelineError, match=r"stage 1 \('rerank'\), task 'sts': field 'loss' = 'bce'"):
        validate_pipeline(pipeline, dim=32)
