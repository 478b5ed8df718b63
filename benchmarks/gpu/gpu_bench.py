"""The GPU run's five sections; each takes the :class:`~gpu_common.Run` and returns its figures (``rows``: one dict
per table row) and the formula or tolerances that say what they mean."""

from __future__ import annotations

import importlib.util
from functools import partial
from typing import Any

import numpy as np
import torch
from gpu_common import FORMULA, Run, matmul_peak, quiet, random_bert
from gpu_train import PEER, embforge_encoder, guarded_row, ratio_row, train_row

__all__ = ["BUDGETS", "Run", "correctness", "decoder", "encode", "mfu", "train"]

# seconds per section on the GPU (checked between configurations); the whole run stays under 8 minutes
BUDGETS = {"correctness": 40, "train": 150, "mfu": 110, "encode": 50, "decoder": 80}
# (loss, gradient) relative-difference tolerances: fp32 paths vs fp32 reference; bf16 autocast vs fp32
FP32_TOL = (1e-4, 1e-3)
BF16_TOL = (2e-2, 5e-2)


# ----------------------------------------------------------------------------------------------- correctness
def loss_and_grads(model: Any, task: Any, rows: tuple[int, ...], **how: Any) -> tuple[float, dict]:
    """Loss and gradients of one step on ``rows``: ``embed`` (a callable: the reference's padded forward) or the
    packed forward (``mini``: cached in mini-batches); ``train`` (keyed dropout, ``seed``), ``dtype`` autocast."""
    from embforge.training.step import cached_step

    model.train(how.get("train", False))
    model.zero_grad(set_to_none=True)
    dtype, seed, embed = how.get("dtype"), how.get("seed", 7), how.get("embed")
    device = model.device.type
    with quiet(), torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
        if how.get("mini"):
            loss = cached_step(
                model,
                task,
                rows,
                mini_batch_size=how["mini"],
                max_tokens=None,
                dropout_seed=seed,
                backward=lambda value: value.backward(),
            )
        else:
            emb = embed() if embed else model(task.inputs(rows), dropout_seed=seed)
            loss = task.loss_fn(emb, task.labels(rows))
            loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


def loop_step(run: Run, model: Any, task: Any, rows: tuple[int, ...], *, amp: str, mini: int) -> tuple:
    """Loss and gradients of the loop's own ``micro_step`` (trainer autocast, cached when ``mini``), dropout on."""
    from embforge.training.config import TrainConfig
    from embforge.training.loop import micro_step
    from embforge.training.tasks import prepare
    from embforge.training.trainer import set_up

    config = TrainConfig(
        output=str(run.tmp / "parity"),
        amp=amp,
        mini_batch_size=mini,
        device=str(run.device),
        max_steps=1,
        batch_size=len(rows),
        save_every=0,
        quiet=True,
    )
    with quiet():
        trainer, _ = set_up(model, [task], config)
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # micro_step draws its dropout seed from torch's generator: the same seed both times
    loss = micro_step(trainer, prepare(task, model), rows, sync=True)
    return float(loss), {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}


def rel(got: tuple[float, dict], ref: tuple[float, dict]) -> tuple[float, float, float]:
    """Relative differences: loss, all gradients as one vector, the worst gradient tensor."""
    loss_rel = abs(got[0] - ref[0]) / max(abs(ref[0]), 1e-12)
    diff = sum(float((got[1][n] - g).norm() ** 2) for n, g in ref[1].items())
    norm = sum(float(g.norm() ** 2) for g in ref[1].values())
    floor = 1e-3 * norm**0.5 / max(1, len(ref[1])) ** 0.5
    worst = max(float((got[1][n] - g).norm()) / max(float(g.norm()), floor) for n, g in ref[1].items())
    return loss_rel, (diff / norm) ** 0.5 if norm else float("nan"), worst


def compare(name: str, got: tuple[float, dict], ref: tuple[float, dict], tol: tuple[float, float]) -> dict:
    """A parity row: the relative differences (:func:`rel`), the tolerance, and whether they are within it."""
    loss_rel, grad_rel, worst = rel(got, ref)
    return {
        "check": name,
        "loss rel": f"{loss_rel:.1e}",
        "grad rel": f"{grad_rel:.1e}",
        "worst tensor": f"{worst:.1e}",
        "tolerance": f"loss {tol[0]:.0e}, grad {tol[1]:.0e}",
        "pass": bool(loss_rel <= tol[0] and grad_rel <= tol[1] and set(got[1]) == set(ref[1])),
    }


