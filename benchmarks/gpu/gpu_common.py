"""What the GPU run's sections share: the run's settings (:class:`Run`, :class:`Knobs`), models, data, timing, FLOPs.

Model FLOPs of a training step (forward + backward), padding excluded::

    6 × N × Σ len  +  12 × layers × d_attn × Σ len²

``N``: parameters outside the embedding tables (and BERT's unused pooler); ``len``: each text's real tokens;
``d_attn`` = heads × head size (the hidden size for BERT). The second term is the attention's two products
(``QKᵀ`` and ``PV``, 2 × 2 × d_attn × len² per layer forward, three times that with the backward). A cached
(GradCache) step runs a second forward that is not counted: MFU counts the model's FLOPs, not the work done.
"""

from __future__ import annotations

import gc
import importlib.metadata
import platform
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
FORMULA = "model FLOPs/step = 6 × N_non-embedding × Σ len + 12 × layers × d_attn × Σ len² (real tokens only)"
# Qwen3-0.6B's shape (28 layers, 1024 wide, GQA 16/8 heads of 128) with MiniLM's 30,522-token vocabulary: ~0.47B
QWEN3_SHAPE = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 1024,
}
BERT_BASE = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
}


@dataclass(frozen=True)
class Knobs:
    """Sizes of one run: the GPU's (default) or ``--tiny``'s (:data:`TINY`)."""

    batches: tuple[int, ...] = (32, 256, 1024)  # training pairs per step; all but the first cached
    steps: tuple[int, ...] = (20, 8, 4)  # timed steps at each batch (after one warm-up step), both libraries
    mini: int = 128  # texts per cached mini-batch
    max_seq: int = 256
    parity_pairs: int = 64
    mfu_batches: tuple[int, ...] = (2048, 1024, 512, 256, 128, 64)  # tried largest first until one fits
    mfu_steps: int = 4
    encode_texts: int = 10_000
    encode_batch: int = 128
    decoder: dict[str, int] = field(default_factory=lambda: dict(QWEN3_SHAPE))
    decoder_batch: int = 32
    decoder_steps: int = 4
    bert_base: dict[str, int] = field(default_factory=lambda: dict(BERT_BASE))
    minilm_random: dict[str, int] | None = None  # --tiny: a random stand-in for MiniLM


