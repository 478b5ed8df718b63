"""Data-parallel training under ``torchrun``: the process group, each rank's part of a batch, DDP's forward.

``torchrun --nproc-per-node N -m embforge train ...`` starts N processes; :func:`init_from_env` joins them
into a process group (gloo on CPU, NCCL for CUDA tensors). ``config.batch_size`` is the **global** batch:
every rank draws the same batch from the task plan (same seed, same epoch, same task), and
:meth:`DataParallel.shard` gives this rank its contiguous part of it.

With ``gather_negatives`` (the default) the loss is the global batch's loss, for every loss without special
cases. Rank ``r`` embeds a contiguous slice of the batch's texts (places ``lo..hi`` in the whole batch, so
its keyed dropout masks are those of the one-process step, :mod:`embforge.modeling.dropout`); the slices are
all-gathered in global order (:func:`gather_slices`, whose gradient flows to the local slice only); every
rank computes the same full loss over the global batch and back-propagates it. Rank ``r``'s parameter
gradient is then the gradient through its own slice, and the **sum** over ranks is the one-process gradient.
DDP averages, so the model's DDP wrapper gets a SUM communication hook (:func:`sum_hook`; scaling the loss by
the world size instead would also scale the loss modules' own parameters, whose gradient every rank already
has in full). In-batch negatives then span all ranks; CoSENT's all-pairs loss couples the whole global batch;
Matryoshka, hard-negative columns, symmetric InfoNCE, multi-task runs and the cached step
(:mod:`embforge.training.step`: gather in pass 2, keep the local slice of the gradient for pass 3) work
unchanged.

Without it each rank's loss covers its own rows only (in-batch negatives from ``batch_size / N`` rows, CoSENT
pairs within a rank) and DDP averages the ranks' gradients: not the one-process training.

DDP synchronises on the backward of a forward run outside ``no_sync()``; :class:`RankForward` runs every
forward of a micro-step under ``no_sync()`` except, on the accumulation's last micro-step, the one that covers
the end of this rank's slice (the plain step's only forward, the cached step's last mini-batch), so gradients
are all-reduced once per optimiser step, overlapped with that backward.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from embforge.parallel import (  # noqa: F401 (the process group, re-exported for the loop and its tests)
    all_gather_objects,
    barrier,
    init_from_env,
    is_main,
    launched,
    rank,
    rank_device,
    spans_for,
    teardown,
    world_size,
)

if TYPE_CHECKING:
    from embforge.protocols import TaskBatches


# ------------------------------------------------------------------------------------------------ rank rows
def rank_rows(rows: Sequence[int], *, rank: int, world: int) -> tuple[int, ...]:
    """This rank's contiguous part of a global batch's ``rows`` (what it reads, tokenises and embeds when each
    rank computes the loss of its own rows): over an epoch the ranks' rows are disjoint and cover every row.

    >>> rank_rows((7, 3, 9), rank=1, world=2)
    (9,)
    """
    start, end = spans_for(len(rows), world)[rank]
    return tuple(rows[start:end])


# --------------------------------------------------------------------------------------------------- gather
class _GatherSlices(torch.autograd.Function):
    """All-gather every rank's slice into the global tensor; the backward keeps the local slice's gradient."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, spans: list[tuple[int, int]], me: int) -> Tensor:
        start, end = spans[me]
        ctx.local_rows, ctx.span = len(local), (start, end)
        width = max(1, *(e - s for s, e in spans))  # all_gather needs equal sizes: pad to the widest slice
        padded = local.new_zeros((width, *local.shape[1:]))
        padded[: end - start] = local[: end - start]
        parts = [torch.empty_like(padded) for _ in spans]
        dist.all_gather(parts, padded)
        return torch.cat([part[: e - s] for part, (s, e) in zip(parts, spans)])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        # every rank computed the same loss, so its gradient w.r.t. the global tensor is already complete here
        start, end = ctx.span
        local = grad.new_zeros((ctx.local_rows, *grad.shape[1:]))  # a placeholder row gets a zero gradient
        local[: end - start] = grad[start:end]
        return local, None, None


def gather_slices(local: Tensor, spans: Sequence[tuple[int, int]]) -> Tensor:
    """The global tensor from each rank's rows ``spans[rank]`` (``local`` holds one placeholder row when the
    rank's slice is empty); differentiable, the gradient goes to this rank's slice only."""
    return _GatherSlices.apply(local, list(spans), rank())


