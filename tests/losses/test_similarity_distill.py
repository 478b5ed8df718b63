"""``similarity_distill``: the teacher's in-batch similarity matrix as soft targets (dimension-free)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embforge.encoder import Encoder
from embforge.losses import SimilarityDistillLoss, get_loss
from embforge.training.pipeline import load_pipeline, run_pipeline
from embforge.training.tasks import Task
from tests.training.test_cached_step import assert_same, dataset, plain_and_cached, texts
from tests.training.test_pipeline_teacher import make_teacher_dir, write_pipeline


def by_hand(student: np.ndarray, teacher: np.ndarray, tau_s: float, tau_t: float) -> float:
    """The formula with explicit loops: mean over texts of KL(teacher row || student row), diagonal left out
    (no τ_s² factor: the loss's default ``scale`` is 1)."""

    def cos(x: np.ndarray, i: int, j: int) -> float:
        return float(x[i] @ x[j] / np.linalg.norm(x[i]) / np.linalg.norm(x[j]))

    n, total = len(student), 0.0
    for i in range(n):
        others = [j for j in range(n) if j != i]
        s = np.array([cos(student, i, j) / tau_s for j in others])
        t = np.array([cos(teacher, i, j) / tau_t for j in others])
        p = np.exp(t - t.max()) / np.exp(t - t.max()).sum()
        log_q = s - s.max() - np.log(np.exp(s - s.max()).sum())
        total += float((p * (np.log(p) - log_q)).sum())
    return total / n


def test_equals_the_formula_by_hand_over_every_text_of_the_batch():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 8)), rng.normal(size=(5, 8))  # two text columns of 5 rows, 8-d student
    teacher = rng.normal(size=(5, 2, 12))  # a 12-d teacher, one embedding per column
    loss = get_loss("similarity_distill", student_temperature=0.3, teacher_temperature=0.2)
    value = loss([torch.tensor(a), torch.tensor(b)], torch.tensor(teacher))
    expected = by_hand(np.concatenate([a, b]), np.concatenate([teacher[:, 0], teacher[:, 1]]), 0.3, 0.2)
    assert float(value) == pytest.approx(expected, rel=1e-5)


def test_by_default_the_kl_keeps_its_own_size_in_a_mix():
    """Defect (2026-11-27): the loss took ``kl_distill``'s τ_s² factor, 0.0025 at its default τ_s = 0.05, so beside
    InfoNCE / CoSENT tasks (losses of 0.1-8) a teacher-similarity task of a recipe was ~400x smaller than them and
    all but absent. Its default scale is 1 (the KL itself); ``scale`` still sets another factor."""
    rng = np.random.default_rng(4)
    student, teacher = rng.normal(size=(8, 6)), rng.normal(size=(8, 10))
    plain = by_hand(student, teacher, 0.05, 0.05)
    default = SimilarityDistillLoss()([torch.tensor(student)], torch.tensor(teacher))
    assert float(default) == pytest.approx(plain, rel=1e-5)
    hinton = SimilarityDistillLoss(scale=0.05**2)([torch.tensor(student)], torch.tensor(teacher))
    assert float(hinton) == pytest.approx(0.05**2 * plain, rel=1e-5)


def test_one_teacher_row_for_every_column_repeats_it():
    rng = np.random.default_rng(1)
    a, b, teacher = rng.normal(size=(4, 6)), rng.normal(size=(4, 6)), rng.normal(size=(4, 10))
    loss = SimilarityDistillLoss(temperature=0.5)
    value = loss([torch.tensor(a), torch.tensor(b)], torch.tensor(teacher))
    assert float(value) == pytest.approx(by_hand(np.concatenate([a, b]), np.tile(teacher, (2, 1)), 0.5, 0.5))


def test_zero_when_the_student_has_the_teachers_similarities_in_another_dimension():
    rng = np.random.default_rng(2)
    teacher = rng.normal(size=(9, 16))
    rotation, _ = np.linalg.qr(rng.normal(size=(16, 16)))
    student = (teacher @ rotation)[:, :16] * 3.0  # same cosines (rotated, scaled) ...
    student = np.concatenate([student, np.zeros((9, 4))], axis=1)  # ... in 20 dimensions
    loss = SimilarityDistillLoss()
    assert float(loss([torch.tensor(student)], torch.tensor(teacher))) == pytest.approx(0.0, abs=1e-6)
    moved = student + rng.normal(size=student.shape)
    assert float(loss([torch.tensor(moved)], torch.tensor(teacher))) > 1e-3


def test_gradient_reaches_the_student_and_not_the_teacher():
    rng = np.random.default_rng(3)
    student = torch.tensor(rng.normal(size=(6, 8)), requires_grad=True)
    teacher = torch.tensor(rng.normal(size=(6, 12)), requires_grad=True)
    SimilarityDistillLoss()([student], teacher).backward()
    assert student.grad is not None and float(student.grad.abs().sum()) > 0
    assert teacher.grad is None


def test_refuses_labels_that_are_not_embeddings_and_batches_too_small():
    loss = SimilarityDistillLoss()
    with pytest.raises(ValueError, match="teacher embeddings as labels"):
        loss.prepare_labels(np.zeros(4))
    with pytest.raises(ValueError, match="do not fit 2 text column"):
        loss([torch.zeros(3, 4), torch.zeros(3, 4)], torch.zeros(3, 3, 5))
    with pytest.raises(ValueError, match="at least 3 texts"):
        loss([torch.ones(2, 4)], torch.ones(2, 5))


def test_cached_step_equals_the_plain_step(tiny_encoder):
    rng = np.random.default_rng(4)
    n = 12
    data = dataset({"anchor": texts(n, 20), "positive": texts(n, 21)})
    data.columns["score"] = list(rng.normal(size=(n, 2, 24)).astype(np.float32))  # a 24-d teacher
    task = Task("t", data, get_loss("similarity_distill", temperature=0.1))
    plain, cached = plain_and_cached(tiny_encoder, task, tuple(range(n)), mini_batch_size=5)
    assert_same(plain, cached)


def test_a_pipeline_teacher_task_trains_without_a_projection(tmp_path, tiny_model_dir):
    teacher = make_teacher_dir(tmp_path)  # a 24-d teacher for a 32-d student
    path = write_pipeline(tmp_path, tiny_model_dir, teacher=str(teacher), loss="similarity_distill")
    result = run_pipeline(load_pipeline(path), output=str(tmp_path / "run"))
    trained = Encoder.load(result["final"])
    assert trained.dim == 32 and getattr(trained, "dense", None) is None
    assert not (tmp_path / "run" / "2_Dense").exists() and result["stages"][0]["steps"] == 5
    start = Encoder.load(tiny_model_dir)
    assert any(
        not torch.equal(a, b) for a, b in zip(start.state_dict().values(), trained.state_dict().values())
    )
