"""One prepared GPU run (issue #51): parity, training and encoding speed vs sentence-transformers, MFU, decoders.

    bash benchmarks/gpu/run.sh OUTDIR                 # on a GPU: <= 8 minutes, writes OUTDIR/gpu.json and gpu.md
    bash benchmarks/gpu/run.sh OUTDIR --cpu --tiny    # the same code paths on tiny random models (the test suite)
    python benchmarks/gpu/gpu_run.py bundle gpu-bundle  # make gpu-bundle: what the run needs beside the code

Sections (each guarded: one that fails records its error and the others still run; each has a time budget,
checked between configurations; gpu.json and gpu.md are rewritten after every section):

- ``correctness``: embforge's training forward and step on the device (packed attention, bf16 autocast, keyed
  dropout, the cached GradCache step through the loop's ``micro_step``) against the fp32 reference, one batch;
- ``train``: all-MiniLM-L6-v2 training pairs/s and peak memory, embforge vs sentence-transformers, InfoNCE (MNRL)
  on SciFact pairs, batch 32 plain and 256/1024 cached in mini-batches of 128 texts, same steps, bf16 autocast;
- ``mfu``: model FLOPs/s of a plain training step over the measured dense matmul peak, MiniLM and a random
  bert-base-sized model, at the largest batch that fits;
- ``encode``: tokens/s encoding 10k texts of mixed length, both libraries in fp16;
- ``decoder``: a random Qwen3-0.6B-shaped embedder (bf16 autocast), full fine-tuning and LoRA: steps/s, memory.

The bundle (``make gpu-bundle``): all-MiniLM-L6-v2 as fp16 safetensors + tokenizer, the SciFact pairs and the
texts to encode (gzipped JSON), and pure copies of peft/accelerate/psutil, appended to ``sys.path`` (the image's own
installs win) because the LoRA path needs peft.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_bench import (  # this folder, first on sys.path when run as a script
    BUDGETS,
    Run,
    correctness,
    decoder,
    encode,
    mfu,
    train,
)
from gpu_bundle import build_bundle

SECTIONS: dict[str, Callable[[Run], dict[str, Any]]] = {
    "correctness": correctness,
    "train": train,
    "mfu": mfu,
    "encode": encode,
    "decoder": decoder,
}


def cell(value: Any) -> str:
    if isinstance(value, bool):
        return "pass" if value else "**FAIL**"
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "/").replace("\n", " ")


def table(rows: list[dict[str, Any]]) -> list[str]:
    """A Markdown table of dict rows (columns: every key, in first-seen order)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]


def write_report(report: dict[str, Any], out: Path) -> None:
    """``out/gpu.json`` (everything) and ``out/gpu.md`` (the device, versions, and one table per section)."""
    (out / "gpu.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    meta = report["meta"]
    lines = [f"# embforge GPU run: {meta['device']}", "", *table([meta]), ""]
    for name, section in report["sections"].items():
        lines += [f"## {name} ({section['status']}, {section['seconds']} s of {section['budget_s']} s)", ""]
        if "error" in section:
            lines += [f"error: `{section['error']}`", ""]
        lines += [*table(section.get("rows", [])), ""] if section.get("rows") else []
        extras = {
            k: v for k, v in section.items() if k not in ("rows", "status", "error", "seconds", "budget_s")
        }
        lines += [f"- {key}: {cell(value)}" for key, value in extras.items()] + [""]
    (out / "gpu.md").write_text("\n".join(lines))


def guarded(run: Run, name: str, section: Callable[[Run], dict[str, Any]]) -> dict[str, Any]:
    """``section(run)`` with its status, its seconds and budget; an exception becomes the section's error."""
    started = time.perf_counter()
    run.deadline = time.monotonic() + BUDGETS[name] * run.budget_scale
    print(f"== {name} (budget {BUDGETS[name] * run.budget_scale:.0f} s)", flush=True)
    try:
        result = {"status": "ok", **section(run)}
    except Exception as error:  # a failing section must not stop the others
        traceback.print_exc()
        result = {"status": "error", "error": f"{type(error).__name__}: {error}"[:2000]}
    finally:
        run.free()
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["budget_s"] = BUDGETS[name] * run.budget_scale
    return result


def main(argv: list[str] | None = None) -> None:
    """``bundle OUT [--data ROOT]`` builds the bundle; ``OUTDIR [--cpu] [--tiny] [--only SECTION]`` runs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bundle"]:
        parser = argparse.ArgumentParser(description="build the folder the GPU run needs beside the code")
        parser.add_argument("out", type=Path)
        parser.add_argument("--data", default=None, help="data root (default ../shared/data)")
        args = parser.parse_args(argv[1:])
        size = build_bundle(args.out, data=args.data)
        print(f"{args.out}: {size / 2**20:.1f} MiB (limit 64 MiB)")
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help="folder for gpu.json and gpu.md")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (no GPU needed)")
    parser.add_argument("--tiny", action="store_true", help="tiny random models, a few steps and texts")
    parser.add_argument(
        "--bundle", type=Path, default=None, help="bundle folder (default: <repo>/gpu-bundle)"
    )
    parser.add_argument(
        "--data", default=None, help="data root when there is no bundle (default ../shared/data)"
    )
    parser.add_argument("--only", action="append", choices=list(SECTIONS), help="run only these sections")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        run = Run.start(out=args.out, cpu=args.cpu, tiny=args.tiny, bundle=args.bundle, data=args.data)
    except Exception as error:  # no GPU, no model, no data: the report says so too
        args.out.mkdir(parents=True, exist_ok=True)
        message = f"{type(error).__name__}: {error}"
        write_report(
            {"meta": {"device": "none (set-up failed)", "setup error": message}, "sections": {}}, args.out
        )
        raise SystemExit(f"gpu_run: {message}") from error
    for name, section in SECTIONS.items():
        if not args.only or name in args.only:
            run.report["sections"][name] = guarded(run, name, section)
            write_report(run.report, args.out)
    print(json.dumps({k: v.get("status") for k, v in run.report["sections"].items()}))
    print(f"wrote {args.out / 'gpu.json'} and {args.out / 'gpu.md'}")


if __name__ == "__main__":
    main()
