"""Classification / clustering losses equal straightforward loop implementations of their formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from embforge.losses import ClusterLoss, MatryoshkaLoss, PrototypeLoss, SupConLoss, get_loss


def _cos(a, b):
    return float(F.cosine_similarity(a, b, dim=0))


def test_prototype_loss_is_cross_entropy_of_cosine_over_temperature():
    torch.manual_seed(0)
    loss = PrototypeLoss(dim=6, num_labels=3, temperature=0.1)
    e, y = torch.randn(5, 6), torch.tensor([0, 2, 1, 1, 0])
    expected = 0.0
    for i in range(5):
        logits = [_cos(e[i], loss.prototypes[k]) / 0.1 for k in range(3)]
        expected -= logits[y[i]] - math.log(sum(math.exp(v) for v in logits))
    assert float(loss([e], y)) == pytest.approx(expected / 5, rel=1e-5)
    # the prototypes learn: one step of SGD on them lowers the loss
    opt = torch.optim.SGD(loss.parameters(), lr=0.5)
    before = loss([e], y)
    before.backward()
    opt.step()
    assert float(loss([e], y)) < float(before)


def test_supcon_matches_a_loop_reference():
    torch.manual_seed(1)
    e, y, tau = torch.randn(7, 5), torch.tensor([0, 1, 0, 2, 1, 0, 3]), 0.2
    total, anchors = 0.0, 0
    for i in range(7):
        pos = [j for j in range(7) if j != i and y[j] == y[i]]
        if not pos:
            continue
        denom = sum(math.exp(_cos(e[i], e[a]) / tau) for a in range(7) if a != i)
        total += -sum(_cos(e[i], e[p]) / tau - math.log(denom) for p in pos) / len(pos)
        anchors += 1
    assert float(SupConLoss(tau)([e], y)) == pytest.approx(total / anchors, rel=1e-5)


def test_cluster_loss_matches_a_loop_reference_with_leave_one_out_centres():
    torch.manual_seed(2)
    e, y, tau = torch.randn(8, 4), torch.tensor([3, 1, 3, 1, 3, 7, 1, 9]), 0.1
    n = F.normalize(e, dim=-1)
    classes = sorted(set(y.tolist()))
    total, anchors = 0.0, 0
    for i in range(8):
        if sum(int(v == y[i]) for v in y) < 2:
            continue
        logits = []
        for k in classes:
            members = [j for j in range(8) if y[j] == k and j != i]
            logits.append(_cos(n[i], n[members].sum(0)) / tau)
        own = classes.index(int(y[i]))
        total -= logits[own] - math.log(sum(math.exp(v) for v in logits))
        anchors += 1
    assert float(ClusterLoss(tau)([e], y)) == pytest.approx(total / anchors, rel=1e-5)


def test_batches_without_a_pair_give_zero_with_a_gradient():
    e = torch.randn(3, 4, requires_grad=True)
    for loss in (ClusterLoss(), SupConLoss()):
        value = loss([e], torch.tensor([0, 1, 2]))
        value.backward()
        assert float(value) == 0.0


def test_get_loss_builds_prototypes_and_matryoshka_slices_them():
    loss = get_loss("prototype", dim=8, num_labels=4, matryoshka_dims=[8, 4], temperature=0.1)
    assert isinstance(loss, MatryoshkaLoss) and loss.needs_labels and loss.max_texts == 1
    assert torch.isfinite(loss([torch.randn(6, 8)], torch.tensor([0, 1, 2, 3, 0, 1])))
    with pytest.raises(ValueError, match="number of labels"):
        get_loss("prototype", dim=8)


def test_prototypes_start_at_the_class_means_of_the_model(tiny_encoder):
    """Random prototypes trained at the encoder's learning rate barely move in a short run, so the loss dragged
    every text towards a random direction (the general recipe lost Banking77 accuracy). A task's prototype loss
    starts at the normalised mean embedding of each class under the model being trained."""
    import numpy as np

    from embforge.data.tables import Dataset
    from embforge.training.run import make_loss

    texts = ["a cat sat", "the cat", "dogs run fast", "a dog ran", "fish swim", "red fish", "cats nap"]
    labels = [0, 0, 1, 1, 2, 2, 0]
    data = Dataset("intents.jsonl", {"text": texts, "label": labels}, lines=list(range(1, 8)))
    emb = tiny_encoder.encode(texts, normalize=True)
    means = np.stack([emb[np.array(labels) == k].mean(0) for k in range(3)])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    for matryoshka in (None, [16, tiny_encoder.dim]):
        loss = make_loss("prototype", model=tiny_encoder, data=data, matryoshka_dims=matryoshka)
        inner = loss.inner if isinstance(loss, MatryoshkaLoss) else loss
        got = torch.nn.functional.normalize(inner.prototypes.detach(), dim=-1).numpy()
        np.testing.assert_allclose(got, means, atol=1e-5)
