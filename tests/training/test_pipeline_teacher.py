"""Pipelines: distillation tasks (``teacher`` + ``mse_distill``; ``teacher`` + ``lists`` + ``kl_distill``) and the
``--seed`` override of every stage."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embforge.cli import main
from embforge.data.builtin import DATASETS
from embforge.distill import targets
from embforge.distill.projection import add_projection, fit_projection
from embforge.encoder import Encoder
from embforge.retrieval.corpus_cache import load_encoded
from embforge.training.pipeline import PipelineError, load_pipeline, run_pipeline, validate_pipeline
from tests.conftest import STS_ROWS as PAIRS
from tests.conftest import make_bert, make_tokenizer, pipeline_head, requires_data


def make_teacher_dir(tmp_path: Path) -> Path:
    """A tiny 24-d "teacher" (another random BERT + a projection), so that its dimension differs from 32."""
    tokenizer = make_tokenizer()
    teacher = Encoder(make_bert(len(tokenizer), seed=5), tokenizer, pooling="mean", max_seq_length=64)
    add_projection(teacher, 24, seed=9)
    path = tmp_path / "teacher"
    teacher.save(path)
    return path


def write_pipeline(
    tmp_path: Path, model_dir: Path, *, teacher: str | None, loss: str = "mse_distill"
) -> Path:
    """Stage 1 distils (``loss``, with targets from ``teacher``), stage 2 trains on the STS scores."""
    (tmp_path / "pairs.csv").write_text("".join(f"{a},{b},{s}\n" for a, b, s in PAIRS * 3))
    head = pipeline_head(
        model_dir, save_every=0, extra=f"teacher_cache = {json.dumps(str(tmp_path / 'cache'))}"
    )
    distill = _sts_stage("distill", 1e-3, 5, "sts-distill", loss, teacher=teacher)
    path = tmp_path / "distill.toml"
    path.write_text(head + distill + _sts_stage("sts", 1e-4, 3, "sts", "cosent"))
    return path


def _sts_stage(name: str, lr: float, steps: int, task: str, loss: str, *, teacher: str | None = None) -> str:
    """A stage of ``steps`` steps at ``lr``: one task ``task`` on pairs.csv's scored pairs (targets from
    ``teacher`` when given)."""
    teacher_line = f"teacher = {json.dumps(teacher)}" if teacher else ""
    return f"""
[[stages]]
name = "{name}"
lr = {lr}
steps = {steps}
  [[stages.tasks]]
  name = "{task}"
  data = "pairs.csv"
  columns = "0=sentence1,1=sentence2,2=score"
  loss = "{loss}"
  {teacher_line}
