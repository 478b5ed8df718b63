"""Merge methods as registered records: what each needs (a base, how many models, weights, density, a seed) and
its coefficient function (``"module:attribute"``, imported on first use so the CLI's parser stays torch-free).

A new method is one more record and one function ``TensorInputs -> coefficients``
(:mod:`embforge.merging.methods`); the merge loop (:mod:`embforge.merging.state`), ``Merger`` and the CLI ask the
record and never compare method names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from embforge.kinds import load_named

if TYPE_CHECKING:
    from embforge.merging.methods import Coefficients, TensorInputs

_M = "embforge.merging.methods:"


@dataclass(frozen=True)
class MergeMethod:
    """What one merge method needs and how it computes coefficients.

    Attributes:
        name: ``--method`` value.
        coefficients: ``"module:attribute"`` of its ``TensorInputs -> one coefficient per model`` function
            (scalars or element-wise tensors).
        summary: One line for ``--help``.
        base: Whether it works on task vectors (needs ``--base``); ``False``: it takes none.
        min_models: Fewest models (besides the base).
        max_models: Most models (``None``: no limit).
        weights: ``sum_to_one`` (an interpolation between the models), ``free`` (a scale per task vector) or
            ``none`` (the method derives its own ratio).
        density: Whether ``density`` applies.
        seeded: Whether it draws random numbers (``seed``).
        elects_signs: Whether it elects a sign per entry (TIES), so ``normalize`` applies.
    """

    name: str
    coefficients: str
    summary: str
    base: bool = True
    min_models: int = 1
    max_models: int | None = None
    weights: Literal["sum_to_one", "free", "none"] = "free"
    density: bool = False
    seeded: bool = False
    elects_signs: bool = False

    def function(self) -> Callable[[TensorInputs], Coefficients]:
        """The coefficient function (imported now)."""
        function: Callable[[TensorInputs], Coefficients] = load_named(self.coefficients)
        return function


METHODS: dict[str, MergeMethod] = {
    m.name: m
    for m in (
        MergeMethod(
            "linear",
            _M + "weights_coefficients",
            "sum of w_i * model_i, weights summing to 1 (equal weights: checkpoint averaging)",
            base=False,
            min_models=2,
            weights="sum_to_one",
        ),
        MergeMethod(
            "slerp",
            _M + "slerp_merge",
            "spherical interpolation between two models at t = the 2nd weight, per tensor (linear when nearly "
            "colinear)",
            base=False,
            min_models=2,
            max_models=2,
            weights="sum_to_one",
        ),
        MergeMethod("task_arithmetic", _M + "weights_coefficients", "base + sum w_i (model_i - base)"),
        MergeMethod(
            "ties",
            _M + "ties_coefficients",
            "task vectors trimmed to their --density largest entries, a sign elected per entry",
            density=True,
            elects_signs=True,
        ),
        MergeMethod(
            "dare_linear",
            _M + "dare_linear_coefficients",
            "task vectors' entries kept with probability --density and rescaled by 1/density (seeded)",
            density=True,
            seeded=True,
        ),
        MergeMethod(
            "dare_ties",
            _M + "dare_ties_coefficients",
            "DARE's drop-and-rescale, then TIES's sign election",
            density=True,
            seeded=True,
            elects_signs=True,
        ),
        MergeMethod(
            "model_stock",
            _M + "model_stock_coefficients",
            "base + t (mean of the models - base), t from the angle between the task vectors (2+ models, "
            "no weights)",
            min_models=2,
            weights="none",
        ),
    )
}


def merge_method(name: str) -> MergeMethod:
    """The record of method ``name``; a ``ValueError`` listing the methods otherwise."""
    if name not in METHODS:
        raise ValueError(f"unknown merge method {name!r}; choose one of {', '.join(METHODS)}")
    return METHODS[name]
