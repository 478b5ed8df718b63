"""Each loss equals its formula computed by hand and the sentence-transformers loss of the same definition."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embforge.losses import (
    ContrastiveLoss,
    CoSENTLoss,
    CosineMSELoss,
    InfoNCELoss,
    MatryoshkaLoss,
    SimCSELoss,
    SoftmaxLoss,
    TripletLoss,
    cosent,
    get_loss,
)


@pytest.fixture
def st_losses():
    """sentence-transformers' losses, the reference (only the parity tests need it installed)."""
    return pytest.importorskip("sentence_transformers.sentence_transformer.losses")


@pytest.fixture
def emb():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(6, 16, generator=g) for _ in range(3)]


def cos(a, b):
    return F.cosine_similarity(a, b, dim=-1)


def st_loss(cls, **kwargs):
    """A sentence-transformers loss object; its ``compute_loss_from_embeddings`` never touches the model."""
    return cls(model=torch.nn.Identity(), **kwargs)


def test_cosent_by_hand_small_example():
    scores = torch.tensor([0.9, 0.2, 0.5])
    labels = torch.tensor([2.0, 0.0, 1.0])
    lam = 20.0
    # pairs (i, j) with y_i > y_j: (0,1), (0,2), (2,1)
    terms = [(0, 1), (0, 2), (2, 1)]
    expected = math.log(1 + sum(math.exp(lam * (float(scores[j]) - float(scores[i]))) for i, j in terms))
    assert cosent(scores, labels, scale=lam).item() == pytest.approx(expected, rel=1e-4)
    # ties contribute nothing; one example gives log(1) = 0
    assert cosent(torch.tensor([0.3, 0.9]), torch.tensor([1.0, 1.0])).item() == pytest.approx(0.0)


def test_cosent_equals_reference(emb, st_losses):
    labels = torch.tensor([0.0, 1.5, 3.0, 5.0, 2.2, 2.2])
    ours = CoSENTLoss(scale=20)(emb[:2], labels)
    ref = st_loss(st_losses.CoSENTLoss, scale=20).compute_loss_from_embeddings(emb[:2], labels)
    assert abs(ours.item() - ref.item()) <= 1e-5


def test_cosent_is_finite_in_half_precision():
    scores = torch.tensor([1.0, -1.0, 0.99, -0.99] * 8, dtype=torch.float16)
    labels = torch.tensor([0.0, 5.0, 0.1, 4.9] * 8)
    assert torch.isfinite(cosent(scores, labels, scale=1000.0))
    bf = [torch.randn(8, 16).to(torch.bfloat16) for _ in range(2)]
    assert torch.isfinite(CoSENTLoss()(bf, torch.arange(8.0)))


@pytest.mark.parametrize("negatives", [0, 1])
def test_infonce_equals_mnrl_and_formula(emb, negatives, st_losses):
    cols = emb[: 2 + negatives]
    ours = InfoNCELoss(temperature=0.05)(cols, None)
    ref = st_loss(st_losses.MultipleNegativesRankingLoss, scale=20.0).compute_loss_from_embeddings(cols, None)
    assert abs(ours.item() - ref.item()) <= 1e-5
    a, cands = cols[0], torch.cat(cols[1:])
    logits = F.normalize(a, dim=-1) @ F.normalize(cands, dim=-1).T / 0.05
    by_hand = -np.mean([logits[i, i].item() - torch.logsumexp(logits[i], 0).item() for i in range(len(a))])
    assert ours.item() == pytest.approx(by_hand, rel=1e-5)


def test_symmetric_infonce_equals_symmetric_reference(emb, st_losses):
    ours = InfoNCELoss(temperature=0.05, symmetric=True)(emb[:2], None)
    ref = st_loss(st_losses.MultipleNegativesSymmetricRankingLoss, scale=20.0).compute_loss_from_embeddings(
        emb[:2], None
    )
    assert abs(ours.item() - ref.item()) <= 1e-5


def test_simcse_is_infonce_on_two_views(emb):
    loss = SimCSELoss(temperature=0.05)
    assert loss.repeat_single_text and loss.min_texts == loss.max_texts == 1
    assert loss(emb[:2], None).item() == pytest.approx(InfoNCELoss(0.05)(emb[:2], None).item())


def test_mse_equals_cosine_similarity_loss(emb, st_losses):
    labels = torch.tensor([0.1, 0.5, 0.9, 0.0, 1.0, 0.3])
    ours = CosineMSELoss()(emb[:2], labels)
    ref = st_loss(st_losses.CosineSimilarityLoss).compute_loss_from_embeddings(emb[:2], labels)
    assert abs(ours.item() - ref.item()) <= 1e-5
    assert ours.item() == pytest.approx(((cos(emb[0], emb[1]) - labels) ** 2).mean().item(), rel=1e-6)
    np.testing.assert_allclose(CosineMSELoss().prepare_labels(np.array([0.0, 2.5, 4.6])), [0.0, 0.5, 0.92])