TINY = Knobs(
    batches=(4, 16, 32),
    steps=(2, 2, 2),
    mini=8,
    max_seq=48,
    parity_pairs=8,
    mfu_batches=(16,),
    mfu_steps=2,
    encode_texts=64,
    encode_batch=32,
    decoder={
        **QWEN3_SHAPE,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
    },
    decoder_batch=4,
    decoder_steps=2,
    bert_base={"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
    minilm_random={
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
    },
)


@dataclass
class Run:
    """The run's device, precision, models and data, its report, and the current section's deadline."""

    device: torch.device
    knobs: Knobs
    dtype: torch.dtype | None  # training autocast dtype (None: fp32)
    tmp: Path
    minilm: Path  # all-MiniLM-L6-v2's folder (--tiny: a random tiny BERT with its tokenizer)
    tokenizer: Path  # MiniLM's folder: the tokenizer every random model uses
    pairs: tuple[list[str], list[str]]
    texts: list[str]
    report: dict[str, Any]
    deadline: float = float("inf")
    budget_scale: float = 1.0
    peak: dict[str, Any] | None = None  # the measured matmul peak (matmul_peak)

    @classmethod
    def start(cls, *, out: Path, cpu: bool, tiny: bool, bundle: Path | None, data: str | None) -> Run:
        """Pick the device, find the model and data (the bundle, else the installed model and the data root)."""
        from gpu_bundle import collect_data, read_data

        if not cpu and not torch.cuda.is_available():
            raise RuntimeError(
                "no GPU: torch.cuda.is_available() is False; run with --cpu --tiny for the CPU check"
            )
        out.mkdir(parents=True, exist_ok=True)
        if (
            cpu and tiny
        ):  # tiny matrices gain nothing from threads; on a shared CPU, OpenMP spinning costs 10x
            torch.set_num_threads(1)
        device = torch.device("cpu" if cpu else "cuda")
        bundle = bundle or REPO / "gpu-bundle"
        if (bundle / "pylib").is_dir():  # peft & co. for the LoRA path, used only where the image lacks them
            import sys

            sys.path.append(str(bundle / "pylib"))
        pairs, texts = read_data(bundle / "data") if (bundle / "data").is_dir() else collect_data(data)
        tokenizer = bundle / "minilm" if (bundle / "minilm").is_dir() else installed_minilm()
        tmp = Path(tempfile.mkdtemp(prefix="embforge-gpu-"))
        knobs = TINY if tiny else Knobs()
        minilm = (
            random_bert(tmp / "tiny-minilm", knobs.minilm_random, tokenizer)
            if knobs.minilm_random
            else tokenizer
        )
        dtype = torch.bfloat16 if not cpu or native_bf16() else None
        report = {"meta": meta(device, tiny=tiny, dtype=dtype, minilm=minilm, bundle=bundle), "sections": {}}
        return cls(device, knobs, dtype, tmp, minilm, tokenizer, pairs, texts, report, budget_scale=1.0)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def past_deadline(self) -> bool:
        return time.monotonic() > self.deadline

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def free(self) -> None:
        """Collect garbage and start a new peak-memory window."""
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_mib(self) -> float | None:
        return round(torch.cuda.max_memory_allocated() / 2**20) if self.cuda else None

    def autocast(self, dtype: torch.dtype | None = None) -> torch.autocast:
        dtype = dtype or self.dtype
        return torch.autocast(self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def native_bf16() -> bool:
    from embforge.modeling.precision import cpu_has_native_bf16

    return cpu_has_native_bf16()


def installed_minilm() -> Path:
    from embforge.modeling.resolve import resolve_model_path

    return resolve_model_path("all-MiniLM-L6-v2")


def meta(device: torch.device, *, tiny: bool, dtype: torch.dtype | None, minilm: Path, bundle: Path) -> dict:
    """What ran where: the device, the versions, the precision."""

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    try:
        git = ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]
        commit = subprocess.run(git, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:  # no git on the machine
        commit = ""
    return {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({platform.machine()})",
        "device_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        if device.type == "cuda"
        else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": version("transformers"),
        "sentence-transformers": version("sentence-transformers"),
        "flash-attn": version("flash-attn"),
        "peft": version("peft"),
        "python": platform.python_version(),
        "embforge commit": commit or "unknown (no git here)",
        "mode": "tiny" if tiny else "full",
        "training precision": f"{dtype} autocast" if dtype else "fp32",
        "model": str(minilm),
        "bundle": str(bundle) if bundle.is_dir() else "none",
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def random_bert(folder: Path, dims: dict[str, int], tokenizer: Path) -> Path:
    """A random-initialised ``BertModel`` of ``dims`` with MiniLM's tokenizer, saved as a plain HF folder."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tok), max_position_embeddings=512, **dims)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def dense_params(backbone: nn.Module) -> int:
    """Parameters outside embedding tables and BERT's pooler (which an embedder never runs)."""
    tables = {id(p) for m in backbone.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for n, p in backbone.named_parameters() if id(p) not in tables and "pooler" not in n)


def step_flops(backbone: nn.Module, lengths: list[int]) -> float:
    """Model FLOPs of one training step (forward + backward) over texts of ``lengths`` real tokens."""
    config = backbone.config
    heads = config.num_attention_heads
    d_attn = heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)
    tokens, squares = sum(lengths), sum(n * n for n in lengths)
    return 6.0 * dense_params(backbone) * tokens + 12.0 * config.num_hidden_layers * d_attn * squares


def matmul_peak(run: Run) -> dict[str, Any]:
    """The dense matmul rate of this device in the training dtype (bf16 on a GPU): best of 3 timed rounds."""
    if run.peak is None:
        dtype = run.dtype or torch.float32
        n, reps = (8192, 40) if run.cuda else (512, 5)
        a, b = (torch.randn(n, n, device=run.device, dtype=dtype) for _ in range(2))
        best = 0.0
        for _ in range(4):  # the first round warms up
            run.sync()
            start = time.perf_counter()
            for _ in range(reps):
                a @ b
            run.sync()
            best = max(best, 2 * n**3 * reps / (time.perf_counter() - start))
        run.peak = {"flops": best, "tflops": round(best / 1e12, 3), "dtype": str(dtype), "n": n}
    return run.peak


def measure(run: Run, step: Callable[[int], None], steps: int) -> dict[str, Any]:
    """One warm-up step (0), then ``steps`` timed steps; seconds per step and peak device memory."""
    step(0)
    run.sync()
    start = time.perf_counter()
    for i in range(1, steps + 1):
        step(i)
    run.sync()
    return {"s/step": (time.perf_counter() - start) / steps, "peak MiB": run.peak_mib()}


def pair_rows(run: Run, n: int) -> tuple[list[str], list[str]]:
    """``n`` (query, abstract) pairs, the data's pairs repeated as needed."""
    anchors, positives = run.pairs
    reps = -(-n // len(anchors))
    return (anchors * reps)[:n], (positives * reps)[:n]


@contextmanager
def quiet() -> Iterator[None]:
    """No warnings (emulated bf16 on a CPU, sentence-transformers' plain-folder notice) inside."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
