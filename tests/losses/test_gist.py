"""``gist``: InfoNCE whose in-batch negatives a guide vets, equal to sentence-transformers' ``GISTEmbedLoss`` on the
same batch and guide embeddings (loss value and gradient w.r.t. every embedding)."""

from __future__ import annotations

import pytest
import torch

from embforge.losses import GISTLoss, InfoNCELoss, MatryoshkaLoss, get_loss
from embforge.losses.gist import gist_logits
from tests.conftest import make_tokenizer


class Lookup(torch.nn.Module):
    """A stand-in model for sentence-transformers' loss: its "features" carry the embeddings to return."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key, self.tokenizer, self.max_seq_length = key, make_tokenizer(), 128

    def forward(self, features: dict) -> dict:
        return {"sentence_embedding": features[self.key]}


def reference(**options):
    """sentence-transformers' GISTEmbedLoss as a function of (student, guide) embeddings per column."""
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    loss = st_losses.GISTEmbedLoss(Lookup("student"), Lookup("guide"), **options)
    assert not loss.must_retokenize

    def run(student: list[torch.Tensor], guide: list[torch.Tensor]) -> torch.Tensor:
        return loss([{"student": s, "guide": g} for s, g in zip(student, guide)], None)

    return run


def batch(columns: int, *, seed: int, n: int = 8, dim: int = 16, guide_dim: int = 12):
    """Student embeddings (with gradients) and correlated guide embeddings: the guide's cosines resemble the
    student's, so some in-batch candidates score above a positive (what gets masked) and most do not."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(n, columns, 1, guide_dim, generator=g)
    project = torch.randn(guide_dim, dim, generator=g)
    positives_near = torch.randn(n, 1, guide_dim, generator=g)
    base = shared[:, :, 0] + torch.cat(
        [positives_near, positives_near, torch.zeros(n, columns - 2, guide_dim)], 1
    )
    guide = base + 0.7 * torch.randn(n, columns, guide_dim, generator=g)
    student = [
        (base[:, c] @ project + 2.0 * torch.randn(n, dim, generator=g)).requires_grad_()
        for c in range(columns)
    ]
    return student, guide


def value_and_grads(loss: torch.Tensor, student: list[torch.Tensor]):
    return loss.detach(), torch.autograd.grad(loss, student)


CASES = [
    ({"margin_strategy": "absolute", "margin": 0.0}, True, True),
    ({"margin_strategy": "absolute", "margin": 0.1}, True, True),
    ({"margin_strategy": "relative", "margin": 0.05}, True, True),
    ({"margin_strategy": "relative", "margin": 0.2}, False, True),
    ({"margin_strategy": "absolute", "margin": 0.05}, True, False),
    ({"margin_strategy": "absolute", "margin": -0.1}, False, False),
]


@pytest.mark.parametrize("columns", [2, 3])
@pytest.mark.parametrize(("margins", "anchors", "positives"), CASES)
def test_equals_gist_embed_loss(columns, margins, anchors, positives):
    student, guide = batch(columns, seed=columns)
    options = {"temperature": 0.05, "contrast_anchors": anchors, "contrast_positives": positives, **margins}
    ours, our_grads = value_and_grads(GISTLoss(**options)(student, guide), student)
    theirs, their_grads = value_and_grads(reference(**options)(student, list(guide.unbind(1))), student)
    assert float(ours) > 0.05
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6, abs=1e-6)
    for mine, ref in zip(our_grads, their_grads):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)


def test_the_guide_masks_part_of_the_test_batches():
    """The parity batches exercise the mask: a fifth to two fifths of the candidates left out, never a positive."""
    for columns in (2, 3):
        student, guide = batch(columns, seed=columns)
        detached = [s.detach() for s in student]
        for margins, anchors, positives in CASES:
            options = {"contrast_anchors": anchors, "contrast_positives": positives, **margins}
            logits = gist_logits(detached, list(guide.unbind(1)), temperature=0.05, **options)
            self_pairs = len(logits) * (anchors + positives)
            masked = (int(torch.isinf(logits).sum()) - self_pairs) / (logits.numel() - self_pairs)
            assert 0.15 < masked < 0.45
            assert torch.isfinite(logits.diagonal()).all()


def test_without_a_mask_it_is_infonce_with_hard_negatives():
    student, _ = batch(3, seed=3)
    blind = torch.eye(8)[:, None, :].repeat(
        1, 3, 1
    )  # each text its row's direction: nothing above a positive's 1
    loss = GISTLoss(temperature=0.05, contrast_anchors=False, contrast_positives=False)
    assert float(loss(student, blind).detach()) == pytest.approx(
        float(InfoNCELoss(0.05)(student).detach()), rel=1e-6
    )


def test_by_hand_with_two_negative_columns():
    """Four columns (sentence-transformers takes at most three): every entry of the softmax written out."""
    student, guide = batch(4, seed=4, n=5)
    s, g = [e.detach() for e in student], guide.unbind(1)
    tau, margin = 0.05, 0.05
    cos = torch.nn.functional.cosine_similarity
    total = 0.0
    for i in range(5):
        threshold = float(cos(g[0][i], g[1][i], dim=0)) - margin
        kept = [float(cos(s[0][i], s[1][i], dim=0))]
        pools = [(0, 1), (0, 0), (1, 1), (0, 2), (0, 3)]  # (from column, to column): ap, aa, pp, an_1, an_2
        for frm, to in pools:
            for j in range(5):
                if (frm, to, j) in ((0, 1, i), (0, 0, i), (1, 1, i)):
                    continue  # the positive (counted above), the text itself
                if float(cos(g[frm][i], g[to][j], dim=0)) <= threshold:
                    kept.append(float(cos(s[frm][i], s[to][j], dim=0)))
        logits = torch.tensor(kept, dtype=torch.float64) / tau
        total += float(torch.logsumexp(logits, 0) - logits[0])
    ours = GISTLoss(temperature=tau, margin=margin)(s, guide)
    assert float(ours) == pytest.approx(total / 5, rel=1e-5)


def test_options_and_refusals():
    loss = get_loss("gist", guide="all-MiniLM-L6-v2", margin_strategy="relative", margin=0.1)
    assert (loss.guide, loss.margin_strategy, loss.margin, loss.temperature) == (
        "all-MiniLM-L6-v2",
        "relative",
        0.1,
        0.01,
    )
    assert MatryoshkaLoss(loss, [8, 16]).guide == "all-MiniLM-L6-v2"  # the task still embeds with the guide
    assert InfoNCELoss().guide is None
    with pytest.raises(ValueError, match="margin_strategy must be one of"):
        GISTLoss(margin_strategy="percent")
    with pytest.raises(ValueError, match="guide must be a model folder or name"):
        GISTLoss(guide="")
    student, _ = batch(2, seed=5)
    with pytest.raises(ValueError, match="needs the guide's embeddings"):
        GISTLoss()(student, None)
