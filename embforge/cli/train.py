"""``embforge train``: fine-tune a model from files (flags and/or a TOML config)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from embforge.cli.common import parse_options
from embforge.cli.values import (
    data_path,
    device,
    folder,
    int_list,
    non_negative_float,
    non_negative_int,
    number,
    option,
    positive_float,
    positive_int,
    ratio,
    seed,
)

# flag -> (RunSpec/TrainConfig key, type, help)
_FLAGS: list[tuple[str, str, Callable[[str], object], str]] = [
    ("--model", "model", str, "model folder or alias (default all-MiniLM-L6-v2)"),
    (
        "--model-type",
        "model_type",
        str,
        "dense (default; also 'bi'), cross (cross-encoder: a score per pair), multivector (ColBERT: a vector per "
        "token), sparse (SPLADE: an MLM head) or static (token-embedding table, e.g. from distill-static)",
    ),
    (
        "--eval",
        "eval",
        data_path,
        "STS file (sentence1, sentence2, score; with 0/1 labels a cross-encoder gets pair classification) "
        "evaluated during training; best kept",
    ),
    (
        "--loss",
        "loss",
        str,
        "loss (default cosent; infonce with --retrieval-train; infonce for multivector models, splade for "
        "sparse models)",
    ),
    ("--output", "output", folder, "output folder (default ./output)"),
    ("--epochs", "epochs", positive_int, "epochs (default 1)"),
    (
        "--max-steps",
        "max_steps",
        positive_int,
        "stop after this many optimiser steps (overrides --epochs; default: none)",
    ),
    ("--batch-size", "batch_size", positive_int, "batch size (default 32)"),
    ("--lr", "lr", positive_float, "peak learning rate (default 5e-5)"),
    ("--warmup-ratio", "warmup_ratio", ratio, "fraction of steps of linear warm-up, 0 to 1 (default 0.1)"),
    ("--weight-decay", "weight_decay", non_negative_float, "AdamW weight decay (default 0.01)"),
    (
        "--layer-lr-decay",
        "layer_lr_decay",
        number(0, 1, open_low=True),
        "layer-wise learning-rate decay: each layer below the last at D x the rate of the one above, the "
        "embeddings below the first, e.g. 0.8; D in (0, 1] (default 1 = off)",
    ),
    ("--grad-accum", "grad_accum", positive_int, "gradient accumulation steps (default 1)"),
    (
        "--mini-batch-size",
        "mini_batch_size",
        non_negative_int,
        "cached step (GradCache): embed the batch N rows at a time, loss over the whole batch (default 0 = off)",
    ),
    ("--max-grad-norm", "max_grad_norm", non_negative_float, "gradient clipping norm, 0 = off (default 1.0)"),
    ("--amp", "amp", str, "mixed precision (default auto: bf16 where the CPU/GPU has it natively)"),
    ("--seed", "seed", seed, "random seed (default 42; overrides every stage's seed of a pipeline file)"),
    ("--eval-every", "eval_every", non_negative_int, "evaluate every N steps (default 0: at the end only)"),
    (
        "--save-every",
        "save_every",
        non_negative_int,
        "checkpoint every N steps and at the end (default 200; 0 = no checkpoints, the model is still saved)",
    ),
    (
        "--max-seq-length",
        "max_seq_length",
        positive_int,
        "truncate texts to this many tokens (default: the model's)",
    ),
    (
        "--columns",
        "columns",
        str,
        "column mapping, e.g. '0=sentence1,1=sentence2,2=score'; columns not named keep their standard names "
        "(default: the file's column names)",
    ),
    (
        "--data-mode",
        "data_mode",
        str,
        "memory (default), mmap (an Arrow cache written once, memory-mapped) or stream (read as training goes); "
        "--train may then be a folder of data files or a Hugging Face data set id",
    ),
    (
        "--max-bad-rows",
        "max_bad_rows",
        non_negative_int,
        "mmap/stream: skip up to N bad rows (default 0: stop at the first)",
    ),
    (
        "--shuffle-window",
        "shuffle_window",
        non_negative_int,
        "rows shuffled together (default 0: a whole file; stream 10000)",
    ),
    ("--data-cache", "data_cache", str, "mmap: folder for the Arrow cache (default: the datasets cache)"),
    ("--data-split", "data_split", str, "split of a Hugging Face data set id (default train)"),
    (
        "--chunk-tokens",
        "chunk_tokens",
        positive_int,
        "padded tokens per attention block (default 65536) or padded chunk (default 16384)",
    ),
    ("--device", "device", device, "cpu, cuda, cuda:1 ... (default auto)"),
    (
        "--retrieval-train",
        "retrieval_train",
        str,
        "BEIR or SciFact folder: train a retriever on its qrels (default: none)",
    ),
    ("--retrieval-split", "retrieval_split", str, "qrels split to train on (default train)"),
    (
        "--retrieval-eval-split",
        "retrieval_eval_split",
        str,
        "split evaluated (NDCG@10) during training (default: none)",
    ),
    (
        "--num-negatives",
        "num_negatives",
        non_negative_int,
        "mined negatives per row, 0 = in-batch only (default 1)",
    ),
    ("--mine-method", "mine_method", str, "how negatives are mined (default dense)"),
    (
        "--refresh-negatives-every",
        "refresh_negatives_every",
        non_negative_int,
        "re-mine with the current model every N steps (default 0: never)",
    ),
    ("--hard-ratio-start", "hard_ratio_start", ratio, "hard-negative ratio at the start (default 0.3)"),
    ("--hard-ratio-end", "hard_ratio_end", ratio, "hard-negative ratio at the end (default 0.9)"),
    (
        "--lora-r",
        "lora_r",
        non_negative_int,
        "train rank-R LoRA adapters, not all weights (default 0: off; pip install -e '.[peft]')",
    ),
    ("--lora-alpha", "lora_alpha", positive_float, "LoRA scaling numerator (default 2 x rank)"),
    (
        "--lora-dropout",
        "lora_dropout",
        number(0, 1, open_high=True),
        "dropout on the LoRA adapters' input, in [0, 1) (default 0)",
    ),
    ("--lora-targets", "lora_targets", str, "modules to adapt: q_proj,v_proj ... (default all-linear)"),
    (
        "--ema-decay",
        "ema_decay",
        number(0, 1, open_high=True),
        "final model = EMA of the weights with this decay in [0, 1), e.g. 0.99 (default off)",
    ),
    ("--ema-start", "ema_start", non_negative_int, "first step the EMA follows (default 0)"),
    (
        "--soup-last",
        "soup_last",
        non_negative_int,
        "final model = mean of the weights at the last K checkpoint steps (default 0)",
    ),
    (
        "--soup-every",
        "soup_every",
        non_negative_int,
        "steps between the soup's members (default: --save-every)",
    ),
    (
        "--l2sp",
        "l2sp",
        non_negative_float,
        "after each step pull lr x L2SP of the way back to the starting weights, e.g. 1000 (default 0: off)",
    ),
    (
        "--ewc",
        "ewc",
        non_negative_float,
        "after each step pull each weight lr x EWC x its Fisher importance of the way back, e.g. 1000 (default 0)",
    ),
    (
        "--wise-ft",
        "wise_ft",
        ratio,
        "final model = (1 - W) x starting + W x fine-tuned weights, W in [0, 1], e.g. 0.5 (default off)",
    ),
    (
        "--lines",
        "lines",
        ratio,
        "final model: each weight keeps (A + (1 - A) x its depth) of its change (LiNeS; embeddings A, last layer "
        "all), A in [0, 1], e.g. 0.5 (default off)",
    ),
]


# the sections of `train --help`, in order
GROUPS = {
    "data": "what to train on and how it is read",
    "model": "the model trained",
    "loss": "what is optimised",
    "optimisation": "steps, batch and learning rate",
    "scale": "memory, precision, devices",
    "evaluation": "what is measured during training (the best value keeps best/)",
    "output": "what is written, and resuming",
}
_GROUP = {
    **dict.fromkeys(["--model", "--model-type", "--max-seq-length", "--lora-r", "--lora-alpha"], "model"),
    **dict.fromkeys(["--lora-dropout", "--lora-targets"], "model"),
    "--loss": "loss",
    **dict.fromkeys(["--epochs", "--max-steps", "--batch-size", "--lr", "--warmup-ratio"], "optimisation"),
    **dict.fromkeys(
        ["--weight-decay", "--layer-lr-decay", "--grad-accum", "--max-grad-norm", "--seed"], "optimisation"
    ),
    **dict.fromkeys(["--ema-decay", "--ema-start", "--soup-last", "--soup-every"], "optimisation"),
    **dict.fromkeys(["--l2sp", "--ewc", "--wise-ft", "--lines"], "optimisation"),
    **dict.fromkeys(["--mini-batch-size", "--amp", "--chunk-tokens", "--device"], "scale"),
    **dict.fromkeys(["--eval", "--eval-every", "--retrieval-eval-split"], "evaluation"),
    **dict.fromkeys(["--output", "--save-every"], "output"),
}
_METAVAR = {
    "--model": "MODEL",
    "--model-type": "KIND",
    "--eval": "FILE",
    "--loss": "NAME",
    "--output": "DIR",
    "--lr": "LR",
    "--warmup-ratio": "FRACTION",
    "--max-grad-norm": "NORM",
    "--max-seq-length": "TOKENS",
    "--columns": "MAPPING",
    "--chunk-tokens": "TOKENS",
    "--device": "DEVICE",
    "--retrieval-train": "FOLDER",
    "--retrieval-split": "SPLIT",
    "--retrieval-eval-split": "SPLIT",
    "--hard-ratio-start": "FRACTION",
    "--hard-ratio-end": "FRACTION",
    "--lora-r": "RANK",
    "--lora-dropout": "P",
    "--lora-targets": "MODULES",
    "--data-mode": "MODE",
    "--data-cache": "DIR",
    "--data-split": "SPLIT",
    "--shuffle-window": "ROWS",
}
_KIND_METAVAR: dict[Callable[[str], object], str] = {int: "N", float: "X", str: "VALUE"}
_CHOICES = {"--amp": ["auto", "no", "bf16", "fp16"], "--mine-method": ["dense", "bm25", "hybrid"]}
_HELP = {flag: text for flag, _, _, text in _FLAGS}


def _metavar(kind: Callable[[str], object]) -> str:
    """``N`` for an integer, ``X`` for a number (a range-checked type says which it is), else ``VALUE``."""
    return str(getattr(kind, "metavar", _KIND_METAVAR.get(kind, "VALUE")))


def _loss_help() -> str:
    from embforge.losses import LOSSES
    from embforge.losses.cross import CROSS_LOSSES
    from embforge.losses.late import MULTIVECTOR_LOSSES

    cross, late = ", ".join(CROSS_LOSSES), ", ".join(MULTIVECTOR_LOSSES)
    return (
        f"{_HELP['--loss']}: {', '.join(LOSSES)}; cross-encoders (--model-type cross): {cross}; "
        f"multi-vector models: {late}"
    )


# on/off flags: (group, flag, help); those in _NEGATABLE also take a --no- form
_SWITCHES: list[tuple[str, str, str]] = [
    (
        "data",
        "--header",
        "the CSV/TSV training files have (--header) or have no (--no-header) header row (default: detected from "
        "the content; names in --columns imply a header)",
    ),
    (
        "data",
        "--group-by-length",
        "batch texts of similar length together (faster, less random; default off)",
    ),
    ("output", "--resume", "continue from the last checkpoint"),
    (
        "output",
        "--overwrite",
        "delete what an earlier run left in --output before starting (default off: a folder that is not empty is "
        "refused unless --resume continues it)",
    ),
    (
        "output",
        "--allow-data-change",
        "--resume although the training files changed since the checkpoint (default: refused, naming the file)",
    ),
    (
        "scale",
        "--gradient-checkpointing",
        "recompute each layer in the backward pass: less activation memory, ~1/3 more compute (default off)",
    ),
    (
        "output",
        "--merge-lora",
        "fold the LoRA adapters into the weights of the final model (a plain sentence-transformers folder; default "
        "off)",
    ),
    (
        "output",
        "--keep-training-state",
        "keep checkpoints/ (optimizer state, about 3x the model's size) after the run, to --resume it later "
        "(default off: removed)",
    ),
    (
        "scale",
        "--gather-negatives",
        "under torchrun: every process's loss is the global batch's (all-gathered embeddings: in-batch negatives "
        "from every process, the gradients of one process); default on",
    ),
    ("output", "--quiet", "no progress bars"),
]
_NEGATABLE = {"--header", "--gather-negatives"}


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser("train", help="fine-tune a model", description=__doc__)
    group = {title: parser.add_argument_group(title, text) for title, text in GROUPS.items()}
    parser.add_argument(
        "config_file", nargs="?", metavar="RUN.toml", help="optional TOML run file (flags override it)"
    )
    parser.add_argument(
        "--config",
        dest="config_flag",
        metavar="RUN.toml",
        help="TOML run file (same as the positional argument)",
    )
    group["data"].add_argument(
        "--train",
        action="append",
        type=data_path,
        metavar="FILE",
        help="training file (repeat for several tasks)",
    )
    for flag, key, kind, text in _FLAGS:
        group[_GROUP.get(flag, "data")].add_argument(
            flag,
            dest=key,
            type=kind,
            default=None,
            metavar=None if flag in _CHOICES else _METAVAR.get(flag, _metavar(kind)),
            choices=_CHOICES.get(flag),
            help=_loss_help() if flag == "--loss" else text,
        )
    group["loss"].add_argument(
        "--loss-option",
        action="append",
        type=option,
        metavar="NAME=VALUE",
        help="loss option, e.g. temperature=0.02, symmetric=true, scale=20 (repeatable)",
    )
    group["loss"].add_argument(
        "--matryoshka-dims",
        type=int_list,
        default=None,
        metavar="DIMS",
        help="train every prefix of these sizes too, e.g. 384,256,128,64 (default: none)",
    )
    for title, flag, text in _SWITCHES:
        action = argparse.BooleanOptionalAction if flag in _NEGATABLE else "store_true"
        group[title].add_argument(flag, action=action, default=None, help=text)
    parser.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> Mapping[str, object] | None:
    from embforge.training.distributed import is_main
    from embforge.training.run import load_toml, run, spec_from_dict

    path = args.config_file or args.config_flag
    values: dict[str, Any] = load_toml(path) if path else {}
    if path and "stages" in values:  # a multi-stage pipeline file (embforge/pipeline.py)
        from embforge.training.pipeline import load_pipeline, run_pipeline

        result = run_pipeline(
            load_pipeline(path),
            output=args.output,
            device=args.device,
            quiet=args.quiet,
            resume=bool(args.resume),
            seed=args.seed,
            overwrite=bool(args.overwrite),
            allow_data_change=args.allow_data_change,
        )
        return result if is_main() else None  # torchrun: rank 0 prints
    for _, key, _, _ in _FLAGS:
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    for key in (
        "train",
        "header",
        "matryoshka_dims",
        "group_by_length",
        "resume",
        "overwrite",
        "allow_data_change",
        "quiet",
        "merge_lora",
        "gradient_checkpointing",
    ):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    if args.loss_option:
        values["loss_options"] = {**values.get("loss_options", {}), **parse_options(args.loss_option)}
    if args.keep_training_state is not None:
        values["keep_training_state"] = args.keep_training_state
    if args.gather_negatives is not None:
        values["gather_negatives"] = args.gather_negatives
    spec = spec_from_dict(values, source=path or "command line")
    summary = run(spec)
    return {"output": spec.config.output, **summary} if is_main() else None
