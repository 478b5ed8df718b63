"""Distillation losses (embforge.losses.distill and the cross-encoder ones): by hand and vs sentence-transformers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from embforge.losses import get_loss
from embforge.losses.cross import get_cross_loss
from embforge.losses.distill import KLDistillLoss, MarginMSEDistillLoss, MSEDistillLoss


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _softmax(row: list[float], t: float) -> list[float]:
    exps = [math.exp(x / t) for x in row]
    return [e / sum(exps) for e in exps]


# ------------------------------------------------------------------ mse_distill
def test_mse_distill_by_hand_2d_and_3d_labels() -> None:
    s1, s2, t = _rand(4, 6, seed=1), _rand(4, 6, seed=2), _rand(4, 6, seed=3)
    loss = get_loss("mse_distill")
    expected = (((s1 - t) ** 2).mean() + ((s2 - t) ** 2).mean()) / 2
    assert torch.allclose(loss([s1, s2], t), expected)
    t2 = _rand(4, 6, seed=4)
    both = torch.stack([t, t2], dim=1)
    expected = (((s1 - t) ** 2).mean() + ((s2 - t2) ** 2).mean()) / 2
    assert torch.allclose(loss([s1, s2], both), expected)


def test_mse_distill_asks_for_a_projection_when_dims_differ() -> None:
    with pytest.raises(ValueError, match=r"add_projection\(model, 8\)"):
        MSEDistillLoss()([_rand(3, 4)], _rand(3, 8))
    with pytest.raises(ValueError, match=r"\(rows, 2, dim\)"):
        MSEDistillLoss()([_rand(3, 4), _rand(3, 4)], _rand(3, 3, 4))


def test_mse_distill_equals_sentence_transformers() -> None:
    st = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    ref = st.MSELoss(model=SimpleNamespace())
    cols, t = [_rand(5, 7, seed=i) for i in range(3)], _rand(5, 7, seed=9)
    assert torch.allclose(MSEDistillLoss()(cols, t), ref.compute_loss_from_embeddings(cols, [t] * 3))
    per_col = _rand(5, 3, 7, seed=10)
    assert torch.allclose(
        MSEDistillLoss()(cols, per_col), ref.compute_loss_from_embeddings(cols, list(per_col.unbind(1)))
    )


# ------------------------------------------------------------------ margin_mse
def test_margin_mse_by_hand() -> None:
    q, p, n1, n2 = (_rand(3, 4, seed=i) for i in range(4))
    scores = torch.tensor([[0.9, 0.1, 0.3], [0.5, 0.6, 0.0], [0.2, -0.1, 0.2]])
    loss = MarginMSEDistillLoss(similarity="dot")
    total = 0.0
    for i in range(3):
        sp = float(q[i] @ p[i])
        for j, n in enumerate((n1, n2)):
            student = sp - float(q[i] @ n[i])
            teacher = float(scores[i, 0] - scores[i, j + 1])
            total += (student - teacher) ** 2
    assert float(loss([q, p, n1, n2], scores)) == pytest.approx(total / 6, rel=1e-5)
    margins = scores[:, :1] - scores[:, 1:]  # the same teacher signal given as margins
    assert float(loss([q, p, n1, n2], margins)) == pytest.approx(total / 6, rel=1e-5)
    with pytest.raises(ValueError, match="3 scores"):
        loss([q, p, n1, n2], _rand(3, 4))


def test_margin_mse_cosine_uses_cosines() -> None:
    q, p, n = _rand(4, 5, seed=1), _rand(4, 5, seed=2), _rand(4, 5, seed=3)
    margin = torch.tensor([0.2, 0.1, -0.3, 0.0])
    cos = torch.nn.functional.cosine_similarity
    expected = ((cos(q, p) - cos(q, n) - margin) ** 2).mean()
    assert torch.allclose(MarginMSEDistillLoss(similarity="cosine")([q, p, n], margin), expected)


def test_margin_mse_equals_sentence_transformers() -> None:
    st = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    ref = st.MarginMSELoss(model=SimpleNamespace())
    cols = [_rand(6, 8, seed=i) for i in range(4)]
    for labels in (_rand(6, 3, seed=7), _rand(6, 2, seed=8)):
        assert torch.allclose(
            MarginMSEDistillLoss()(cols, labels), ref.compute_loss_from_embeddings(cols, labels)
        )
    single = cols[:3]
    margin = _rand(6, seed=5)
    assert torch.allclose(
        MarginMSEDistillLoss()(single, margin), ref.compute_loss_from_embeddings(single, margin)
    )


# ------------------------------------------------------------------ kl_distill
def test_kl_distill_by_hand_with_two_temperatures() -> None:
    q, c1, c2, c3 = (_rand(2, 3, seed=i) for i in range(4))
    teacher = torch.tensor([[3.0, 1.0, 0.0], [0.5, 0.4, 2.0]])
    ts, tt = 0.5, 2.0
    total = 0.0
    for i in range(2):
        student = [float(q[i] @ c[i]) for c in (c1, c2, c3)]
        p_t, p_s = _softmax(teacher[i].tolist(), tt), _softmax(student, ts)
        total += sum(a * (math.log(a) - math.log(b)) for a, b in zip(p_t, p_s))
    loss = get_loss("kl_distill", student_temperature=ts, teacher_temperature=tt)
    assert float(loss([q, c1, c2, c3], teacher)) == pytest.approx(ts**2 * total / 2, rel=1e-5)


def test_kl_scale_replaces_the_temperature_squared_factor_of_every_kl_loss() -> None:
    """``scale`` (``options = { scale = 1.0 }``) keeps the KL at its own size: at τ_s = 0.05 the default τ_s²
    factor makes it 400x smaller than the same KL with scale 1."""
    q, c1, c2 = (_rand(4, 3, seed=i) for i in range(3))
    teacher = _rand(4, 2, seed=9)
    hinton = get_loss("kl_distill", similarity="cosine", temperature=0.05)
    plain = get_loss("kl_distill", similarity="cosine", temperature=0.05, scale=1.0)
    assert float(plain([q, c1, c2], teacher)) == pytest.approx(
        400 * float(hinton([q, c1, c2], teacher)), rel=1e-5
    )
    texts, targets = _rand(6, 4, seed=3), _rand(6, 8, seed=4)
    relational = [get_loss("similarity_distill", scale=s) for s in (None, 2.0)]  # its default scale is 1
    base, scaled = (float(loss([texts], targets)) for loss in relational)
    assert scaled == pytest.approx(2.0 * base, rel=1e-5)
    cross = get_cross_loss("kl_distill", scale=1.0, temperature=0.5)
    logits, scores = _rand(3, 4, seed=5), _rand(3, 4, seed=6)
    assert float(cross(logits, scores)) == pytest.approx(
        4 * float(get_cross_loss("kl_distill", temperature=0.5)(logits, scores)), rel=1e-5
    )
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="scale must be positive"):
            get_loss("kl_distill", scale=bad)


def test_kl_distill_is_zero_when_the_student_matches_the_teacher() -> None:
    q = torch.eye(3)
    cands = [torch.eye(3) * 2.0, torch.zeros(3, 3)]  # dot scores: 2 and 0 for every row
    teacher = torch.tensor([[2.0, 0.0]] * 3)
    assert float(KLDistillLoss()([q, *cands], teacher)) == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(ValueError, match="one teacher score per candidate"):
        KLDistillLoss()([q, *cands], torch.zeros(3, 3))


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_kl_distill_equals_sentence_transformers(temperature: float) -> None:
    st = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    ref = st.DistillKLDivLoss(model=SimpleNamespace(), temperature=temperature)
    cols = [_rand(5, 8, seed=i) for i in range(4)]
    teacher = _rand(5, 3, seed=11)
    ours = KLDistillLoss(temperature=temperature)(cols, teacher)
    assert torch.allclose(ours, ref.compute_loss_from_embeddings(cols, teacher), atol=1e-6)


# ------------------------------------------------------------------ cross-encoder students
def test_cross_margin_mse_by_hand_and_vs_sentence_transformers() -> None:
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 0.3]])
    teacher = torch.tensor([[5.0, 3.0, 1.0], [1.0, 1.5, -2.0]])
    loss = get_cross_loss("margin_mse")
    assert loss.grouped and loss.needs_labels
    student_margins = logits[:, :1] - logits[:, 1:]
    teacher_margins = teacher[:, :1] - teacher[:, 1:]
    assert torch.allclose(loss(logits, teacher), ((student_margins - teacher_margins) ** 2).mean())
    st = pytest.importorskip("sentence_transformers.cross_encoder.losses")
    from sentence_transformers import CrossEncoder as STCrossEncoder

    class Scorer(STCrossEncoder):  # never called: the logits are given below
        num_labels = 1

        def __init__(self) -> None:
            torch.nn.Module.__init__(self)

    ref = st.MarginMSELoss(model=Scorer())
    # the reference scores pairs with its model; give it the same logits per column
    columns = iter(logits.T)
    ref.logits_from_pairs = lambda pairs, prompt=None, task=None: next(columns)
    texts = [["q1", "q2"], ["p1", "p2"], ["n1", "n2"], ["m1", "m2"]]
    assert torch.allclose(loss(logits, teacher), ref(texts, teacher))


def test_cross_kl_distill_by_hand() -> None:
    logits = torch.tensor([[2.0, 0.5, -1.0]])
    teacher = torch.tensor([[1.0, 0.0, 0.0]])
    p_t, p_s = _softmax([1.0, 0.0, 0.0], 0.5), _softmax([2.0, 0.5, -1.0], 1.0)
    expected = sum(a * (math.log(a) - math.log(b)) for a, b in zip(p_t, p_s))
    loss = get_cross_loss("kl_distill", teacher_temperature=0.5)
    assert float(loss(logits, teacher)) == pytest.approx(expected, rel=1e-5)
