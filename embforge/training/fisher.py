"""How much each weight of the starting model matters to what it already does: the diagonal of its Fisher
information, which the EWC anchor (:mod:`embforge.training.anchor`, ``TrainConfig.ewc``) weighs its pull by.

What the starting model "does" is taken as the task an embedding model is pre-trained on: among a batch of texts,
which one is a text's neighbour. For the texts :math:`x_1..x_B` of a batch, the model's neighbour distribution is

.. math:: p_\\theta(j \\mid i) = \\operatorname{softmax}_{j \\ne i}\\big(\\cos(e_i, e_j) / \\tau\\big)

and its Fisher information per weight is :math:`F_k = \\mathbb{E}_i\\,\\mathbb{E}_{j \\sim p_\\theta(\\cdot\\mid i)}
(\\partial_{\\theta_k} \\log p_\\theta(j \\mid i))^2` — the curvature of :math:`\\mathrm{KL}(p_{\\theta_0} \\Vert
p_\\theta)` at the start, i.e. how fast moving :math:`\\theta_k` changes which texts the model finds alike (the
quadratic form of "learning without forgetting" on these texts). The neighbours :math:`j` are *sampled* from the
model's own distribution (the true Fisher, not the empirical one of given labels): each row's score then has
mean zero and rows are drawn independently, so the square of one batch's summed gradient is an unbiased estimate
of the sum of the rows' squares — one backward pass per batch, not one per row (Kirkpatrick et al., 2017,
"Overcoming catastrophic forgetting in neural networks", estimate it per example).

The texts are a seeded sample of the run's own tasks (every text column): the kind of text the run trains on is
where its drift is measured. The model runs without dropout (the starting model's function), with gradients.
The result is divided by its mean over every weight, so ``ewc`` reads on the scale of ``l2sp``: a weight of mean
importance is pulled back as L2-SP at ``l2sp = ewc`` pulls every weight.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.nn import functional

if TYPE_CHECKING:
    from embforge.protocols import TrainableEmbedder
    from embforge.training.tasks import Task

FISHER_TEMPERATURE = 0.05  # tau of the neighbour distribution (all-MiniLM-L6-v2 was trained at scale 20)
FISHER_BATCH = 32  # texts whose neighbours are drawn among each other (one forward and backward each)


def probe_texts(tasks: Sequence[Task], count: int, seed: int) -> list[str]:
    """Up to ``count`` distinct texts from the tasks' text columns: an equal, seeded share of each task's rows
    (a streamed task of unknown length gives its first rows)."""
    rng = random.Random(seed)
    share = max(1, -(-count // max(1, len(tasks))))
    texts: dict[str, None] = {}
    for task in tasks:
        data = task.data
        size = data.num_rows
        columns = (
            data.rows(0, share) if size is None else data.take(rng.sample(range(size), min(share, size)))
        )
        for name in data.text_columns:
            texts.update(dict.fromkeys(t for t in columns[name] if isinstance(t, str) and t.strip()))
    pool = list(texts)
    rng.shuffle(pool)
    return pool[:count]


def fisher_diagonal(
    model: TrainableEmbedder, texts: Sequence[str], *, seed: int, batch_size: int = FISHER_BATCH
) -> list[Tensor]:
    """The diagonal Fisher information of ``model``'s in-batch neighbour distribution over ``texts`` (see the
    module docstring), one tensor per trainable parameter in ``named_parameters`` order, divided by its mean."""
    if len(texts) < 3:
        raise ValueError(
            f"ewc needs at least 3 texts to estimate the Fisher information, the tasks gave {len(texts)}"
        )
    weights = [p for _, p in model.named_parameters() if p.requires_grad]
    totals = [torch.zeros_like(w, dtype=torch.float32) for w in weights]
    generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()  # the starting model's function: no dropout
    try:
        for start in range(0, len(texts), batch_size):
            batch = list(texts[start : start + batch_size])
            if len(batch) < 3:  # a last batch of 1-2 texts has no neighbour to draw among
                break
            loss = _sampled_neighbour_loss(model, batch, generator)
            grads = torch.autograd.grad(loss, weights, allow_unused=True)
            for total, grad in zip(totals, grads, strict=True):
                if grad is not None:
                    total.add_(grad.float().square())
    finally:
        model.train(was_training)
    mean = sum(float(t.sum()) for t in totals) / sum(t.numel() for t in totals)
    if not mean > 0:
        raise ValueError("the Fisher information is zero on every weight: the texts do not move the model")
    return [t.div_(mean) for t in totals]


def _sampled_neighbour_loss(model: TrainableEmbedder, texts: list[str], generator: torch.Generator) -> Tensor:
    """:math:`-\\sum_i \\log p_\\theta(j_i \\mid i)` with each :math:`j_i` drawn from :math:`p_\\theta(\\cdot \\mid i)`."""
    embeddings = functional.normalize(model.embed_ids(model.tokenize_ids(texts)).float(), dim=-1)
    logits = embeddings @ embeddings.T / FISHER_TEMPERATURE
    logits = logits.masked_fill(torch.eye(len(texts), dtype=torch.bool, device=logits.device), float("-inf"))
    log_p = torch.log_softmax(logits, dim=-1)
    with torch.no_grad():
        drawn = torch.multinomial(log_p.exp().cpu(), 1, generator=generator).squeeze(1).to(log_p.device)
    return -log_p.gather(1, drawn[:, None]).sum()
