"""The random number generators' state (torch, CUDA, numpy, Python), saved with checkpoints and restored on resume."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, object]:
    state: dict[str, object] = {
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