def sum_hook(state, bucket):  # noqa: ANN001, ANN201 (DDP checks the annotation: a string one would fail)
    """DDP communication hook: all-reduce gradients as a SUM (DDP's default divides by the world size)."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    assert work is not None
    return work.get_future().then(lambda fut: fut.value()[0])


# ------------------------------------------------------------------------------------------- a rank's batch
class GatheredBatch:
    """One rank's view of a prepared task's batch (:mod:`embforge.training.tasks`) with a global loss.

    ``inputs(rows)`` is this rank's contiguous slice of the batch's inputs (one placeholder input when the
    batch has fewer inputs than ranks); ``loss_fn`` gathers every rank's outputs into the batch order and
    computes the task's loss over the whole batch. ``labels`` are the whole batch's.
    """

    def __init__(self, task: TaskBatches, rows: Sequence[int], *, me: int, world: int) -> None:
        self.task = task
        self.all_inputs = task.inputs(rows)
        self.spans = spans_for(len(self.all_inputs), world)
        self.start, self.end = self.spans[me]

    def inputs(self, rows: Sequence[int]) -> Sequence[object]:
        if self.end == self.start:
            return self.all_inputs[:1]
        return self.all_inputs[self.start : self.end]

    def labels(self, rows: Sequence[int]) -> Tensor | None:
        return self.task.labels(rows)

    def loss_fn(self, outputs: Tensor, labels: Tensor | None) -> Tensor:
        return self.task.loss_fn(gather_slices(outputs, self.spans), labels)


class _Silenced:
    """A placeholder batch (a rank without rows): its loss counts zero, so DDP's all-reduce still meets it."""

    def __init__(self, task: TaskBatches) -> None:
        self.task = task

    def inputs(self, rows: Sequence[int]) -> Sequence[object]:
        return self.task.inputs(rows)

    def labels(self, rows: Sequence[int]) -> Tensor | None:
        return self.task.labels(rows)

    def loss_fn(self, outputs: Tensor, labels: Tensor | None) -> Tensor:
        return self.task.loss_fn(outputs, labels) * 0.0


class RankForward:
    """The model as a micro-step calls it (``net(ids, max_tokens=, dropout_seed=, places=)``), through DDP.

    Places are shifted by ``first`` (this rank's first place in the whole batch). Forwards without a graph go
    to the bare model; forwards with one go through DDP, under ``no_sync()`` unless ``sync`` is set and the
    forward covers the end of this rank's ``size`` inputs — the last forward of the micro-step, whose backward
    then all-reduces the gradients accumulated since the last synchronisation.
    """

    def __init__(self, parallel: DataParallel, *, first: int, size: int, sync: bool) -> None:
        self.parallel, self.first, self.size, self.sync = parallel, first, size, sync

    def __call__(
        self,
        ids: Sequence[object],
        *,
        max_tokens: int | None,
        dropout_seed: int | None,
        places: Sequence[int] | None = None,
    ) -> Tensor:
        local = list(range(len(ids)) if places is None else places)
        where = [self.first + p for p in local]
        if not torch.is_grad_enabled():
            return self.parallel.module(ids, max_tokens=max_tokens, dropout_seed=dropout_seed, places=where)
        last = self.sync and bool(local) and local[-1] + 1 == self.size
        with nullcontext() if last else self.parallel.ddp.no_sync():
            return self.parallel.ddp(ids, max_tokens=max_tokens, dropout_seed=dropout_seed, places=where)


class DataParallel:
    """A model trained data-parallel across the process group's ranks (see the module docstring).

    Args:
        model: The Encoder / CrossEncoder (already on this rank's device).
        gather: Compute the global batch's loss on every rank (gradients SUM-reduced); otherwise each rank's
            loss over its own rows (gradients averaged).
    """

    def __init__(self, model: nn.Module, *, gather: bool) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.module = model
        self.gather = gather
        self.rank, self.world = rank(), world_size()
        # device_ids=None: DDP would otherwise walk the (nested list) token ids to move tensors; parameters
        # that a forward does not use (a BERT pooler) are found and left out of the reduction
        # buffers (BERT's position ids) never change: no broadcast before each forward
        quiet = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        buffers: dict[str, Any] = {"forward_sync_buffers": False} if quiet else {"broadcast_buffers": False}
        self.ddp = DistributedDataParallel(model, device_ids=None, find_unused_parameters=True, **buffers)
        if gather:
            self.ddp.register_comm_hook(None, sum_hook)
        self._weight = 1.0

    def shard(
        self, task: TaskBatches, rows: tuple[int, ...], *, sync: bool
    ) -> tuple[RankForward, Any, tuple[int, ...]]:  # the loop's prepared task, or this rank's view of it
        """``(net, task, rows)`` for this rank's part of a batch (``sync``: the accumulation's last micro-step)."""
        if self.gather:
            gathered = GatheredBatch(task, rows, me=self.rank, world=self.world)
            self._weight = 1.0
            size = len(gathered.inputs(rows))
            return RankForward(self, first=gathered.start, size=size, sync=sync), gathered, rows
        own = rank_rows(rows, rank=self.rank, world=self.world)
        local = own or rows[:1]
        self._weight = 1.0 if own else 0.0
        view: TaskBatches = task if own else _Silenced(task)
        size = len(task.inputs(local))
        return RankForward(self, first=0, size=size, sync=sync), view, local

    def mean(self, loss: Tensor) -> Tensor:
        """The micro-step's loss averaged over the ranks that had rows: one value on every rank (for the log,
        the finiteness check and the loss-share task weights, which must agree across ranks)."""
        both = torch.tensor([float(loss.detach()) * self._weight, self._weight], dtype=torch.float64)
        dist.all_reduce(both)
        return loss.detach().new_tensor(float(both[0] / both[1].clamp(min=1.0)))

    def reduce_loss_gradients(self, losses: nn.Module) -> None:
        """Average the loss modules' own gradients (they are not in DDP) when each rank had its own loss; with
        the gathered global loss every rank already holds the full gradient."""
        if self.gather:
            return
        for param in losses.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad)
                param.grad /= self.world