"""


def _mse(student: Encoder, teacher: Encoder, texts: list[str]) -> float:
    return float(np.mean((student.encode(texts) - teacher.encode(texts)) ** 2))


def test_a_teacher_task_projects_the_student_and_moves_it_toward_the_teacher(tmp_path, tiny_model_dir):
    teacher_dir = make_teacher_dir(tmp_path)
    path = write_pipeline(tmp_path, tiny_model_dir, teacher=str(teacher_dir))
    result = run_pipeline(load_pipeline(path), output=str(tmp_path / "run"))
    final = Encoder.load(result["final"])
    assert final.dim == 24 and (Path(result["final"]) / "2_Dense").is_dir()
    assert [s["steps"] for s in result["stages"]] == [5, 3]
    # the targets were cached: one entry, holding the 16 distinct texts' teacher embeddings
    entries = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(entries) == 1
    teacher = Encoder.load(teacher_dir)
    texts = sorted({t for a, b, _ in PAIRS for t in (a, b)})
    cached = np.asarray(load_encoded(entries[0])[1])
    assert cached.shape == (16, 24)
    np.testing.assert_allclose(cached, teacher.encode(texts), atol=1e-5)
    # the projection started at the least-squares map (not at random), and training moved the student on from it
    start = Encoder.load(tiny_model_dir)
    add_projection(start, 24, seed=3)  # the projection seed is the stage seed
    random_start = _mse(start, teacher, texts)
    first = [a for a, _, _ in PAIRS]  # the map is fitted on the task's first text column
    fit_projection(start, first, teacher.encode(first), seed=3)
    fitted_start = _mse(start, teacher, texts)
    distilled = Encoder.load(tmp_path / "run" / "stage-1-distill")
    assert fitted_start < 0.5 * random_start
    assert _mse(distilled, teacher, texts) < fitted_start


def test_a_run_killed_after_the_distillation_stage_resumes_with_the_projection(tmp_path, tiny_model_dir):
    path = write_pipeline(tmp_path, tiny_model_dir, teacher=str(make_teacher_dir(tmp_path)))
    reference = run_pipeline(load_pipeline(path), output=str(tmp_path / "reference"))

    class Killed(Exception):
        pass

    def kill(stage: int, step: int) -> None:
        if stage == 2:
            raise Killed

    with pytest.raises(Killed):
        run_pipeline(load_pipeline(path), output=str(tmp_path / "killed"), on_step=kill)
    # a fresh process: the 32-d model from the file gets stage 1's projection before stage 2 resumes
    result = run_pipeline(load_pipeline(path), output=str(tmp_path / "killed"))
    a, b = Encoder.load(reference["final"]).state_dict(), Encoder.load(result["final"]).state_dict()
    assert set(a) == set(b)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("loss", "with_teacher", "expected"),
    [
        ("cosent", True, r"task 'sts-distill': field 'teacher' gives the labels, which only losses"),
        ("mse_distill", False, r"task 'sts-distill': loss 'mse_distill' needs the teacher's embeddings"),
    ],
)
def test_teacher_and_loss_must_go_together(tmp_path, tiny_model_dir, loss, with_teacher, expected):
    teacher = str(make_teacher_dir(tmp_path)) if with_teacher else None
    path = write_pipeline(tmp_path, tiny_model_dir, teacher=teacher, loss=loss)
    with pytest.raises(PipelineError, match=expected):
        run_pipeline(load_pipeline(path), output=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


RERANK = [  # (question, candidate) rows as WikiQA's: q1 has 5 candidates, q2 1, q3 2
    ("what is a cat", "a cat is an animal"), ("what is a cat", "the cat sat"), ("who plays guitar", "a man"),
    ("what is a cat", "cats eat food"), ("what is a cat", "a dog runs"), ("where is the park", "in the city"),
    ("what is a cat", "the park is green"), ("where is the park", "a woman eats"),
]  # fmt: skip


def _lists_pipeline(tmp_path: Path, model_dir: Path, teacher: Path, *, fields: str) -> Path:
    """One stage of 4 steps: a kl_distill task on rerank.tsv (question, candidate, label) with ``fields``."""
    (tmp_path / "rerank.tsv").write_text("".join(f"{q}\t{c}\t1\n" for q, c in RERANK))
    head = pipeline_head(
        model_dir, save_every=0, extra=f"teacher_cache = {json.dumps(str(tmp_path / 'cache'))}"
    )
    path = tmp_path / "lists.toml"
    path.write_text(f"""{head}
[[stages]]
name = "lists"
lr = 1e-3
steps = 4
  [[stages.tasks]]
  name = "rerank-lists"
  data = "rerank.tsv"
  columns = "0=sentence1,1=sentence2,2=label"
  loss = "kl_distill"
  options = {{ similarity = "cosine", temperature = 0.05 }}
  teacher = {json.dumps(str(teacher))}
  {fields}
