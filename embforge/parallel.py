"""The process group under ``torchrun``: joining it, this process's rank, waiting for the others, splitting work.

Not a training idea: the training loop (:mod:`embforge.training.distributed`), sharded encoding
(:mod:`embforge.retrieval.sharded`) and the CLI verbs that write outputs on rank 0 all use it. Without
``torchrun`` (or with one process) every function is the one-process answer: world size 1, rank 0, no waiting.
"""

from __future__ import annotations

import atexit
import os
from datetime import timedelta
from typing import TypeVar, cast

import torch
import torch.distributed as dist

T = TypeVar("T")


def launched() -> bool:
    """Whether this process was started by ``torchrun`` with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def init_from_env(*, timeout_s: float | None = None) -> int:
    """Join the ``torchrun`` process group once (idempotent); returns the world size (1 when not launched).

    The backend is gloo, plus NCCL for CUDA tensors when CUDA is available (``cpu:gloo,cuda:nccl``); on
    CUDA each process uses GPU ``LOCAL_RANK``. ``timeout_s`` (default ``EMBFORGE_DIST_TIMEOUT`` or 2 hours)
    bounds how long ranks wait for each other, e.g. while rank 0 evaluates.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    if not launched():
        return 1
    if timeout_s is None:
        timeout_s = float(os.environ.get("EMBFORGE_DIST_TIMEOUT", 7200))
    backend = "gloo"
    if torch.cuda.is_available():
        if _local_rank() < torch.cuda.device_count():  # else: CPU processes (--device cpu) on a GPU machine
            torch.cuda.set_device(_local_rank())
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    atexit.register(teardown)
    return dist.get_world_size()


def teardown() -> None:
    """Leave the process group (if this process is in one)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    """Rank 0 (or no process group): the process that writes metrics, checkpoints and models."""
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (nothing to wait for without a process group)."""
    if world_size() > 1:
        dist.barrier()


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def rank_device(device: torch.device) -> torch.device:
    """Under torchrun, ``cuda`` (no index) becomes this process's GPU, ``cuda:LOCAL_RANK``."""
    if world_size() > 1 and device.type == "cuda" and device.index is None:
        if _local_rank() >= torch.cuda.device_count():
            raise ValueError(
                f"torchrun started process {_local_rank()} of this node, which has {torch.cuda.device_count()} "
                "GPU(s): use --nproc-per-node <GPUs per node> (one process per GPU), or --device cpu"
            )
        return torch.device("cuda", _local_rank())
    return device


def spans_for(n: int, world: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` slices of ``n`` items for ``world`` ranks (the first ``n % world`` get one
    more).

    >>> spans_for(5, 2)
    [(0, 3), (3, 5)]
    """
    base, extra = divmod(n, world)
    spans, start = [], 0
    for r in range(world):
        end = start + base + (r < extra)
        spans.append((start, end))
        start = end
    return spans


def all_gather_objects(value: T) -> list[T]:
    """Every rank's ``value`` (picklable), in rank order."""
    if world_size() == 1:
        return [value]
    values: list[T | None] = [None] * world_size()
    dist.all_gather_object(values, value)
    return cast("list[T]", values)  # every slot filled by all_gather_object
