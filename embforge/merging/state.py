r"""Merging state dicts of one architecture, weight by weight, with any method of
:mod:`embforge.merging.records`.

For each floating-point weight the method gives per-model coefficients :math:`c_i` and the merge is
:math:`\theta = (1 - \sum_i c_i)\,\theta_{base} + \sum_i c_i\,\theta_i` (without a base: :math:`\sum_i c_i\theta_i`),
exact at the end points (a weight of 0 or 1 gives the input's tensors bit for bit). Integer buffers (position ids)
must be equal and are copied.

``layer_scaling=alpha`` (methods with a base) scales each tensor's task-vector coefficients by its depth, as LiNeS
does (Wang et al., 2025): :math:`\alpha + (1-\alpha)\,d` with :math:`d = 0` for the embeddings,
:math:`(\ell+1)/L` for layer :math:`\ell` of :math:`L` and 1 for what follows the last layer (pooler, final norm,
Dense, heads). Shallow layers, which hold the general features, stay near the base; the top layers take the full
task vector.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from embforge.merging.methods import TensorInputs
from embforge.merging.records import MergeMethod, merge_method

_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def layer_depths(keys: Sequence[str]) -> dict[str, float]:
    """Each weight's depth in [0, 1]: embeddings 0, layer ``l`` of ``L`` ``(l+1)/L``, what follows the layers 1."""
    index = {k: int(m.group(1)) for k in keys if (m := _LAYER.search(k))}
    if not index:
        raise ValueError("layer scaling: no numbered layers (`layer.N.` / `layers.N.`) in the weights' names")
    layers = max(index.values()) + 1
    return {k: (index[k] + 1) / layers if k in index else 0.0 if "embed" in k else 1.0 for k in keys}


def layer_scales(keys: Sequence[str], alpha: float) -> dict[str, float]:
    """LiNeS: each weight's share of its task vector, ``alpha + (1 - alpha) * depth`` (:func:`layer_depths`)."""
    return {k: alpha + (1 - alpha) * d for k, d in layer_depths(keys).items()}


def check_recipe(
    record: MergeMethod,
    n_models: int,
    weights: Sequence[float] | None,
    *,
    has_base: bool,
    density: float = 1.0,
    layer_scaling: float | None = None,
    normalize: bool = False,
) -> list[float]:
    """The weights to merge with (equal ones when ``None``), or a ``ValueError`` saying what the method needs."""
    name = record.name
    if normalize and not record.elects_signs:
        raise ValueError(f"normalize divides by the agreeing models' weights: ties and dare_ties, not {name}")
    most = record.max_models
    count = f"exactly {most}" if most == record.min_models else f"{record.min_models} or more"
    if n_models < record.min_models or (most is not None and n_models > most):
        raise ValueError(f"{name} merging needs {count} models, got {n_models}")
    if record.base and not has_base:
        raise ValueError(f"{name} merging needs {count} fine-tuned models and their base (--base)")
    if not record.base and has_base:
        raise ValueError(
            f"{name} merging takes no base model; use task_arithmetic, ties, dare_linear, dare_ties or "
            "model_stock with --base"
        )
    if record.weights == "none":
        if weights is not None:
            raise ValueError(
                f"{name} merging derives its ratio from the task vectors' angle; give no weights"
            )
        weights = [1.0 / n_models] * n_models
    weights = list(weights) if weights is not None else [1.0 / n_models] * n_models
    if len(weights) != n_models:
        raise ValueError(f"{n_models} models but {len(weights)} weights")
    if record.weights == "sum_to_one" and abs(sum(weights) - 1.0) > 1e-6:
        raise ValueError(f"{name} merging needs weights that sum to 1, got {weights} (sum {sum(weights):g})")
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density}")
    if layer_scaling is not None and (not has_base or not 0 <= layer_scaling <= 1):
        raise ValueError(f"layer scaling needs a base model and an alpha in [0, 1], got {layer_scaling}")
    return weights