""")
    return path


def test_a_lists_task_trains_on_the_file_embforge_score_writes(tmp_path, tiny_model_dir, capsys, monkeypatch):
    teacher = make_teacher_dir(tmp_path)
    path = _lists_pipeline(tmp_path, tiny_model_dir, teacher, fields="lists = 3")
    result = run_pipeline(load_pipeline(path), output=str(tmp_path / "run"))
    assert [s["steps"] for s in result["stages"]] == [4]
    scored = list((tmp_path / "cache").glob("scores-*.jsonl"))
    assert len(scored) == 1 and not list((tmp_path / "cache").glob("*.tmp*"))
    # the same rows and scores, byte for byte, as scoring the file beforehand (the recipe's measured path)
    argv = ["score", "--teacher", str(teacher), "--data", str(tmp_path / "rerank.tsv"), "--no-header"]
    argv += ["--columns", "0=sentence1,1=sentence2", "--lists", "3", "--output", str(tmp_path / "cli.jsonl")]
    assert main([*argv, "--quiet"]) == 0
    capsys.readouterr()
    assert scored[0].read_bytes() == (tmp_path / "cli.jsonl").read_bytes()

    # a second run (another seed) reads the cached scores: the teacher does not score again
    def no_scoring(*args: object, **kwargs: object) -> None:
        raise AssertionError("the teacher scored the rows again")

    monkeypatch.setattr(targets, "score_rows", no_scoring)
    again = run_pipeline(load_pipeline(path), output=str(tmp_path / "again"), seed=5)
    assert [s["steps"] for s in again["stages"]] == [4]


@pytest.mark.parametrize(
    ("loss", "fields", "expected"),
    [
        (
            "kl_distill",
            "lists = 1",
            r"task 'rerank-lists': field 'lists' = 1: a candidate list needs at least 2",
        ),
        ("mse_distill", "lists = 3", r"field 'lists' builds candidate lists for a teacher to score"),
        ("kl_distill", 'mine = { method = "bm25", num_negatives = 1 }', r"field 'mine': the teacher scores"),
    ],
)
def test_lists_and_teacher_scores_errors_name_the_field(tmp_path, tiny_model_dir, loss, fields, expected):
    path = _lists_pipeline(tmp_path, tiny_model_dir, make_teacher_dir(tmp_path), fields=fields)
    path.write_text(path.read_text().replace('loss = "kl_distill"', f'loss = "{loss}"'))
    with pytest.raises(PipelineError, match=expected):
        run_pipeline(load_pipeline(path), output=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_lists_without_a_teacher_is_an_error(tmp_path, tiny_model_dir):
    path = _lists_pipeline(tmp_path, tiny_model_dir, tmp_path, fields="lists = 3")
    path.write_text("\n".join(line for line in path.read_text().splitlines() if "teacher =" not in line))
    with pytest.raises(PipelineError, match=r"field 'lists' builds candidate lists.*no teacher"):
        run_pipeline(load_pipeline(path), output=str(tmp_path / "out"))


def test_a_missing_teacher_is_named(tmp_path, tiny_model_dir):
    path = write_pipeline(tmp_path, tiny_model_dir, teacher=str(tmp_path / "no-such-teacher"))
    with pytest.raises(PipelineError, match=r"stage 1 \('distill'\), task 'sts-distill': field 'teacher'"):
        run_pipeline(load_pipeline(path), output=str(tmp_path / "out"))


def test_seed_overrides_every_stage_from_python_and_the_cli(tmp_path, tiny_model_dir, capsys):
    path = write_pipeline(tmp_path, tiny_model_dir, teacher=str(make_teacher_dir(tmp_path)))
    file_seed = run_pipeline(load_pipeline(path), output=str(tmp_path / "s3"))
    other = run_pipeline(load_pipeline(path), output=str(tmp_path / "s7"), seed=7)
    assert main(["train", str(path), "--output", str(tmp_path / "cli7"), "--seed", "7"]) == 0
    capsys.readouterr()

    def weights(result: dict | str) -> dict[str, torch.Tensor]:
        folder = result["final"] if isinstance(result, dict) else result
        return Encoder.load(folder).state_dict()

    a, c, d = weights(file_seed), weights(other), weights(str(tmp_path / "cli7" / "final"))
    for name in a:
        torch.testing.assert_close(c[name], d[name])
    assert any(not torch.allclose(a[name], c[name]) for name in a)  # another seed trains another model


@requires_data
@pytest.mark.parametrize("config", ["embforge/configs/general.toml", "benchmarks/general_distill.toml"])
def test_the_shipped_general_and_distillation_pipelines_validate(config):
    root = Path(__file__).resolve().parents[2]
    pipeline = load_pipeline(root / config)
    validate_pipeline(pipeline, dim=384)  # data columns vs losses, loss options, teacher/loss pairs
    tasks = [t for stage in pipeline.stages for t in stage.tasks]
    assert all(t.data.partition(":")[0] in DATASETS for t in tasks)  # built-in data sets only
    assert not any(t.data.endswith((":test", ":dev")) for t in tasks)  # never a test or dev split
