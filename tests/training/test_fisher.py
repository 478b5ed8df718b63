"""The EWC anchor (embforge/training/fisher.py, anchor.py): the starting model's Fisher information per weight, and
each weight pulled back at its own rate after every step."""

from __future__ import annotations

import pytest
import torch

from embforge.data.tables import read_table
from embforge.losses import get_loss
from embforge.training.anchor import Anchor
from embforge.training.config import TrainConfig
from embforge.training.fisher import fisher_diagonal, probe_texts
from embforge.training.tasks import Task
from tests.training.test_averaging import (
    _assert_equal,
    _model,
    _run,
    _weights,
    cli_summary,
    crash_after_checkpoint_2,
)

WORDS = "backbone.embeddings.word_embeddings.weight"


def _texts(sts_csv) -> list[str]:
    data = read_table(sts_csv, columns="0=sentence1,1=sentence2,2=score")
    return probe_texts([Task("sts", data, get_loss("cosent"))], 2048, seed=42)


def _importance(texts: list[str]) -> dict[str, torch.Tensor]:
    model = _model()
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    return dict(zip(names, fisher_diagonal(model, texts, seed=42), strict=True))


def test_probe_texts_are_distinct_texts_of_every_text_column(sts_csv):
    data = read_table(sts_csv, columns="0=sentence1,1=sentence2,2=score")
    texts = _texts(sts_csv)
    assert (
        len(texts) == len(set(texts)) == len(set(data.columns["sentence1"]) | set(data.columns["sentence2"]))
    )
    few = probe_texts([Task("sts", data, get_loss("cosent"))], 3, seed=42)
    assert len(few) == 3 and set(few) <= set(texts)


def test_the_fisher_is_nonnegative_with_mean_one_and_zero_where_the_texts_never_reach(sts_csv):
    texts = _texts(sts_csv)
    importance = _importance(texts)
    flat = torch.cat([f.flatten() for f in importance.values()])
    assert float(flat.min()) >= 0 and float(flat.mean()) == pytest.approx(1.0, rel=1e-5)
    used = {i for ids in _model().tokenize_ids(texts) for i in ids}
    rows = importance[WORDS].sum(dim=1)
    unused = torch.tensor([i not in used for i in range(len(rows))])
    assert unused.any() and float(rows[unused].abs().max()) == 0.0  # a token no text holds carries nothing
    assert float(rows[~unused].min()) > 0
    assert float(importance["backbone.pooler.dense.weight"].abs().max()) == 0.0  # mean pooling never uses it


def test_the_fisher_is_the_mean_squared_score_of_sampled_neighbours(sts_csv):
    """One batch of 3 texts: the estimate equals the squared gradient of -log p(j|i) summed over the rows, with
    j drawn from the model's own softmax over the other two texts (the same draws, recomputed by hand)."""
    texts = _texts(sts_csv)[:3]
    model = _model().eval()
    weights = [p for _, p in model.named_parameters() if p.requires_grad]
    e = torch.nn.functional.normalize(model.embed_ids(model.tokenize_ids(texts)), dim=-1)
    logits = (e @ e.T / 0.05).masked_fill(torch.eye(3, dtype=torch.bool), float("-inf"))
    log_p = torch.log_softmax(logits, dim=-1)
    drawn = torch.multinomial(log_p.exp().detach(), 1, generator=torch.Generator().manual_seed(7)).squeeze(1)
    grads = torch.autograd.grad(-log_p.gather(1, drawn[:, None]).sum(), weights, allow_unused=True)
    squares = [torch.zeros_like(w) if g is None else g.square() for w, g in zip(weights, grads, strict=True)]
    mean = torch.cat([s.flatten() for s in squares]).mean()
    for got, want in zip(fisher_diagonal(_model(), texts, seed=7), squares, strict=True):
        torch.testing.assert_close(got, want / mean, rtol=1e-4, atol=1e-7)


def test_ewc_with_equal_importance_is_l2sp():
    layer = torch.nn.Linear(3, 2)
    start = {k: v.detach().clone() for k, v in layer.state_dict().items()}
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p))
    l2sp_layer, ewc_layer = (torch.nn.Linear(3, 2) for _ in range(2))
    for copy in (l2sp_layer, ewc_layer):
        copy.load_state_dict(start)
    l2sp, ewc = (
        Anchor(l2sp_layer, l2sp=300.0),
        Anchor(ewc_layer, ewc=300.0, importance=[torch.ones(2, 3), torch.ones(2)]),
    )
    for copy in (l2sp_layer, ewc_layer):
        copy.load_state_dict(layer.state_dict())
    l2sp.pull(1e-3)
    ewc.pull(1e-3)
    for a, b in zip(ewc_layer.parameters(), l2sp_layer.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_one_ewc_step_pulls_each_weight_back_at_its_own_capped_rate(tmp_path, sts_csv):
    plain, _ = _run(tmp_path / "plain1", sts_csv, max_steps=1)
    anchored, summary = _run(tmp_path / "ewc1", sts_csv, max_steps=1, ewc=2000.0)
    start, moved, importance = _weights(_model()), _weights(plain), _importance(_texts(sts_csv))
    assert summary["anchored"]["ewc"] == 2000.0
    rates = {k: (1e-3 * 2000.0 * f).clamp(max=1.0) for k, f in importance.items()}
    assert any(float(r.max()) == 1.0 for r in rates.values()) and any(
        float(r.max()) < 1 for r in rates.values()
    )
    expected = {k: moved[k] + rates[k] * (start[k] - moved[k]) if k in rates else moved[k] for k in moved}
    _assert_equal(_weights(anchored), expected, atol=1e-6)


def test_resume_recomputes_the_same_fisher(tmp_path, sts_csv):
    options = {"ewc": 500.0, "save_every": 2}
    full, _ = _run(tmp_path / "full", sts_csv, **options)
    crash_after_checkpoint_2(tmp_path / "crash", sts_csv, **options)
    resumed, _ = _run(tmp_path / "crash", sts_csv, resume=True, **options)
    _assert_equal(_weights(resumed), _weights(full), atol=1e-5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ewc": -1.0}, "ewc must be a finite number >= 0"),
        ({"ewc_texts": 2}, "ewc_texts must be an integer >= 3"),
    ],
)
def test_bad_ewc_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**options)


def test_the_cli_flag_reaches_the_config(tmp_path, tiny_model_dir, sts_csv):
    summary = cli_summary(tmp_path / "cli", tiny_model_dir, sts_csv, "--ewc", "700")
    assert summary["anchored"]["ewc"] == 700.0 and summary["anchored"]["l2sp"] == 0.0