def correctness(run: Run) -> dict[str, Any]:
    """embforge's device paths against the fp32 reference (the Hugging Face padded forward) on one batch."""
    from embforge.data.tables import Dataset
    from embforge.losses import get_loss
    from embforge.modeling.padding import pad_ids
    from embforge.training.tasks import Task, prepare

    model = embforge_encoder(run, run.minilm).to(run.device)
    n, mini = run.knobs.parity_pairs, max(2, run.knobs.parity_pairs // 4)
    anchors, positives = run.pairs[0][:n], run.pairs[1][:n]
    task = Task(
        "pairs",
        Dataset("pairs", {"anchor": anchors, "positive": positives}, list(range(1, n + 1))),
        get_loss("infonce"),
    )
    prepared, rows = prepare(task, model), tuple(range(n))
    ids = prepared.inputs(rows)

    def padded() -> torch.Tensor:
        return model(*pad_ids(ids, model.pad_token_id, device=run.device, side=model.padding_side))

    bf16 = torch.bfloat16
    reference = loss_and_grads(model, prepared, rows, embed=padded)
    plain = loss_and_grads(model, prepared, rows, train=True)
    hf_bf16 = loss_and_grads(model, prepared, rows, embed=padded, dtype=bf16)
    own = rel(hf_bf16, reference)  # bf16's own error on this model: twice it is tolerated where it is larger
    tol = (max(BF16_TOL[0], 2 * own[0]), max(BF16_TOL[1], 2 * own[1]))
    checks = [
        compare("HF padded bf16 autocast vs HF padded fp32: bf16's own error", hf_bf16, reference, BF16_TOL),
        compare(
            "packed forward fp32 vs HF padded fp32 (no dropout)",
            loss_and_grads(model, prepared, rows),
            reference,
            FP32_TOL,
        ),
        compare(
            "packed forward bf16 autocast vs HF padded fp32 (no dropout)",
            loss_and_grads(model, prepared, rows, dtype=bf16),
            reference,
            tol,
        ),
        compare(
            f"keyed dropout: cached step (mini-batch {mini}) vs plain step, fp32",
            loss_and_grads(model, prepared, rows, train=True, mini=mini),
            plain,
            FP32_TOL,
        ),
        compare(
            f"loop micro_step bf16 + cached ({mini}) vs micro_step fp32 plain, same dropout",
            loop_step(run, model, task, rows, amp="bf16", mini=mini),
            loop_step(run, model, task, rows, amp="no", mini=0),
            tol,
        ),
        dropout_keys(model, ids),
    ]
    return {
        "attention": attention_path(run),
        "rows": checks,
        "note": "rel = abs(a - b) / abs(b); grad rel: all gradients as one vector; bf16 rows' tolerance: "
        f"{BF16_TOL} or twice bf16's own error (first row), whichever is larger",
    }


def dropout_keys(model: Any, ids: list[list[int]]) -> dict:
    """Keyed dropout: the same seed gives the same output, another seed another one."""
    model.train()
    with torch.no_grad():
        one, again, other = (model(ids, dropout_seed=s) for s in (1, 1, 2))
    return {
        "check": "keyed dropout: same seed -> same output, other seed -> different",
        "pass": bool(torch.equal(one, again) and not torch.allclose(one, other)),
    }


def attention_path(run: Run) -> dict[str, str]:
    flash = importlib.util.find_spec("flash_attn") is not None
    return {
        "flash-attn": "installed" if flash else "not installed",
        "inference / no dropout": "flash-attn varlen" if flash and run.cuda else "SDPA per length group",
        "training with dropout": "embforge's chunked attention with keyed masks (modeling/attention.py)",
    }


# -------------------------------------------------------------------------------------------- train and MFU
def train(run: Run) -> dict[str, Any]:
    """MiniLM training pairs/s and peak memory, both libraries, each batch size (cached above the first)."""
    rows: list[dict] = []
    k = run.knobs
    for batch, steps in zip(k.batches, k.steps):
        mini = k.mini if batch != k.batches[0] else 0
        for side in (PEER, "embforge"):
            rows.append(
                guarded_row(
                    run,
                    partial(train_row, run, side, run.minilm, batch, mini, steps),
                    library=side,
                    batch=batch,
                )
            )
        rows.append(ratio_row(rows, batch=batch))
    return {
        "model": str(run.minilm),
        "data": "SciFact (query, abstract) pairs",
        "loss": "InfoNCE / MNRL, scale 20",
        "rows": rows,
        "formula": FORMULA,
        "matmul peak": matmul_peak(run),
    }


def fill(run: Run, side: str, folder: Any, name: str) -> dict:
    """The largest batch of :attr:`Knobs.mfu_batches` whose plain step fits, measured; OOMs are skipped."""
    errors = []
    for batch in run.knobs.mfu_batches:
        if run.past_deadline():
            break
        try:
            row = train_row(run, side, folder, batch, 0, run.knobs.mfu_steps)
            return {"model": name, **row, "larger batches": ", ".join(errors) or "none tried"}
        except (torch.OutOfMemoryError, RuntimeError) as error:  # cuBLAS may say ALLOC_FAILED instead
            if not isinstance(error, torch.OutOfMemoryError) and "ALLOC" not in str(error):
                raise
            errors.append(f"{batch}: out of memory")
        run.free()  # after the except block: its traceback no longer holds the step's tensors
    return {"model": name, "library": side, "error": "; ".join(errors) or "skipped: budget spent"}


def mfu(run: Run) -> dict[str, Any]:
    """MFU of a plain (uncached) training step at the largest batch that fits, MiniLM and bert-base-sized."""
    peak = matmul_peak(run)
    bert = random_bert(run.tmp / "bert-base", run.knobs.bert_base, run.tokenizer)
    rows = [
        guarded_row(run, partial(fill, run, side, folder, name), model=name, library=side)
        for name, folder in (("all-MiniLM-L6-v2", run.minilm), ("bert-base-sized, random", bert))
        for side in ("embforge", PEER)
    ]
    return {
        "rows": rows,
        "matmul peak": peak,
        "formula": FORMULA,
        "mfu": "MFU = model FLOPs/s ÷ measured dense matmul FLOPs/s (same device, same dtype)",
    }


# ------------------------------------------------------------------------------------------------- encode
def encode(run: Run) -> dict[str, Any]:
    """Tokens/s encoding mixed-length texts, both libraries in fp16 on a GPU (fp32 on a CPU), best of 2."""
    import time

    from sentence_transformers import SentenceTransformer

    from embforge.encoder import Encoder

    k, half = run.knobs, torch.float16 if run.cuda else torch.float32
    texts = run.texts[: k.encode_texts]
    ours = Encoder.load(run.minilm, device=run.device, max_seq_length=k.max_seq).to(half)
    with quiet():
        peer = SentenceTransformer(str(run.minilm), device=str(run.device)).to(half)
    peer.max_seq_length = k.max_seq
    tokens = sum(len(ids) for ids in ours.tokenize_ids(texts))
    sides = {
        PEER: lambda: peer.encode(texts, batch_size=k.encode_batch, convert_to_numpy=True),
        "embforge": lambda: ours.encode(texts, batch_size=k.encode_batch, show_progress=False),
    }
    best, out = dict.fromkeys(sides, 0.0), {}
    for _ in range(2):
        for side, fn in sides.items():
            run.sync()
            start = time.perf_counter()
            out[side] = np.asarray(fn(), dtype=np.float32)
            run.sync()
            best[side] = max(best[side], tokens / (time.perf_counter() - start))
    a, b = (v / np.linalg.norm(v, axis=1, keepdims=True) for v in out.values())
    rows = [
        {"library": side, "tokens/s": round(rate), "texts/s": round(rate * len(texts) / tokens)}
        for side, rate in best.items()
    ]
    rows.append({"library": "**embforge / peer**", "tokens/s": f"**{best['embforge'] / best[PEER]:.2f}x**"})
    return {
        "texts": len(texts),
        "tokens": tokens,
        "dtype": str(half),
        "rows": rows,
        "min cosine embforge vs peer": round(float((a * b).sum(1).min()), 5),
    }


# ------------------------------------------------------------------------------------------------ decoder
def decoder_model(run: Run, *, lora: bool) -> Any:
    """A random Qwen3 embedder of the run's decoder shape (MiniLM's tokenizer), LoRA r=16 on all linears."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

    from embforge.encoder import Encoder
    from embforge.modeling.lora import apply_lora

    tokenizer = AutoTokenizer.from_pretrained(str(run.tokenizer))
    torch.manual_seed(0)
    with run.device:
        backbone = Qwen3Model(Qwen3Config(vocab_size=len(tokenizer), **run.knobs.decoder))
    model = Encoder(
        backbone, tokenizer, pooling="lasttoken", normalize=True, max_seq_length=run.knobs.max_seq
    )
    return apply_lora(model, r=16, seed=0) if lora else model


def decoder(run: Run) -> dict[str, Any]:
    """Full fine-tuning and LoRA of the random Qwen3-shaped embedder: steps/s, pairs/s, peak memory (MFU: full)."""
    from embforge.modeling.lora import trainable_parameters

    k, rows = run.knobs, []
    for mode in ("full", "lora"):

        def measured(mode: str = mode) -> dict:
            run.free()
            model = decoder_model(run, lora=mode == "lora")
            trainable, total = trainable_parameters(model)
            row = train_row(run, "embforge", run.minilm, k.decoder_batch, 0, k.decoder_steps, model=model)
            if mode == "lora":  # frozen weights get no weight gradients: 6N over-counts
                row["TFLOP/s"] = row["MFU %"] = "-"
            return {
                "mode": mode,
                "params": total,
                "trainable": trainable,
                "steps/s": round(1 / row["s/step"], 2),
                **row,
            }

        rows.append(guarded_row(run, measured, mode=mode))
    return {"shape": k.decoder, "rows": rows, "formula": FORMULA}
