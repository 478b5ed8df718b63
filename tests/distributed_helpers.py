"""Run a function in N processes joined into a gloo process group on loopback (what torchrun would set up)."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _entry(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ.update(torchrun_env(rank, world, port))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(1)  # N processes share the machine's cores
    from embforge.training.distributed import init_from_env, teardown

    init_from_env(timeout_s=300)
    try:
        fn(*args)
    finally:
        teardown()


def spawn(fn: Callable[..., Any], *args: Any, world: int = 2) -> None:
    """``fn(*args)`` in ``world`` fresh processes (spawned: no fork of this process's threads)."""
    import torch.multiprocessing as mp

    mp.start_processes(_entry, args=(world, free_port(), fn, args), nprocs=world, start_method="spawn")


# ---------------------------------------------------------------------------------------------- training runs
class Stop(Exception):
    """Raised from ``on_step`` to interrupt a run (as a kill would, after its last checkpoint)."""


def run_training(spec: dict[str, Any], output: str) -> None:
    """Train ``spec["model"]`` on ``spec["tasks"]`` ([(name, file, loss, options)]) with ``spec["config"]``.

    With ``spec["stop_after"]`` the run is interrupted after that step and then resumed to the end.
    """
    from embforge.data.tables import read_table
    from embforge.encoder import Encoder
    from embforge.losses import get_loss
    from embforge.training.config import TrainConfig
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    def once(resume: bool, stop_after: int | None) -> None:
        model = Encoder.load(spec["model"])
        tasks = [
            Task(name, read_table(path), get_loss(loss, **options))
            for name, path, loss, options in spec["tasks"]
        ]
        config = TrainConfig(output=output, quiet=True, resume=resume, **spec["config"])

        def on_step(step: int) -> None:
            if stop_after is not None and step == stop_after:
                raise Stop(step)

        with contextlib.suppress(Stop):
            train(model, tasks, config, on_step=on_step)

    stop_after = spec.get("stop_after")
    once(False, stop_after)
    if stop_after is not None:
        once(True, None)


def run_trainings(specs: list[dict[str, Any]], root: str) -> None:
    """Every spec in turn, into ``root/<spec name>`` (one process group for all: the start-up is the slow part)."""
    for spec in specs:
        run_training(spec, os.path.join(root, spec["name"]))


def gather_check() -> None:
    """Each rank's slice of a 2-row tensor, gathered: the global tensor; the gradient: the local slice's."""
    import torch

    from embforge.training.distributed import gather_slices, rank, spans_for, world_size

    full = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    weights = torch.tensor([[10.0, 20.0], [30.0, 40.0]])
    spans = spans_for(len(full), world_size())
    start, end = spans[rank()]
    local = (full[start:end] if end > start else torch.full((1, 2), 99.0)).clone().requires_grad_(True)
    out = gather_slices(local, spans)
    (out * weights).sum().backward()
    assert torch.equal(out, full), out
    assert local.grad is not None
    expected = weights[start:end] if end > start else torch.zeros(1, 2)
    assert torch.equal(local.grad, expected), (rank(), local.grad)
