"""Cross-encoder losses: parity with sentence-transformers' cross-encoder losses, CoSENT by hand, listwise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from embforge.losses.cross import CROSS_LOSSES, get_cross_loss
from tests.conftest import make_cross_encoder

PAIRS = [
    ("a man plays the guitar", "a man is playing guitar"),
    ("a woman eats food", "the stock market rises"),
    ("a cat runs in the park", "a dog runs in the park"),
    ("the sun in the sky", "rain on the river"),
    ("a child reads a book", "a child is reading"),
]


def test_cosent_on_scores_matches_the_formula_by_hand():
    scores = torch.tensor([[1.5], [0.2], [-0.7], [0.9]])
    labels = torch.tensor([3.0, 1.0, 0.0, 1.0])
    scale = 2.0
    s = scores.reshape(-1).tolist()
    y = labels.tolist()
    total = 1.0
    for i in range(4):
        for j in range(4):
            if y[i] > y[j]:
                total += math.exp(scale * (s[j] - s[i]))
    loss = get_cross_loss("cosent", scale=scale)(scores, labels)
    assert float(loss) == pytest.approx(math.log(total), abs=1e-6)


def test_listwise_is_cross_entropy_with_the_positive_first():
    scores = torch.tensor([[2.0, 1.0, -1.0], [0.0, 0.5, 0.1]])
    loss = get_cross_loss("listwise")(scores, None)
    by_hand = -np.mean([s[0] - math.log(sum(math.exp(v) for v in s)) for s in scores.tolist()])
    assert float(loss) == pytest.approx(by_hand, abs=1e-6)


def test_bce_rejects_graded_labels_without_label_max():
    with pytest.raises(ValueError, match="label_max"):
        get_cross_loss("bce").prepare_labels(np.array([0.0, 2.5, 5.0]))
    assert get_cross_loss("bce", label_max=5).prepare_labels(np.array([0.0, 5.0])).tolist() == [0.0, 1.0]


def test_unknown_loss_names_the_choices():
    with pytest.raises(ValueError, match="bce, ce, cosent, mse, listwise"):
        get_cross_loss("hinge")
    assert set(CROSS_LOSSES) == {"bce", "ce", "cosent", "mse", "listwise", "margin_mse", "kl_distill"}


@pytest.mark.parametrize(
    ("name", "st_name", "num_labels", "labels"),
    [
        ("bce", "BinaryCrossEntropyLoss", 1, [1.0, 0.0, 1.0, 0.0, 0.3]),
        ("ce", "CrossEntropyLoss", 2, [1, 0, 1, 0, 1]),
        ("mse", "MSELoss", 1, [0.9, 0.1, 0.5, 0.0, 0.7]),
    ],
)
def test_losses_equal_sentence_transformers(tmp_path, name, st_name, num_labels, labels):
    st_losses = pytest.importorskip("sentence_transformers.cross_encoder.losses")
    from sentence_transformers import CrossEncoder as STCrossEncoder

    ours = make_cross_encoder(num_labels)
    ours.save(tmp_path / "ce")
    st = STCrossEncoder(str(tmp_path / "ce"), device="cpu")
    ours.eval()
    st.eval()
    target = torch.tensor(labels)
    items = ours.tokenize_ids([a for a, _ in PAIRS], [b for _, b in PAIRS])
    with torch.no_grad():
        mine = get_cross_loss(name)(ours.score_ids(items), target)
        theirs = getattr(st_losses, st_name)(st)([[a for a, _ in PAIRS], [b for _, b in PAIRS]], target)
    assert float(mine) == pytest.approx(float(theirs), abs=1e-5)
    assert float(mine) > 0.01  # a real, non-degenerate value
