r"""The merge methods' coefficient functions: each turns one weight of every model into per-model coefficients.

A method sees one weight tensor of each model (and of the base) and returns a coefficient :math:`c_i` per model,
a scalar or an element-wise tensor. :func:`embforge.merging.state.merge_state_dicts` then writes
:math:`\theta = (1 - \sum_i c_i)\,\theta_{base} + \sum_i c_i\,\theta_i` (without a base: :math:`\sum_i c_i
\theta_i`), which is exact at the end points. Definitions follow mergekit's (arcee-ai/mergekit 0.1.5,
``merge_methods/``); the tests compare with it on tensors.

====================  ================================================================================
method                coefficients
====================  ================================================================================
``linear``            :math:`c_i = w_i`, :math:`\sum_i w_i = 1`, no base
``slerp``             two models, :math:`t = w_2`: with :math:`\cos\Omega` the cosine of the flattened
                      tensors, :math:`c_1 = \sin((1-t)\Omega)/\sin\Omega`, :math:`c_2 = \sin(t\Omega)/\sin\Omega`;
                      linear when :math:`|\cos\Omega| > 0.9995` (nearly colinear), as mergekit does
``task_arithmetic``   :math:`c_i = w_i` on the task vectors :math:`\tau_i = \theta_i - \theta_{base}`
``ties``              :math:`\tau_i` trimmed to its ``density`` largest entries, a sign elected per entry,
                      :math:`\gamma = \mathrm{sign}(\sum_i w_i\hat\tau_i)` (+ on a tie), only agreeing entries
                      kept: :math:`c_i = w_i [\mathrm{sign}(w_i\hat\tau_i) = \gamma]` (mergekit's ``ties``
                      with ``normalize: false``); ``normalize``: each entry divided by
                      :math:`\sum_i c_i`, the agreeing models' weights (mergekit's default)
``dare_linear``       DARE (Yu et al., 2024): each entry of :math:`\tau_i` kept with probability ``density``
                      and rescaled by 1/``density``: :math:`c_i = w_i m_i / p`, :math:`m_i \sim
                      \mathrm{Bernoulli}(p)` drawn from ``seed`` and the weight's name (deterministic)
``dare_ties``         DARE's drop-and-rescale, then TIES's sign election on :math:`w_i\tau_i m_i/p`
``model_stock``       Model Stock (Jang et al., 2024): with :math:`\cos\theta` the mean pairwise cosine of
                      the :math:`N \ge 2` task vectors (flattened), :math:`t = N\cos\theta/(1+(N-1)\cos\theta)`
                      and :math:`c_i = t/N`: :math:`\theta = t\,\bar\theta + (1-t)\,\theta_{base}`; no weights
====================  ================================================================================

DARE's expectation is task arithmetic (:math:`E[m_i/p] = 1`). With ``density`` 1, ``dare_linear`` is
``task_arithmetic`` and ``dare_ties``/``ties`` agree. mergekit's DARE matches the L1 norm of the dropped task vector
to the original's (``rescale``); this module rescales by 1/``density``, the paper's definition (the tests compare
with mergekit given ``rescale: false`` and the weights divided by ``density``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# mergekit's slerp: cosines above this are treated as colinear (linear interpolation instead)
DOT_THRESHOLD = 0.9995
Coefficients = list[Tensor | float]


@dataclass(frozen=True)
class TensorInputs:
    """One weight of every model (float32), what a method's coefficients are computed from.

    Attributes:
        tensors: The models' tensors, in the models' order.
        weights: One weight per model (equal weights for a method that takes none).
        base: The base model's tensor (``None`` for a method without a base).
        density: The fraction of task-vector entries kept (``ties``, ``dare_*``).
        generator: The seeded random generator of this weight (``dare_*``; ``None`` for the others).
        normalize: ``ties``/``dare_ties``: divide each entry by the sum of the coefficients of the models that
            agree on it (mergekit's ``normalize: true``), so the kept task vectors are averaged, not summed.
    """

    tensors: Sequence[Tensor]
    weights: Sequence[float]
    base: Tensor | None = None
    density: float = 1.0
    generator: torch.Generator | None = None
    normalize: bool = False

    def task_vectors(self) -> list[Tensor]:
        """:math:`\\tau_i = \\theta_i - \\theta_{base}`."""
        assert self.base is not None
        return [t - self.base for t in self.tensors]


def trim_top(tensor: Tensor, density: float) -> Tensor:
    """A 0/1 mask of the ``density`` fraction (rounded down, at least one) of entries of largest magnitude, as
    mergekit's ``magnitude`` sparsification keeps."""
    if density >= 1.0:
        return torch.ones_like(tensor, dtype=torch.bool)
    flat = tensor.reshape(-1).abs()
    keep = max(1, int(density * flat.numel())) if flat.numel() else 0
    mask = torch.zeros(flat.numel(), dtype=torch.bool, device=tensor.device)
    if keep:
        mask[torch.topk(flat, keep, sorted=False).indices] = True
    return mask.reshape(tensor.shape)


def dare_keep(tensor: Tensor, density: float, generator: torch.Generator | None) -> Tensor:
    """DARE's random 0/1 mask: each entry kept with probability ``density`` (all kept at density 1)."""
    if density >= 1.0:
        return torch.ones_like(tensor)
    return torch.bernoulli(torch.full_like(tensor, density), generator=generator)


def elected_agreement(deltas: Sequence[Tensor]) -> list[Tensor]:
    """TIES's sign election over weighted task vectors: per entry, whether each agrees with the sign of their sum
    (+ when the sum is 0; an entry of 0 agrees with nothing)."""
    total = torch.stack(list(deltas)).sum(dim=0)
    elected = torch.where(total >= 0, 1.0, -1.0)
    return [torch.sign(d) == elected for d in deltas]


def weights_coefficients(x: TensorInputs) -> Coefficients:
    return [float(w) for w in x.weights]


def normalized(coefficients: Coefficients, normalize: bool) -> Coefficients:
    """With ``normalize``, each entry's coefficients divided by their sum (where it is not ~0), as mergekit's
    ``normalize`` divides the agreeing task vectors by their weights' sum."""
    if not normalize:
        return coefficients
    total = torch.as_tensor(sum(coefficients, torch.zeros(())))
    total = torch.where(total.abs() < 1e-8, torch.ones_like(total), total)
    return [c / total for c in coefficients]


def ties_coefficients(x: TensorInputs) -> Coefficients:
    taus = x.task_vectors()
    kept = [trim_top(tau, x.density) for tau in taus]
    agree = elected_agreement([w * tau * k for w, tau, k in zip(x.weights, taus, kept)])
    return normalized([w * (k & a).float() for w, k, a in zip(x.weights, kept, agree)], x.normalize)


def _dare_masks(x: TensorInputs) -> list[Tensor]:
    return [dare_keep(t, x.density, x.generator) / x.density for t in x.tensors]


def dare_linear_coefficients(x: TensorInputs) -> Coefficients:
    return [w * m for w, m in zip(x.weights, _dare_masks(x))]


def dare_ties_coefficients(x: TensorInputs) -> Coefficients:
    masks = _dare_masks(x)
    agree = elected_agreement([w * tau * m for w, tau, m in zip(x.weights, x.task_vectors(), masks)])
    return normalized([w * m * a for w, m, a in zip(x.weights, masks, agree)], x.normalize)


def slerp_coefficients(a: Tensor, b: Tensor, t: float, *, eps: float = 1e-8) -> tuple[float, float]:
    """The two coefficients of spherical interpolation from ``a`` (t=0) to ``b`` (t=1), over the flattened
    tensors; ``(1-t, t)`` when they are nearly colinear (``|cos| > DOT_THRESHOLD``) or empty."""
    a, b = a.reshape(-1).double(), b.reshape(-1).double()
    if not a.numel():
        return 1.0 - t, t
    norm_a, norm_b = float(a.norm()), float(b.norm())
    dot = float(((a / (norm_a if norm_a > eps else 1.0)) * (b / (norm_b if norm_b > eps else 1.0))).sum())
    dot = min(1.0, max(-1.0, dot))
    if abs(dot) > DOT_THRESHOLD:
        return 1.0 - t, t
    omega = math.acos(dot)
    return math.sin((1 - t) * omega) / math.sin(omega), math.sin(t * omega) / math.sin(omega)


def slerp_merge(x: TensorInputs) -> Coefficients:
    return list(slerp_coefficients(x.tensors[0], x.tensors[1], float(x.weights[1])))


def model_stock_ratio(tensors: Sequence[Tensor], base: Tensor) -> float:
    """Model Stock's :math:`t = N\\cos\\theta / (1 + (N-1)\\cos\\theta)`, :math:`\\cos\\theta` the mean cosine
    between pairs of task vectors (flattened); 0 (the base) where the denominator vanishes."""
    offsets = [(t - base).reshape(-1).double() for t in tensors]
    cosines = [
        float((u @ v) / max(float(u.norm() * v.norm()), 1e-6))
        for i, u in enumerate(offsets)
        for v in offsets[i + 1 :]
    ]
    cos = sum(min(1.0, max(-1.0, c)) for c in cosines) / len(cosines)
    n = len(offsets)
    denominator = 1 + (n - 1) * cos
    return 0.0 if abs(denominator) < 1e-6 else n * cos / denominator


def model_stock_coefficients(x: TensorInputs) -> Coefficients:
    assert x.base is not None
    return [model_stock_ratio(x.tensors, x.base) / len(x.tensors)] * len(x.tensors)
