"""The cached micro-step (GradCache): a batch larger than memory allows, with the same loss and gradients.

The plain micro-step is three lines in :func:`embforge.training.loop.micro_step`::

    embeddings = model(task.inputs(rows), ...)          # one forward through the model's forward
    loss = task.loss_fn(embeddings, task.labels(rows))  # tensors in, scalar out
    backward(loss)

:func:`cached_step` computes the same thing in three passes (Gao et al., 2021, "Scaling Deep Contrastive Learning
Batch Size under Memory Limited Setup"):

1. embed the batch in mini-batches of ``mini_batch_size`` texts (or pairs) without a graph;
2. compute the loss on the whole batch from those embeddings and back-propagate it to them (and to the loss's own
   parameters), which gives each embedding's gradient;
3. embed each mini-batch again, with a graph, and back-propagate its cached embedding gradient into the model.

Peak activation memory is one mini-batch's; the price is a second forward. The two forwards must agree exactly,
dropout included: the padding-free path keys each text's dropout masks by the micro-step's seed and the text's
place in the whole batch (:mod:`embforge.modeling.dropout`), so both passes — and an uncached step — draw the
same masks. The padded path (non-BERT backbones) seeds torch's generator per length chunk, which makes the two
passes agree; there an uncached step equals the cached one when it is cut the same way.

Mini-batches are counted in texts (pairs for cross-encoders) in the batch's own order, like
sentence-transformers' ``mini_batch_size``: a budget a user can reason about. Inside a mini-batch, the
padding-free forward then groups texts by length anyway.

Under torchrun (:mod:`embforge.training.distributed`) the same function runs on every rank with wrapped
arguments: ``task`` is the rank's view of the batch, whose ``loss_fn`` all-gathers every rank's cached
embeddings in pass 2 (the loss of the global batch; the gradient kept is the local slice's), and ``model`` is
the rank's DDP forward, which runs pass 3 under ``no_sync`` except its last mini-batch, whose backward
all-reduces the gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:
    from embforge.protocols import TaskBatches


class Forward(Protocol):
    """The model as a micro-step calls it: inputs to outputs, one row per input (``places``: the inputs' places
    in the whole batch, which key their dropout masks)."""

    def __call__(
        self,
        inputs: Any,
        /,
        *,
        max_tokens: int | None,
        dropout_seed: int | None,
        places: Sequence[int] | None = None,
    ) -> Tensor: ...


def spans(n: int, size: int) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of at most ``size`` items covering ``0..n``."""
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def cached_step(
    model: Forward,
    task: TaskBatches,
    rows: Sequence[int],
    *,
    mini_batch_size: int,
    max_tokens: int | None,
    dropout_seed: int,
    backward: Callable[[Tensor], None],
) -> Tensor:
    """One micro-step of ``task`` on ``rows`` in cached mini-batches; returns the (detached) loss.

    Args:
        model: An Encoder or CrossEncoder (anything whose ``forward`` takes ``inputs``, ``max_tokens``,
            ``dropout_seed``, ``places``).
        task: A prepared task (:mod:`embforge.training.tasks`).
        rows: The batch's rows.
        mini_batch_size: Texts (or pairs) per forward pass.
        max_tokens: Padded tokens per attention block / length chunk (None: the model's defaults).
        dropout_seed: The micro-step's dropout seed (both passes use it).
        backward: What the plain step does with its loss (scaling for AMP and accumulation, then ``backward``).
    """
    inputs = task.inputs(rows)
    labels = task.labels(rows)
    parts = spans(len(inputs), mini_batch_size)

    def embed(start: int, end: int) -> Tensor:
        return model(
            inputs[start:end], max_tokens=max_tokens, dropout_seed=dropout_seed, places=range(start, end)
        )

    with torch.no_grad():
        cached = torch.cat([embed(start, end) for start, end in parts])
    cached.requires_grad_(True)
    loss = task.loss_fn(cached, labels)
    backward(loss)  # d loss / d embeddings (and the loss's own parameters)
    assert cached.grad is not None, "the loss does not depend on the embeddings"
    grads = cached.grad
    for start, end in parts:
        torch.autograd.backward(embed(start, end), grads[start:end])
    return loss.detach()
