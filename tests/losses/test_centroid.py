"""The ``centroid`` option: the batch's mean-cosine penalty added to any dense loss, and what it does to a run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embforge.data.tables import read_table
from embforge.encoder import Encoder
from embforge.kinds import ModelKind
from embforge.losses import CentroidLoss, CoSENTLoss, MatryoshkaLoss, get_loss
from embforge.losses.base import cosine_matrix
from embforge.losses.centroid import centroid_penalty
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.pipeline import load_pipeline
from embforge.training.run import new_loss
from embforge.training.tasks import Task


@pytest.fixture
def emb():
    g = torch.Generator().manual_seed(0)
    shared = torch.randn(16, generator=g)  # a common direction: a contracted batch (mean cosine ~0.5)
    return [shared + torch.randn(6, 16, generator=g) for _ in range(2)]


def test_penalty_is_the_mean_cosine_of_all_pairs(emb):
    every = torch.cat(emb)
    assert centroid_penalty(emb).item() == pytest.approx(cosine_matrix(every, every).mean().item(), rel=1e-6)
    assert centroid_penalty(emb).item() > 0.3
    spread = [torch.eye(4), -torch.eye(4)]  # every text's opposite is in the batch: centroid at the origin
    assert centroid_penalty(spread).item() == pytest.approx(0.0, abs=1e-7)


def test_option_adds_the_weighted_penalty_to_any_dense_loss(emb):
    labels = torch.tensor([0.0, 1.0, 3.0, 5.0, 2.0, 4.0])
    plain, with_it = get_loss("cosent"), get_loss("cosent", centroid=20.0)
    assert not isinstance(plain, CentroidLoss) and isinstance(with_it, CentroidLoss)  # a visible wrapper
    assert with_it.centroid == 20.0 and with_it.name == "cosent" and isinstance(with_it.inner, CoSENTLoss)
    expected = plain(emb, labels) + 20.0 * centroid_penalty(emb)
    assert with_it(emb, labels).item() == pytest.approx(expected.item(), rel=1e-6)
    mse = get_loss("mse", centroid=3)
    scores = torch.tensor([0.1, 0.9, 0.3, 0.5, 0.2, 0.7])
    assert mse(emb, scores).item() == pytest.approx(
        (get_loss("mse")(emb, scores) + 3 * centroid_penalty(emb)).item(), rel=1e-6
    )
    # Matryoshka: the penalty of each prefix (normalised like the loss sees it), with that prefix's weight
    nested = get_loss("cosent", centroid=2.0, matryoshka_dims=[16, 8], matryoshka_weights=[1.0, 0.5])
    by_hand = sum(
        w * (CoSENTLoss()([e[:, :d] for e in emb], labels) + 2.0 * centroid_penalty([e[:, :d] for e in emb]))
        for d, w in ((16, 1.0), (8, 0.5))
    )
    assert nested(emb, labels).item() == pytest.approx(float(by_hand), rel=1e-5)
    assert isinstance(nested, MatryoshkaLoss) and isinstance(nested.inner, CentroidLoss)  # the penalty inside


def test_option_gradient_moves_texts_away_from_their_centroid(emb):
    labels = torch.tensor([0.0, 1.0, 3.0, 5.0, 2.0, 4.0])
    moved = [e.clone().requires_grad_(True) for e in emb]
    (get_loss("cosent", centroid=50.0)(moved, labels) - get_loss("cosent")(moved, labels)).backward()
    with torch.no_grad():
        stepped = [e - 0.5 * e.grad for e in moved]
    assert centroid_penalty(stepped) < centroid_penalty(emb)


def test_centroid_columns_spreads_the_leading_columns_only(emb):
    scores = torch.tensor([[0.9, 0.1, 0.3]] * 6)  # a query -> 3 candidates list per row
    lists = [emb[0], emb[1], emb[1].flip(0), -emb[0]]
    plain = get_loss("kl_distill", similarity="cosine", temperature=0.05)
    queries_only = get_loss(
        "kl_distill", similarity="cosine", temperature=0.05, centroid=4.0, centroid_columns=1
    )
    every = get_loss("cosent", centroid=1.0)
    assert isinstance(queries_only, CentroidLoss) and queries_only.centroid_columns == 1
    assert isinstance(every, CentroidLoss) and every.centroid_columns is None
    expected = plain(lists, scores) + 4.0 * centroid_penalty(lists[:1])
    assert queries_only(lists, scores).item() == pytest.approx(expected.item(), rel=1e-6)
    assert centroid_penalty(lists[:1]).item() != pytest.approx(centroid_penalty(lists).item(), rel=0.1)
    grads = {}
    for name, loss in (("plain", plain), ("queries_only", queries_only)):
        moved = [e.clone().requires_grad_(True) for e in lists]
        loss(moved, scores).backward()
        grads[name] = [e.grad for e in moved]
    for plain_grad, grad in zip(grads["plain"][1:], grads["queries_only"][1:], strict=True):
        torch.testing.assert_close(grad, plain_grad)  # the candidates feel nothing of the penalty
    assert not torch.allclose(grads["queries_only"][0], grads["plain"][0])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"centroid": 1.0, "centroid_columns": 0}, "must be an integer >= 1, got 0"),
        ({"centroid": 1.0, "centroid_columns": 1.5}, "must be an integer >= 1, got 1.5"),
        ({"centroid": 1.0, "centroid_columns": True}, "must be an integer >= 1, got True"),
        ({"centroid_columns": 1}, "needs a 'centroid' weight > 0 beside it"),
    ],
)
def test_centroid_columns_rejects_what_is_not_a_column_count(options, message):
    with pytest.raises(ValueError, match=message):
        get_loss("cosent", **options)


@pytest.mark.parametrize("value", [-1.0, float("nan"), True, "20"])
def test_option_rejects_what_is_not_a_weight(value):
    with pytest.raises(ValueError, match="option 'centroid' of loss 'cosent' must be a number >= 0"):
        get_loss("cosent", centroid=value)


def test_option_is_refused_where_there_is_no_dense_embedding(sts_csv):
    with pytest.raises(ValueError, match="not to the sparse 'splade' loss"):
        get_loss("splade", centroid=1.0)
    data = read_table(sts_csv)
    for kind in (ModelKind.CROSS, ModelKind.MULTIVECTOR):
        with pytest.raises(ValueError, match="bad option"):
            new_loss(
                "infonce" if kind == ModelKind.MULTIVECTOR else "cosent",
                kind=kind,
                dim=None,
                data=data,
                options={"centroid": 1.0},
            )


def test_a_cosent_run_with_the_option_ends_less_contracted(tmp_path, tiny_model_dir, sts_csv):
    data = read_table(sts_csv)
    texts = list(dict.fromkeys(data.columns["sentence1"] + data.columns["sentence2"]))

    def mean_cosine(centroid: float) -> float:
        model = Encoder.load(tiny_model_dir)
        loss = new_loss("cosent", dim=model.dim, data=data, options={"centroid": centroid})
        config = TrainConfig(
            output=str(tmp_path / f"c{centroid}"),
            batch_size=8,
            max_steps=12,
            lr=1e-3,
            quiet=True,
            device="cpu",
            amp="no",
            seed=3,
        )
        train(model, [Task("sts", data, loss)], config)
        e = model.encode(texts, batch_size=16)
        e = e / np.linalg.norm(e, axis=1, keepdims=True)
        return float((e @ e.T).mean())

    assert mean_cosine(50.0) < mean_cosine(0.0) - 0.2  # a random BERT starts contracted (~0.9)


def test_the_centroid_recipe_sets_it_on_its_tasks_without_in_batch_negatives_only():
    recipe = Path(__file__).resolve().parents[2] / "benchmarks" / "general_centroid.toml"
    tasks = load_pipeline(recipe).stages[0].tasks
    losses = {t.name: get_loss(t.loss, dim=384, num_labels=77, **t.options) for t in tasks}
    weights = {
        name: loss.centroid if isinstance(loss, CentroidLoss) else 0.0 for name, loss in losses.items()
    }
    assert weights == {"stsb": 20.0, "mrpc": 20.0, "wikiqa-lists": 10.0} | {
        n: 0.0 for n in weights if n not in ("stsb", "mrpc", "wikiqa-lists")
    }
    assert {t.loss for t in tasks if weights[t.name]} == {"cosent", "kl_distill"}
    wikiqa, stsb = losses["wikiqa-lists"], losses["stsb"]
    assert isinstance(wikiqa, CentroidLoss) and wikiqa.centroid_columns == 1  # the questions only
    assert isinstance(stsb, CentroidLoss) and stsb.centroid_columns is None
