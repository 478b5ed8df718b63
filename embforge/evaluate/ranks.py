"""Evaluation across the ranks of a ``torchrun`` process group: each rank encodes a share, all get rank 0's metrics.

Every evaluator is ``model -> dict[str, float]``, and nearly all of its time is the model encoding texts. Under
``torchrun`` with more than one process, :func:`across_ranks` (a decorator on each ``evaluate_*`` function) hands
the evaluator a :class:`~embforge.retrieval.sharded.ShardedEncoder` instead of the model: each ``encode`` the
evaluator makes is split over the ranks (each rank runs a contiguous range of the one-process batch plan) and
all-gathered, bit for bit the one-process vectors. Every rank then computes the metrics from those same vectors,
and rank 0's are broadcast, so every rank returns one answer — the one-process figures, exactly (the test runs two
gloo processes). The split lives here and in the sharded encoder only: no evaluator has a branch for it.

The evaluator becomes a collective: under a process group **every rank must call it** (the trainer evaluates on
every rank, rank 0 alone logs and saves). A model that is not a single-vector batch encoder (a cross-encoder's pair
scores, a multi-vector or sparse model, a Matryoshka view) runs whole on every rank; the metrics are still rank
0's. Without ``torchrun`` (or with one process) the evaluator runs unchanged.

Example:
    ``torchrun --nproc-per-node 2 -m embforge eval sts --model all-MiniLM-L6-v2 --data stsb-test`` prints the
    figures one process prints.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar, cast

from embforge.kinds import is_single_vector
from embforge.modeling.encoding import BatchEncoding
from embforge.parallel import all_gather_objects, init_from_env, is_main
from embforge.retrieval.sharded import ShardedEncoder

if TYPE_CHECKING:
    from embforge.protocols import BatchEmbedder

P = ParamSpec("P")
M = TypeVar("M")
Metrics = dict[str, float]


def shares_encoding(model: object) -> bool:
    """Whether ``model``'s ``encode`` can be split over ranks (:class:`ShardedEncoder`): a single-vector batch
    encoder (PyTorch, ONNX or static), or one already sharded."""
    return isinstance(model, ShardedEncoder) or (isinstance(model, BatchEncoding) and is_single_vector(model))


def evaluate_across_ranks(evaluate: Callable[[M], Metrics], model: M) -> Metrics:
    """``evaluate(model)`` with the encoding split over the process group's ranks and rank 0's metrics returned
    on every rank (see the module docstring); ``evaluate(model)`` itself without a process group."""
    if init_from_env() == 1:
        return evaluate(model)
    shared: object = model
    if isinstance(model, BatchEncoding) and shares_encoding(model):
        shared = ShardedEncoder(cast("BatchEmbedder", model))  # a single-vector BatchEncoding is one
    metrics = evaluate(
        cast("M", shared)
    )  # the sharded encoder stands in for the model: same encode, same rows
    return cast("Metrics", all_gather_objects(metrics if is_main() else None)[0])  # rank 0 sent its metrics


def across_ranks(evaluate: Callable[Concatenate[M, P], Metrics]) -> Callable[Concatenate[M, P], Metrics]:
    """Decorate an evaluator ``(model, *args, **options) -> metrics`` so that under ``torchrun`` its encoding is
    split over the ranks and every rank returns rank 0's metrics (:func:`evaluate_across_ranks`)."""

    @functools.wraps(evaluate)
    def run(model: M, /, *args: P.args, **options: P.kwargs) -> Metrics:
        return evaluate_across_ranks(lambda m: evaluate(m, *args, **options), model)

    return run
