"""InfoNCE's directions, partition modes and hardness-weighted negatives equal sentence-transformers'
``MultipleNegativesRankingLoss`` on the same batch: loss value and gradient w.r.t. every embedding."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from embforge.losses import InfoNCELoss, get_loss
from embforge.losses.infonce import DIRECTIONS, GTE_DIRECTIONS, HARDNESS_MODES

OTHERS = DIRECTIONS[1:]
DIRECTION_SETS = [("query_to_doc", *extra) for r in range(4) for extra in itertools.combinations(OTHERS, r)]
SETTINGS = [(d, "joint") for d in DIRECTION_SETS] + [
    (("query_to_doc",), "per_direction"),
    (("query_to_doc", "doc_to_query"), "per_direction"),
]


@pytest.fixture
def st_losses():
    return pytest.importorskip("sentence_transformers.sentence_transformer.losses")


def batch(columns: int, seed: int = 0, n: int = 6, dim: int = 16) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, dim, generator=g, requires_grad=True) for _ in range(columns)]


def value_and_grads(loss_fn, embeddings):
    loss = loss_fn(embeddings)
    return loss.detach(), torch.autograd.grad(loss, embeddings)


def assert_same(ours_fn, theirs_fn, embeddings) -> None:
    ours, our_grads = value_and_grads(ours_fn, embeddings)
    theirs, their_grads = value_and_grads(theirs_fn, embeddings)
    assert torch.isfinite(ours) and float(ours) > 0.01  # a real, non-degenerate value
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6, abs=1e-6)
    for mine, ref in zip(our_grads, their_grads):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)
    assert any(float(g.abs().max()) > 1e-3 for g in our_grads)


def reference(st_losses, **options):
    loss = st_losses.MultipleNegativesRankingLoss(model=torch.nn.Identity(), scale=20.0, **options)
    return lambda embeddings: loss.compute_loss_from_embeddings(embeddings, None)


@pytest.mark.parametrize("negatives", [0, 1, 2])
@pytest.mark.parametrize(("directions", "partition_mode"), SETTINGS)
def test_directions_and_partition_equal_mnrl(st_losses, directions, partition_mode, negatives):
    embeddings = batch(2 + negatives, seed=negatives)
    ours = InfoNCELoss(temperature=0.05, directions=directions, partition_mode=partition_mode)
    theirs = reference(st_losses, directions=directions, partition_mode=partition_mode)
    assert_same(ours, theirs, embeddings)


@pytest.mark.parametrize("negatives", [0, 1, 2])
@pytest.mark.parametrize("hardness_mode", HARDNESS_MODES)
@pytest.mark.parametrize(
    ("directions", "partition_mode"),
    [
        (("query_to_doc",), "joint"),
        (GTE_DIRECTIONS, "joint"),
        (("query_to_doc", "doc_to_query"), "per_direction"),
    ],
)
def test_hardness_weighting_equals_mnrl(st_losses, hardness_mode, negatives, directions, partition_mode):
    embeddings = batch(2 + negatives, seed=10 + negatives)
    options = {
        "directions": directions,
        "partition_mode": partition_mode,
        "hardness_mode": hardness_mode,
        "hardness_strength": 5.0,
    }
    assert_same(InfoNCELoss(temperature=0.05, **options), reference(st_losses, **options), embeddings)


def test_hardness_changes_the_loss_only_where_it_applies():
    """``hard_negatives`` without a negative column is plain InfoNCE; the other modes raise the loss (each
    penalised logit grows by α·cos, and most cosines of random vectors are far from zero either way)."""
    pairs, triplets = [e.detach() for e in batch(2, seed=3)], [e.detach() for e in batch(3, seed=3)]
    plain = InfoNCELoss()
    hard = InfoNCELoss(hardness_mode="hard_negatives", hardness_strength=5.0)
    assert float(hard(pairs)) == pytest.approx(float(plain(pairs)), rel=1e-7)
    assert float(hard(triplets)) != pytest.approx(float(plain(triplets)), rel=1e-3)


def test_symmetric_is_the_two_directions_per_direction(st_losses):
    embeddings = batch(3, seed=4)
    symmetric = InfoNCELoss(symmetric=True)
    assert (
        symmetric.directions == ("query_to_doc", "doc_to_query")
        and symmetric.partition_mode == "per_direction"
    )
    loss = st_losses.MultipleNegativesSymmetricRankingLoss(model=torch.nn.Identity(), scale=20.0)
    assert_same(symmetric, lambda e: loss.compute_loss_from_embeddings(e, None), embeddings)


def test_gte_by_hand():
    """The joint GTE partition function written out entry by entry for one row."""
    q, d = (e.detach() for e in batch(2, seed=5, n=3, dim=4))
    loss = InfoNCELoss(temperature=0.5, directions=GTE_DIRECTIONS)
    cos = torch.nn.functional.cosine_similarity
    with torch.no_grad():
        rows = []
        for i in range(3):
            terms = [cos(q[i], d[j], dim=0) for j in range(3)]
            terms += [cos(q[i], q[j], dim=0) for j in range(3) if j != i]
            terms += [cos(d[i], q[j], dim=0) for j in range(3)]
            terms += [cos(d[i], d[j], dim=0) for j in range(3) if j != i]
            z = sum(math.exp(float(t) / 0.5) for t in terms)
            rows.append(math.log(z) - float(cos(q[i], d[i], dim=0)) / 0.5)
    assert float(loss([q, d])) == pytest.approx(sum(rows) / 3, rel=1e-5)


def test_directions_from_the_cli_and_refusals():
    assert get_loss("infonce", directions="query_to_doc, doc_to_doc").directions == (
        "query_to_doc",
        "doc_to_doc",
    )
    with pytest.raises(ValueError, match="must include 'query_to_doc'"):
        InfoNCELoss(directions=["doc_to_query"])
    with pytest.raises(ValueError, match="directions must be some of"):
        InfoNCELoss(directions=["query_to_doc", "doc_to_anything"])
    with pytest.raises(ValueError, match="not both"):
        InfoNCELoss(symmetric=True, directions=GTE_DIRECTIONS)
    with pytest.raises(ValueError, match="use partition_mode 'joint'"):
        InfoNCELoss(directions=GTE_DIRECTIONS, partition_mode="per_direction")
    with pytest.raises(ValueError, match="partition_mode must be one of"):
        InfoNCELoss(partition_mode="each")
    with pytest.raises(ValueError, match="need both hardness_mode and hardness_strength"):
        InfoNCELoss(hardness_mode="all_negatives")  # strength 0: would do nothing
    with pytest.raises(ValueError, match="need both hardness_mode and hardness_strength"):
        InfoNCELoss(hardness_strength=9.0)
    with pytest.raises(ValueError, match="hardness_mode must be one of"):
        InfoNCELoss(hardness_mode="hardest", hardness_strength=1.0)


@pytest.mark.parametrize("columns", [2, 3])
def test_the_default_direction_costs_what_a_plain_cross_entropy_costs(columns):
    """The options must not tax the default: query -> document InfoNCE dispatches the operators of
    ``cross_entropy(cos(q, D) / tau, arange(n))``, forward and backward (each one a kernel launch on a GPU)."""
    import torch.nn.functional as F

    from embforge.losses.base import cosine_matrix
    from embforge.profiling import op_count

    torch.manual_seed(0)
    batch = [torch.randn(16, 8, requires_grad=True) for _ in range(columns)]

    def ours() -> None:
        InfoNCELoss(temperature=0.05)(batch).backward()

    def plain() -> None:
        logits = cosine_matrix(batch[0], torch.cat(batch[1:])) * 20.0
        F.cross_entropy(logits, torch.arange(16)).backward()

    assert op_count(ours) <= op_count(plain)
