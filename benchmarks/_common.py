"""The training settings every side-by-side benchmark gives both libraries, written once.

``args`` is the benchmark's parsed command line with ``epochs``, ``batch_size``, ``lr``, ``seed``, ``device`` and
``amp`` (``no`` or ``bf16``). Both sides get 10 % linear warm-up, weight decay 0.01, clipping at 1.0, no
intermediate checkpoints and no progress output.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from embforge.training.config import TrainConfig


def peer_training_args(cls: Any, args: Any, out: Any) -> Any:
    """sentence-transformers' ``SentenceTransformerTrainingArguments`` / ``CrossEncoderTrainingArguments``."""
    return cls(
        output_dir=str(out),
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        warmup_steps=0.1,  # a float below 1 is a ratio of the total steps
        weight_decay=0.01,
        max_grad_norm=1.0,
        seed=args.seed,
        save_strategy="no",
        report_to="none",
        logging_steps=10_000,
        use_cpu=args.device == "cpu",
        bf16=args.amp == "bf16",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def embforge_train_config(args: Any, out: Any, **extra: Any) -> TrainConfig:
    """embforge's :class:`TrainConfig` with the same settings (``extra``: embforge-only fields)."""
    return TrainConfig(
        output=str(out),
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_ratio=0.1,
        weight_decay=0.01,
        max_grad_norm=1.0,
        seed=args.seed,
        save_every=0,
        quiet=True,
        device=args.device,
        amp=args.amp,
        **extra,
    )


def run_child(command: Sequence[str], what: str, env: Mapping[str, str] | None = None) -> dict:
    """Run a benchmark's child process; its last stdout line (JSON) plus its own peak RSS (``wait4``), in MB."""
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, env=env, text=True)
    out = process.stdout.read() if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise RuntimeError(f"{what} failed with status {status}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_mb"] = usage.ru_maxrss / 1024
    return result
