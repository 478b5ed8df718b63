"""Whether a checkpoint can be trusted before anything of it is loaded.

* Every file against ``manifest.json`` (size, then SHA-256; :func:`verify_checkpoint`): a truncated file, a flipped
  bit or a broken ``progress.json`` is a :class:`CheckpointError` naming the file.
* Every file readable (:func:`readable`), for a checkpoint written before manifests.
* Every weight finite and in range (:func:`check_finite`): a step that overflowed before the loss guard fired
  writes NaN or huge weights, checksums and all.

:mod:`embforge.training.checkpoints` writes the manifests and calls these on every resume.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import safe_open

MANIFEST = "manifest.json"
T = TypeVar("T")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the file and what to do."""


class ResumeWarning(UserWarning):
    """``--resume`` found nothing to resume, or a checkpoint it cannot verify (written before manifests)."""


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def sha256(path: Path) -> str:
    """The SHA-256 of a file, read a megabyte at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checkpoint(path: Path) -> None:
    """Check every file of a checkpoint against its manifest (size, then SHA-256).

    A checkpoint without a manifest (written by an older embforge) gets a :class:`ResumeWarning` and only a
    readability check of its ``.safetensors`` files: a flipped bit there cannot be detected.

    Raises:
        CheckpointError: naming the first file that is missing, of the wrong size or with other contents.
    """
    path = Path(path)
    manifest_file = path / MANIFEST
    if not manifest_file.exists():
        warnings.warn(
            f"{path}: no manifest (written by an older embforge): its files cannot be verified against checksums",
            ResumeWarning,
            stacklevel=2,
        )
        for tensors in sorted(path.rglob("*.safetensors")):
            readable(tensors, lambda f: safe_open(str(f), framework="pt").keys())
        return
    try:
        manifest = read_json(manifest_file)
        files = manifest["files"]
        entries = [(str(k), int(v["size"]), str(v["sha256"])) for k, v in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(
            f"{manifest_file}: unreadable ({type(err).__name__}: {err}); the checkpoint cannot be verified — "
            "train without --resume, or point latest at another checkpoint"
        ) from None
    advice = "this checkpoint cannot be resumed from; train without --resume, or point latest at another checkpoint"
    for name, size, digest in entries:
        file = path / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise CheckpointError(f"{manifest_file}: lists {name!r}, a path outside the checkpoint")
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (listed in {MANIFEST}); {advice}")
        actual = file.stat().st_size
        if actual != size:
            raise CheckpointError(
                f"{file}: {actual} bytes, but the checkpoint wrote {size} (truncated or overwritten); {advice}"
            )
        if sha256(file) != digest:
            raise CheckpointError(
                f"{file}: its contents changed after the checkpoint was written (SHA-256 differs from "
                f"{MANIFEST}: corrupted on disk or in a copy); {advice}"
            )


def readable(file: Path, read: Callable[[Path], T]) -> T:
    """``read(file)``, with any failure to decode it turned into a :class:`CheckpointError` naming the file."""
    if not file.is_file():
        raise CheckpointError(f"{file}: missing; this checkpoint cannot be resumed from")
    try:
        return read(file)
    except Exception as err:  # torch/safetensors/json raise many kinds for a damaged file
        raise CheckpointError(
            f"{file}: cannot be read ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
            "this checkpoint cannot be resumed from"
        ) from err


# a weight this large overflows float32 in its first matrix product: only an overflowing step writes one
LARGEST_WEIGHT = 1e19


def check_finite(
    path: Path, *, state: dict[str, object], losses: dict[str, torch.Tensor], advice: str
) -> None:
    """Refuse a checkpoint holding NaN, infinite or overflowing weights, or a non-finite optimiser state; the
    error ends with ``advice`` (which earlier checkpoint to resume from instead).

    A manifest cannot catch these: a step that overflowed before the loss guard fired writes them, checksums and
    all. Resumed, such a run would die steps later with a misleading "lower the learning rate".
    """
    for file in sorted((path / "model").rglob("*.safetensors")):
        with safe_open(str(file), framework="pt") as tensors:
            for name in tensors.keys():  # noqa: SIM118 (safe_open is not a dict)
                _finite(path, file, name, tensors.get_tensor(name), largest=LARGEST_WEIGHT, advice=advice)
    for name, tensor in losses.items():
        _finite(path, path / "losses.safetensors", name, tensor, largest=LARGEST_WEIGHT, advice=advice)
    for name, tensor in _tensors(state.get("optimizer"), "optimizer"):
        _finite(path, path / "trainer_state.pt", name, tensor, largest=None, advice=advice)


def _tensors(value: object, name: str) -> list[tuple[str, torch.Tensor]]:
    """Every floating-point tensor inside nested dicts and lists, with its path (``optimizer.state.0.exp_avg``)."""
    if isinstance(value, torch.Tensor):
        return [(name, value)] if value.is_floating_point() else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    return [found for key, item in items for found in _tensors(item, f"{name}.{key}")]


def _finite(
    checkpoint: Path, file: Path, name: str, tensor: torch.Tensor, *, largest: float | None, advice: str
) -> None:
    values = tensor.float()
    bad = ~torch.isfinite(values)
    what = "non-finite values (NaN or infinity)"
    if largest is not None and not bad.any():
        bad = values.abs() > largest
        what = f"overflowing values (beyond {largest:g})"
    if not bad.any():
        return
    example = values[bad].flatten()[0].item()
    raise CheckpointError(
        f"{file}: {name} holds {int(bad.sum())} {what}, e.g. {example}: {checkpoint.name} was saved after a "
        f"step that overflowed and cannot be resumed from; {advice}"
    )