def tied_names(state: Mapping[str, Tensor]) -> dict[str, str]:
    """``name -> first name`` of the weights that share their storage with an earlier one (tied weights, e.g. a
    masked-LM decoder and the word embeddings)."""
    first: dict[tuple[int, tuple[int, ...], tuple[int, ...]], str] = {}
    tied = {}
    for key, tensor in state.items():
        if not tensor.numel():
            continue
        place = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
        if place in first:
            tied[key] = first[place]
        else:
            first[place] = key
    return tied


def share_clones(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A detached copy of ``state`` in which tied weights stay one tensor (:func:`tied_names`)."""
    tied = tied_names(state)
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        out[key] = out[tied[key]] if key in tied else tensor.detach().clone()
    return out


def weight_generator(seed: int, key: str, device: torch.device) -> torch.Generator:
    """The random generator of one weight: seeded from ``seed`` and the weight's name, so a weight's draws do not
    depend on which other weights the models have or their order."""
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) % 2**63)


def merge_state_dicts(
    states: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float] | None = None,
    *,
    method: str = "linear",
    base: Mapping[str, Tensor] | None = None,
    density: float = 0.2,
    layer_scaling: float | None = None,
    seed: int = 0,
    normalize: bool = False,
) -> dict[str, Tensor]:
    """Merge state dicts of one architecture (see :mod:`embforge.merging.methods` for the formulas).

    Args:
        states: The models' state dicts (same keys and shapes).
        weights: One weight per model (``None``: equal weights; ``model_stock`` takes none).
        method: A name of :data:`embforge.merging.records.METHODS`.
        base: The base model's state dict (the methods on task vectors need it; ``linear``/``slerp`` take none).
        density: ``ties``: fraction of each task vector's entries kept (by magnitude); ``dare_*``: the probability
            of keeping an entry.
        layer_scaling: ``alpha`` of the depth scaling of the task vectors (``None``: off; needs a base).
        seed: ``dare_*``: the seed of the random drops (with each weight's name).
        normalize: ``ties``/``dare_ties``: average the agreeing task vectors (divide by their weights' sum)
            instead of summing them (mergekit's ``normalize``).
    """
    record = merge_method(method)
    weights = check_recipe(
        record,
        len(states),
        weights,
        has_base=base is not None,
        density=density,
        layer_scaling=layer_scaling,
        normalize=normalize,
    )
    reference = base if base is not None else states[0]
    scale = layer_scales(list(reference), layer_scaling) if layer_scaling is not None else {}
    for i, state in enumerate(states):
        if state.keys() != reference.keys():
            missing = sorted(set(reference) ^ set(state))[:3]
            raise ValueError(f"model {i + 1} has different weights than the others (e.g. {missing})")
    merged: dict[str, Tensor] = {}
    tied = tied_names(reference)
    for key, ref in reference.items():
        if key in tied:  # one tensor under two names (a tied MLM decoder): merged once, the same draws
            merged[key] = merged[tied[key]]
            continue
        tensors = [state[key] for state in states]
        for i, t in enumerate(tensors):
            if t.shape != ref.shape:
                raise ValueError(
                    f"{key}: model {i + 1} has shape {tuple(t.shape)}, expected {tuple(ref.shape)}"
                )
        if not ref.is_floating_point():  # integer buffers (position ids): must be equal, copied
            if any(not torch.equal(t, ref) for t in tensors):
                raise ValueError(f"{key}: the integer buffer differs between models; they cannot be merged")
            merged[key] = ref.clone()
            continue
        inputs = TensorInputs(
            [t.float() for t in tensors],
            weights,
            None if base is None else base[key].float(),
            density,
            weight_generator(seed, key, ref.device) if record.seeded else None,
            normalize,
        )
        coefficients = record.function()(inputs)
        if layer_scaling is not None:
            coefficients = [c * scale[key] for c in coefficients]
        out = sum(
            (c * t for c, t in zip(coefficients, inputs.tensors)), torch.zeros_like(ref, dtype=torch.float32)
        )
        if inputs.base is not None:
            rest = 1.0 - sum(coefficients, torch.zeros_like(ref, dtype=torch.float32))
            out = rest * inputs.base + out
        merged[key] = out.to(ref.dtype)
    return merged