def test_contrastive_equals_reference_and_formula(emb, st_losses):
    labels = torch.tensor([1, 0, 1, 0, 0, 1])
    ours = ContrastiveLoss(margin=0.5)(emb[:2], labels)
    ref = st_loss(st_losses.ContrastiveLoss, margin=0.5).compute_loss_from_embeddings(emb[:2], labels)
    assert abs(ours.item() - ref.item()) <= 1e-5
    d = 1 - cos(emb[0], emb[1])
    y = labels.float()
    by_hand = (0.5 * (y * d**2 + (1 - y) * torch.clamp(0.5 - d, min=0) ** 2)).mean()
    assert ours.item() == pytest.approx(by_hand.item(), rel=1e-6)


@pytest.mark.parametrize(("metric", "margin"), [("euclidean", 5.0), ("cosine", 0.3)])
def test_triplet_equals_reference_and_formula(emb, metric, margin, st_losses):
    ours = TripletLoss(margin=margin, distance=metric)(emb, None)
    st_metric = getattr(st_losses.TripletDistanceMetric, metric.upper())
    ref = st_loss(st_losses.TripletLoss, distance_metric=st_metric, triplet_margin=margin)
    assert abs(ours.item() - ref.compute_loss_from_embeddings(emb, None).item()) <= 1e-5
    if metric == "euclidean":
        d_ap, d_an = (emb[0] - emb[1]).norm(dim=1), (emb[0] - emb[2]).norm(dim=1)
        assert ours.item() == pytest.approx(torch.clamp(d_ap - d_an + margin, min=0).mean().item(), rel=1e-6)


class _Precomputed(torch.nn.Module):
    """Stands in for a SentenceTransformer inside a reference loss: returns given embeddings per column."""

    def __init__(self, columns):
        super().__init__()
        self.columns = columns
        self.calls = 0

    def forward(self, features):
        out = {"sentence_embedding": self.columns[self.calls % len(self.columns)].clone()}
        self.calls += 1
        return out

    def get_embedding_dimension(self):
        return self.columns[0].shape[1]

    @property
    def device(self):
        return torch.device("cpu")


def test_softmax_equals_reference(emb, st_losses):
    labels = torch.tensor([0, 1, 2, 1, 0, 2])
    ours = SoftmaxLoss(dim=16, num_labels=3)
    ref = st_losses.SoftmaxLoss(_Precomputed(emb[:2]), embedding_dimension=16, num_labels=3)
    ours.classifier.load_state_dict(ref.classifier.state_dict())
    assert abs(ours(emb[:2], labels).item() - ref([{}, {}], labels).item()) <= 1e-5
    features = torch.cat([emb[0], emb[1], (emb[0] - emb[1]).abs()], dim=1)
    by_hand = F.cross_entropy(ours.classifier(features), labels)
    assert ours(emb[:2], labels).item() == pytest.approx(by_hand.item(), rel=1e-6)


def test_matryoshka_equals_reference_and_weighted_sum(emb, st_losses):
    labels = torch.tensor([0.0, 1.0, 3.0, 5.0, 2.0, 4.0])
    dims, weights = [16, 8, 4], [1.0, 0.5, 0.25]
    ours = MatryoshkaLoss(CoSENTLoss(), dims, weights)(emb[:2], labels)
    model = _Precomputed(emb[:2])
    ref = st_losses.MatryoshkaLoss(model, st_losses.CoSENTLoss(model), dims, weights)([{}, {}], labels)
    assert abs(ours.item() - ref.item()) <= 1e-5
    by_hand = sum(w * CoSENTLoss()([e[:, :d] for e in emb[:2]], labels) for d, w in zip(dims, weights))
    assert ours.item() == pytest.approx(by_hand.item(), rel=1e-5)
    with pytest.raises(ValueError, match="cannot be wrapped"):
        MatryoshkaLoss(SoftmaxLoss(16, 3), [8])
    with pytest.raises(ValueError, match="larger than the embedding size"):
        MatryoshkaLoss(CoSENTLoss(), [32])(emb[:2], labels)


def test_get_loss_by_name_and_errors():
    assert isinstance(get_loss("infonce", temperature=0.02), InfoNCELoss)
    assert isinstance(get_loss("cosent", matryoshka_dims=[8, 4]), MatryoshkaLoss)
    assert isinstance(get_loss("softmax", dim=8, num_labels=3), SoftmaxLoss)
    with pytest.raises(ValueError, match="unknown loss 'cosine'"):
        get_loss("cosine")
    with pytest.raises(ValueError, match="bad option for loss 'cosent'"):
        get_loss("cosent", temperature=0.1)
