"""Run a function in N processes joined into a gloo process group on loopback (what torchrun would set up)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from tests.conftest import free_port


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


def load_model(spec: dict[str, Any]) -> tuple[Any, Any]:
    """The spec's model and the function that makes its losses by name (a cross-encoder when ``spec["cross"]``)."""
    if spec.get("cross"):
        from embforge.cross_encoder import CrossEncoder
        from embforge.losses.cross import get_cross_loss

        return CrossEncoder.load(spec["model"]), get_cross_loss
    from embforge.encoder import Encoder
    from embforge.losses import get_loss

    return Encoder.load(spec["model"]), get_loss


def run_training(spec: dict[str, Any], output: str) -> None:
    """Train ``spec["model"]`` on ``spec["tasks"]`` ([(name, file, loss, options)]) with ``spec["config"]``.

    With ``spec["stop_after"]`` the run is interrupted after that step and then resumed to the end.
    """
    from embforge.data.tables import read_table
    from embforge.training.config import TrainConfig
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    def once(resume: bool, stop_after: int | None) -> None:
        model, make = load_model(spec)
        tasks = [
            Task(name, read_table(path), make(loss, **options)) for name, path, loss, options in spec["tasks"]
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


def step_gradients(spec: dict[str, Any], output: str) -> None:
    """One micro-step on the first ``spec["rows"]`` rows of ``spec["tasks"][0]``, plain then cached
    (:func:`save_step_gradients` with mini-batches of 20)."""
    from embforge.data.tables import read_table
    from embforge.training.tasks import Task, prepare

    model, make = load_model(spec)
    name, path, loss, options = spec["tasks"][0]
    task = prepare(Task(name, read_table(path), make(loss, **options)), model)
    save_step_gradients(model, task, tuple(range(spec["rows"])), output, mini_batch_size=20)


def save_step_gradients(
    model: Any, task: Any, rows: tuple[int, ...], output: str, *, mini_batch_size: int
) -> None:
    """One micro-step of ``task`` on ``rows``, plain then cached, the way the trainer runs it (under torchrun:
    :meth:`DataParallel.shard`); the model's gradients go to ``output/<plain|cached>.pt`` (rank 0's: after DDP's
    all-reduce every rank holds the same)."""
    import torch

    from embforge.training.distributed import DataParallel, is_main, world_size
    from embforge.training.step import cached_step

    parallel = DataParallel(model, gather=True) if world_size() > 1 else None
    model.train()
    os.makedirs(output, exist_ok=True)
    for mode in ("plain", "cached"):
        model.zero_grad(set_to_none=True)
        net, view, local = parallel.shard(task, rows, sync=True) if parallel else (model, task, rows)
        if mode == "plain":
            view.loss_fn(
                net(view.inputs(local), max_tokens=512, dropout_seed=7), view.labels(local)
            ).backward()
        else:
            cached_step(
                net,
                view,
                local,
                mini_batch_size=mini_batch_size,
                max_tokens=512,
                dropout_seed=7,
                backward=lambda x: x.backward(),
            )
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        if is_main():
            torch.save(grads, os.path.join(output, f"{mode}.pt"))


def run_trainings(specs: list[dict[str, Any]], root: str) -> None:
    """Every spec in turn, into ``root/<spec name>`` (one process group for all: the start-up is the slow part)."""
    for spec in specs:
        run = step_gradients if "rows" in spec else run_training
        run(spec, os.path.join(root, spec["name"]))


def gather_check(rows: int) -> None:
    """Each rank's slice of a ``rows``-row tensor, gathered: the global tensor; the gradient: the local slice's.
    A rank without rows holds a placeholder row: no place in the result, a zero gradient."""
    import torch

    from embforge.training.distributed import gather_slices, rank, spans_for, world_size

    full = torch.arange(2.0 * rows).view(rows, 2)
    weights = 10 * torch.arange(2.0 * rows).view(rows, 2) + 1
    spans = spans_for(len(full), world_size())
    start, end = spans[rank()]
    local = (full[start:end] if end > start else torch.full((1, 2), 99.0)).clone().requires_grad_(True)
    out = gather_slices(local, spans)
    (out * weights).sum().backward()
    assert torch.equal(out, full), out
    assert local.grad is not None
    expected = weights[start:end] if end > start else torch.zeros(1, 2)
    assert torch.equal(local.grad, expected), (rank(), local.grad)


# ---------------------------------------------------------------------------------------------- sharded encoding
class StopEncoding(Exception):
    """Raised from ``on_block`` to interrupt a corpus encoding."""


def encode_everything(model_dir: str, texts: list[str], out: str) -> dict[str, Any]:
    """What the sharded-encoding test compares: ``encode``, a corpus encoding (fresh, and interrupted after its
    first block then resumed) and mined negatives; run with a plain model in one process, or sharded in many."""
    import numpy as np

    from embforge.data.tables import Dataset
    from embforge.encoder import Encoder
    from embforge.retrieval.corpus_cache import encode_corpus
    from embforge.retrieval.mining import MiningConfig, mine
    from embforge.retrieval.sharded import sharded

    model = sharded(Encoder.load(model_dir))
    ids = [f"d{i}" for i in range(len(texts))]
    result: dict[str, Any] = {"encode": model.encode(texts, batch_size=8, show_progress=False)}
    result["corpus"] = np.array(
        encode_corpus(model, texts, ids, os.path.join(out, "corpus"), batch_size=8, block_size=40)
    )

    def stop(block: int) -> None:
        raise StopEncoding(block)

    with contextlib.suppress(StopEncoding):
        encode_corpus(
            model, texts, ids, os.path.join(out, "resumed"), batch_size=8, block_size=40, on_block=stop
        )
    result["resumed"] = np.array(
        encode_corpus(model, texts, ids, os.path.join(out, "resumed"), batch_size=8, block_size=40)
    )
    half = len(texts) // 2
    pairs = Dataset("pairs", {"anchor": texts[:half], "positive": texts[half : 2 * half]}, list(range(half)))
    mined = mine(model, pairs, MiningConfig(num_negatives=2, batch_size=8))
    result["mined"] = {name: list(column) for name, column in mined.columns.items()}
    return result


def sharded_encoding_worker(model_dir: str, texts: list[str], out: str) -> None:
    """:func:`encode_everything` under a process group; each rank pickles what it got to ``out/rank-<r>.pkl``."""
    import pickle

    from embforge.training.distributed import rank

    result = encode_everything(model_dir, texts, os.path.join(out, "work"))
    with open(os.path.join(out, f"rank-{rank()}.pkl"), "wb") as handle:
        pickle.dump(result, handle)


def torchrun_command(*args: str, nproc: int = 2) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of ``torchrun --nproc-per-node 2 -m embforge ARGS`` on loopback."""
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    command += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "embforge", *args]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": root}
    return command, env


def torchrun(*args: str, cwd: Any, nproc: int = 2) -> Any:
    """Run :func:`torchrun_command` to the end; the completed process (stdout, stderr)."""
    import subprocess

    command, env = torchrun_command(*args, nproc=nproc)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


# ---------------------------------------------------------------------------------------------- resume decision
def resume_decision(folder: str, out: str) -> None:
    """Rank 1 asks which checkpoint to resume from while rank 0 is still writing a newer one (what happens when
    a run stops and both processes resume at once: rank 0 saves the last checkpoint, rank 1 does not wait for it).
    Every rank must resume from the same checkpoint; each writes its answer to ``out/rank-<r>.txt``."""
    import time
    from pathlib import Path

    from embforge.training.checkpoints import LATEST, start_run
    from embforge.training.distributed import rank

    checkpoints, asking = Path(folder), Path(out, "rank-1-asking")
    if rank() == 1:
        asking.touch()
        found = start_run(checkpoints, resume=True)
    else:
        deadline = time.monotonic() + 120
        while not asking.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        deadline = time.monotonic() + 3  # rank 1 answers in this time unless it waits for rank 0
        while not Path(out, "rank-1.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        (checkpoints / "checkpoint-3").mkdir()  # rank 0's save of the newest checkpoint ends
        (checkpoints / LATEST).write_text("checkpoint-3\n")
        found = start_run(checkpoints, resume=True)
    Path(out, f"rank-{rank()}.txt").write_text(found.name if found is not None else "none")


def streamed_rows(path: str, model_dir: str, out: str, gather: bool) -> None:
    """Train one epoch on a streamed JSONL file (64-row windows) and write the stream lines this rank fetched (the
    rows it tokenised) to ``out/rank-<r>.json``, one list per fetch."""
    import json

    from embforge.data.sources import LINE, SourceOptions, StreamSource, open_source
    from embforge.encoder import Encoder
    from embforge.losses import get_loss
    from embforge.training.config import TrainConfig
    from embforge.training.distributed import rank
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    class RecordingStream(StreamSource):
        """The stream itself; ``take`` (the trainer's fetch of a batch's rows) also notes the rows' lines."""

        fetched: list[list[int]]

        def take(self, positions: Any) -> dict[str, list]:
            rows = super().take(positions)
            self.fetched.append(list(rows[LINE]))
            return rows

    source = open_source(path, SourceOptions(mode="stream", window=64))
    source.__class__ = RecordingStream
    source.fetched = []
    config = TrainConfig(
        output=os.path.join(out, "model"), max_steps=19, batch_size=16, shuffle_window=64, save_every=0,
        quiet=True, gather_negatives=gather,
    )  # fmt: skip
    train(Encoder.load(model_dir), [Task("pairs", source, get_loss("infonce"))], config)
    with open(os.path.join(out, f"rank-{rank()}.json"), "w") as handle:
        json.dump(source.fetched, handle)
