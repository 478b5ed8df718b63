"""Mixed precision: which autocast dtype a setting means on a device, and an inference context for the CLI.

Settings (``TrainConfig.amp`` and the ``--amp`` flag of the inference verbs): ``no`` (full fp32), ``bf16``,
``fp16``, ``auto`` (bf16 on CUDA where supported else fp16; bf16 on CPUs with native bf16 math — AVX512-BF16 or
AMX, e.g. AMD Zen 4, Intel Sapphire Rapids — else fp32).

On such a CPU, bf16 autocast roughly halves the time of encoding (matrix products in bf16, layer norms and softmax
kept in fp32): measured 2x on all-MiniLM-L6-v2 over SciFact abstracts with embeddings at cosine >= 0.99997 to
fp32 (``benchmarks/README.md``). Inference defaults to ``no`` so that evaluation figures are full precision unless
asked otherwise.

Example:
    >>> import torch
    >>> with inference_autocast("no"):
    ...     torch.is_autocast_enabled("cpu")
    False
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator

import torch

AMP_SETTINGS = ("auto", "no", "fp16", "bf16")


def check_amp(setting: str) -> str:
    """``setting`` if it is one of :data:`AMP_SETTINGS`, else a ``ValueError`` naming them."""
    if setting not in AMP_SETTINGS:
        raise ValueError(f"amp must be one of {', '.join(AMP_SETTINGS)}, got {setting!r}")
    return setting


def amp_dtype(setting: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``setting`` on ``device``, or None for full precision."""
    check_amp(setting)
    if setting == "no":
        return None
    if setting == "fp16":
        return torch.float16
    if setting == "bf16":
        if device.type == "cpu" and not cpu_has_native_bf16():
            warnings.warn(
                "bf16 on this CPU is emulated (no AVX512-BF16 / AMX): it runs 2-10x SLOWER than fp32 here "
                "(all-MiniLM-L6-v2 encode ~2x, all-mpnet-base-v2 ~10x). "
                "Use --amp no (or auto, which picks fp32 on this CPU)",
                RuntimeWarning,
                stacklevel=2,
            )
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu":
        return torch.bfloat16 if cpu_has_native_bf16() else None
    return None


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """Whether this CPU does bf16 matrix products natively (AVX512-BF16 or AMX), where bf16 pays off."""
    try:
        native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        native = False
    capability = torch.backends.cpu.get_cpu_capability()
    return native and ("AMX" in capability or "AVX512" in capability)


@contextlib.contextmanager
def inference_autocast(setting: str) -> Iterator[None]:
    """Autocast every forward inside (CPU, and CUDA when present) as ``setting`` says; ``no`` changes nothing."""
    with contextlib.ExitStack() as stack:
        for device_type in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
            dtype = amp_dtype(setting, torch.device(device_type))
            if dtype is not None:
                stack.enter_context(torch.autocast(device_type, dtype=dtype))
        yield


def autocast_tag() -> str:
    """The autocast state in force, e.g. ``"cpu:bfloat16"`` (``"fp32"`` when none): cached embeddings key on it."""
    active = []
    for device_type in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device_type):
            active.append(
                f"{device_type}:{str(torch.get_autocast_dtype(device_type)).removeprefix('torch.')}"
            )
    return ",".join(active) or "fp32"
