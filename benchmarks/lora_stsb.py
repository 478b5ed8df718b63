"""LoRA vs full fine-tuning of all-MiniLM-L6-v2 on STS-B: trainable parameters, peak memory, time, test Spearman.

One configuration per process (so the peak resident memory is that run's own), the default recipe (CoSENT, batch
32, 1 epoch, 10 % warm-up, the dev set evaluated at the end) unless told otherwise. Prints one JSON line.

    python benchmarks/lora_stsb.py --lora-r 0                # full fine-tuning
    python benchmarks/lora_stsb.py --lora-r 16               # LoRA, default learning rate 5e-5
    python benchmarks/lora_stsb.py --lora-r 16 --lr 5e-4     # LoRA usually wants a larger learning rate
    python benchmarks/lora_stsb.py --lora-r 16 --max-steps 8   # memory and step time only (no evaluation)
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import quiet_config

from embforge.data.paths import data_root
from embforge.data.tables import read_table
from embforge.encoder import Encoder
from embforge.evaluate.sts import evaluate_sts
from embforge.losses import get_loss
from embforge.modeling.lora import apply_lora, trainable_parameters
from embforge.training.loop import train
from embforge.training.tasks import Task


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lora-r", type=int, default=16, help="LoRA rank; 0 = full fine-tuning")
    parser.add_argument("--lora-alpha", type=float, default=None)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=None, help="stop early; skips the evaluations")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--eval-every", type=int, default=0, help="also evaluate dev every N steps")
    parser.add_argument("--output", default=None, help="run folder (metrics.jsonl); default: a temporary one")
    parser.add_argument("--merge", action="store_true", help="merge the adapters before the test evaluation")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    stsb = data_root() / "stsb_en"
    model = Encoder.load("all-MiniLM-L6-v2")
    if args.lora_r:
        apply_lora(model, r=args.lora_r, alpha=args.lora_alpha)
    trainable, total = trainable_parameters(model)
    dev = read_table(stsb / "stsb-en-dev.csv")
    task = Task("stsb", read_table(stsb / "stsb-en-train.csv"), get_loss("cosent"))
    with tempfile.TemporaryDirectory() as scratch:
        output = args.output or Path(scratch) / "run"
        config = quiet_config(
            output, eval_every=args.eval_every, epochs=args.epochs, max_steps=args.max_steps, lr=args.lr
        )
        evaluator = None if args.max_steps else lambda m: evaluate_sts(m, dev)
        before = _peak_rss_mb()  # model loaded, data read
        started, cpu = time.perf_counter(), time.process_time()
        summary = train(model, [task], config, evaluator=evaluator)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    if args.merge and args.lora_r:
        from embforge.modeling.lora import merge_lora

        merge_lora(model)
    test = {} if args.max_steps else evaluate_sts(model, read_table(stsb / "stsb-en-test.csv"))
    record = {
        "lora_r": args.lora_r,
        "lr": args.lr,
        "epochs": args.epochs,
        "trainable_parameters": trainable,
        "total_parameters": total,
        "peak_rss_mb": _peak_rss_mb(),
        "peak_rss_before_training_mb": before,
        "train_seconds": round(seconds, 1),
        "train_cpu_seconds_per_step": round(cpu / summary["steps"], 2),
        "steps": summary["steps"],
        "dev_spearman": (summary["final"] or {}).get("spearman"),
        "test_spearman": test.get("spearman"),
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(record), file=sys.stdout)


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


if __name__ == "__main__":
    main()
