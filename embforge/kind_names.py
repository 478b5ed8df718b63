"""The names of the model kinds: the ground-floor enum every floor may use.

This module holds only :class:`ModelKind` (and imports nothing of embforge), so the contracts
(:mod:`embforge.protocols`), the model classes that declare their kind and the registry of what each kind needs
(:mod:`embforge.kinds`) all stand above it: no circle runs through a kind's name.
"""

from __future__ import annotations

from enum import Enum


class ModelKind(str, Enum):
    """The kinds of model embforge trains, evaluates, saves and serves (their records: :mod:`embforge.kinds`)."""

    DENSE = "dense"
    CROSS = "cross"
    MULTIVECTOR = "multivector"
    SPARSE = "sparse"
    STATIC = "static"
