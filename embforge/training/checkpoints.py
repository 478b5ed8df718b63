"""Atomic training checkpoints: model, losses, optimizer, scheduler, RNG and data position."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

LATEST = "latest"


def atomic_dir(final: Path, write: Any) -> None:
    """Call ``write(tmp_dir)`` and move the finished folder to ``final`` so readers never see a half-written one.

    An existing ``final`` is swapped out only after the new folder is complete.
    """
    final = Path(final)
    tmp = final.with_name(final.name + ".tmp")
    old = final.with_name(final.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": _numpy_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_state() -> dict[str, Any]:
    """numpy's global RNG state with its key as a tensor, so ``torch.load(weights_only=True)`` can read it."""
    state = np.random.get_state(legacy=False)
    state["state"] = {**state["state"], "key": torch.from_numpy(state["state"]["key"].astype(np.int64))}
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    numpy_state = dict(state["numpy"])
    numpy_state["state"] = {
        **numpy_state["state"],
        "key": numpy_state["state"]["key"].numpy().astype(np.uint32),
    }
    np.random.set_state(numpy_state)
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    folder: Path,
    *,
    model: Any,
    losses: torch.nn.ModuleList,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any,
    progress: dict[str, Any],
    keep: int = 1,
) -> Path:
    """Write ``folder/checkpoint-<step>`` atomically, point ``folder/latest`` at it, drop older ones."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"checkpoint-{progress['step']}"

    def write(tmp: Path) -> None:
        model.save(tmp / "model")
        loss_state = {k: v.detach().cpu().contiguous() for k, v in losses.state_dict().items()}
        save_file(loss_state, str(tmp / "losses.safetensors"))
        torch.save(
            {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(),
                "rng": rng_state(),
            },
            tmp / "trainer_state.pt",
        )
        (tmp / "progress.json").write_text(json.dumps(progress, indent=2) + "\n")

    atomic_dir(folder / name, write)
    write_text_atomic(folder / LATEST, name + "\n")
    existing = sorted(
        (p for p in folder.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[1].isdigit()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    for stale in existing[:-keep]:
        shutil.rmtree(stale, ignore_errors=True)
    return folder / name


def latest_checkpoint(folder: Path) -> Path | None:
    pointer = folder / LATEST
    if not pointer.exists():
        return None
    path = folder / pointer.read_text().strip()
    return path if path.is_dir() else None


def load_trainer_state(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]]:
    """Read a checkpoint's trainer state (no unpickling of arbitrary objects), loss weights and progress."""
    state = torch.load(path / "trainer_state.pt", weights_only=True, map_location="cpu")
    losses = load_file(str(path / "losses.safetensors"))
    return state, losses, read_progress(path)


def read_progress(path: Path) -> dict[str, Any]:
    """A checkpoint's ``progress`` dict (step, epoch, data position, ... as the trainer saved it)."""
    return json.loads((Path(path) / "progress.json").read_text())
