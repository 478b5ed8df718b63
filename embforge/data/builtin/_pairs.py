"""Helpers shared by the data set loaders: checking a split name, locating a folder and carving a deterministic
dev split."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from embforge.data.paths import data_root
from embforge.data.tables import Dataset


def check_choice(value: str, choices: Sequence[str], *, what: str) -> str:
    """``value`` when it is one of ``choices``, else a ``ValueError`` naming ``what`` (e.g. ``"STS-B split"``)."""
    if value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(choices)}, got {value!r}")
    return value


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
