"""Helpers shared by the pair data set loaders: locating a folder and carving a deterministic dev split."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from embforge.data.paths import data_root
from embforge.data.tables import Dataset


def dataset_dir(name: str, root: str | os.PathLike | None, *, expect: str) -> Path:
    """``<data root>/<name>`` (or ``root``), checked to contain ``expect``."""
    path = Path(root) if root is not None else data_root() / name
    if not (path / expect).exists():
        raise FileNotFoundError(
            f"{name} not found in {path}: expected {expect} (set EMBFORGE_DATA to the folder holding '{name}')"
        )
    return path


def hash_split(data: Dataset, *, dev_every: int = 10) -> tuple[Dataset, Dataset]:
    """Split rows into (train, dev) by ``md5(sentence1 + sentence2) % dev_every == 0`` -> dev.

    Deterministic and independent of file order; identical pairs always land on the same side.
    """
    texts = data.texts()
    dev = [
        i
        for i in range(len(data))
        if int(hashlib.md5("\t".join(col[i] for col in texts).encode()).hexdigest(), 16) % dev_every == 0
    ]
    keep = set(dev)
    return data.subset([i for i in range(len(data)) if i not in keep]), data.subset(dev)
