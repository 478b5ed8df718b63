"""Training steps of both libraries, measured the same way: InfoNCE (MNRL) on (query, abstract) pairs, AdamW,
clipping at 1.0, autocast in the run's dtype, tokenised per step, one warm-up step, then timed steps.

embforge's step is its loop's: :func:`embforge.training.loop.micro_step` (embed -> loss -> backward, cached in
``mini_batch_size`` texts when set) and the optimiser lines of ``train()``, on a ``Trainer`` from ``set_up``.
sentence-transformers' is ``MultipleNegativesRankingLoss`` (``CachedMultipleNegativesRankingLoss`` with the same
``mini_batch_size`` when cached: it embeds each column in mini-batches of that many texts) on its own model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from gpu_common import Run, matmul_peak, measure, pair_rows, quiet, step_flops
from torch import nn

PEER = "sentence-transformers"
LR = 2e-5


def adamw(params: Any, run: Run) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR, fused=run.cuda)


def embforge_encoder(run: Run, folder: Path) -> Any:
    from embforge.encoder import Encoder

    return Encoder.load(folder, max_seq_length=run.knobs.max_seq).float()  # the bundle's weights are fp16


def embforge_stepper(run: Run, model: Any, batch: int, mini: int, steps: int) -> tuple[Callable, Callable]:
    """``(step(i), lengths(i))``: one optimiser step of embforge's loop on rows ``[i·batch, (i+1)·batch)``."""
    from embforge.data.tables import Dataset
    from embforge.losses import get_loss
    from embforge.training.config import TrainConfig
    from embforge.training.loop import micro_step
    from embforge.training.tasks import Task, prepare
    from embforge.training.trainer import set_up

    anchors, positives = pair_rows(run, batch * (steps + 1))
    data = Dataset("pairs", {"anchor": anchors, "positive": positives}, list(range(1, len(anchors) + 1)))
    task = Task("pairs", data, get_loss("infonce"))
    config = TrainConfig(
        output=str(run.tmp / "train"),
        max_steps=steps + 1,
        batch_size=batch,
        mini_batch_size=mini,
        amp="bf16" if run.dtype == torch.bfloat16 else "no",
        device=str(run.device),
        lr=LR,
        warmup_ratio=0.0,
        save_every=0,
        quiet=True,
    )
    with quiet():
        trainer, _ = set_up(model, [Task("pairs", data.subset(range(2)), task.loss)], config)
    prepared = prepare(task, model)
    model.train()

    def rows(i: int) -> range:
        return range(i * batch, (i + 1) * batch)

    def step(i: int) -> None:  # the body of embforge.training.loop.train, one micro-step per optimiser step
        trainer.optimizer.zero_grad(set_to_none=True)
        micro_step(trainer, prepared, rows(i), sync=True)
        trainer.scaler.unscale_(trainer.optimizer)
        torch.nn.utils.clip_grad_norm_(list(trainer.parameters()), config.optim.max_grad_norm)
        trainer.scaler.step(trainer.optimizer)
        trainer.scaler.update()
        trainer.scheduler.step()

    return step, lambda i: [len(ids) for ids in prepared.inputs(rows(i))]


def peer_stepper(
    run: Run, folder: Path, batch: int, mini: int, steps: int
) -> tuple[Callable, Callable, nn.Module]:
    """``(step(i), lengths(i), backbone)``: one sentence-transformers step on the rows :func:`embforge_stepper`
    takes."""
    from sentence_transformers import SentenceTransformer, losses

    with quiet():
        model = SentenceTransformer(str(folder), device=str(run.device)).float()
    model.max_seq_length = run.knobs.max_seq
    if mini:
        loss: nn.Module = losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=mini)
    else:
        loss = losses.MultipleNegativesRankingLoss(model)
    optimizer = adamw(model.parameters(), run)
    anchors, positives = pair_rows(run, batch * (steps + 1))
    labels = torch.zeros(batch, device=run.device)
    model.train()

    tokenize = getattr(model, "preprocess", None) or model.tokenize  # sentence-transformers 6: preprocess

    def features(texts: list[str]) -> dict[str, Any]:
        return {k: v.to(run.device) if torch.is_tensor(v) else v for k, v in tokenize(texts).items()}

    def step(i: int) -> None:
        part = slice(i * batch, (i + 1) * batch)
        batch_features = [features(anchors[part]), features(positives[part])]
        optimizer.zero_grad(set_to_none=True)
        with run.autocast():
            loss(batch_features, labels).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    def lengths(i: int) -> list[int]:
        part = slice(i * batch, (i + 1) * batch)
        return [int(n) for t in (anchors, positives) for n in tokenize(t[part])["attention_mask"].sum(1)]

    return step, lengths, model[0].auto_model


def train_row(
    run: Run, side: str, folder: Path, batch: int, mini: int, steps: int, model: Any = None
) -> dict:
    """Measure ``side`` (``embforge`` or :data:`PEER`) at ``batch`` pairs: pairs/s, peak memory, model FLOPs/s,
    MFU. ``model``: an embforge model to train instead of ``folder``'s (the decoder section's)."""
    run.free()
    if side == PEER:
        step, lengths, backbone = peer_stepper(run, folder, batch, mini, steps)
    else:
        model = model if model is not None else embforge_encoder(run, folder)
        step, lengths = embforge_stepper(run, model, batch, mini, steps)
        backbone = model.backbone
    with quiet():
        timing = measure(run, step, steps)
    flops = sum(step_flops(backbone, lengths(i)) for i in range(1, steps + 1)) / steps
    rate = flops / timing["s/step"]
    print(f"  {side}: batch {batch}, mini-batch {mini}: {batch / timing['s/step']:.1f} pairs/s", flush=True)
    attention = getattr(backbone.config, "_attn_implementation", None) or "-"
    return {
        "library": side,
        "attention": attention if side == PEER else "packed (SDPA / keyed-dropout chunks)",
        "batch": batch,
        "mini-batch": mini or "-",
        "steps": steps,
        "pairs/s": round(batch / timing["s/step"], 1),
        "s/step": round(timing["s/step"], 4),
        "peak MiB": timing["peak MiB"],
        "tokens/step": round(sum(sum(lengths(i)) for i in range(1, steps + 1)) / steps),
        "TFLOP/s": float(f"{rate / 1e12:.4g}"),
        "MFU %": round(100 * rate / matmul_peak(run)["flops"], 1),
    }


def guarded_row(run: Run, fn: Callable[[], dict], **keys: Any) -> dict:
    """``fn()``, or the row's ``keys`` with a skip (past the deadline) or the error it raised (OOM included)."""
    if run.past_deadline():
        return {**keys, "error": "skipped: the section's time budget is spent"}
    try:
        return fn()
    except Exception as error:
        row = {**keys, "error": f"{type(error).__name__}: {str(error)[:300]}"}
    run.free()  # after the except block: its traceback no longer holds the step's tensors
    return row


def ratio_row(rows: list[dict], **keys: Any) -> dict:
    """embforge / sentence-transformers of the last two rows (pairs/s and peak memory)."""
    peer, ours = rows[-2], rows[-1]
    if "pairs/s" not in peer or "pairs/s" not in ours:
        return {**keys, "library": "embforge / peer", "error": "a side did not run"}
    memory = ours["peak MiB"] / peer["peak MiB"] if peer["peak MiB"] else None
    return {
        **keys,
        "library": "**embforge / peer**",
        "pairs/s": f"**{ours['pairs/s'] / peer['pairs/s']:.2f}x**",
        "peak MiB": f"{memory:.2f}x" if memory else "-",
    }
