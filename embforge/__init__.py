"""embforge: fine-tune, evaluate, export and serve text embedding models.

Imports are lazy: ``import embforge`` loads no model and no heavy optional dependency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from embforge._version import __version__

_LAZY = {
    "Encoder": "embforge.encoder",
    "CrossEncoder": "embforge.cross_encoder",
    "TrainConfig": "embforge.training.config",
    "Task": "embforge.training.tasks",
    "train": "embforge.training.loop",
    "read_table": "embforge.data.tables",
    "get_loss": "embforge.losses",
}

if TYPE_CHECKING:
    from embforge.data.tables import read_table
    from embforge.encoder import Encoder
    from embforge.losses import get_loss
    from embforge.training.config import TrainConfig
    from embforge.training.loop import train
    from embforge.training.tasks import Task

__all__ = ["Encoder", "Task", "TrainConfig", "__version__", "get_loss", "read_table", "train"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'embforge' has no attribute {name!r}")
