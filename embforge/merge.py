r"""Model merging: linear interpolation / checkpoint averaging, task arithmetic and TIES, on same-architecture models.

Every method computes, for each weight tensor, per-model coefficients :math:`c_i` (scalars or element-wise masks)
and writes :math:`\theta = c_0\,\theta_{base} + \sum_i c_i\,\theta_i` with :math:`c_0 = 1 - \sum_i c_i`, which
is exact at the end points (weight 0 or 1 gives the input's tensors bit for bit):

===================  ======================================================================================
method               merged weights
===================  ======================================================================================
``linear``           :math:`\sum_i w_i \theta_i` with :math:`\sum_i w_i = 1` (equal weights: checkpoint
                     averaging); no base
``task_arithmetic``  :math:`\theta_{base} + \sum_i w_i (\theta_i - \theta_{base})` (Ilharco et al., 2023)
``ties``             task vectors :math:`\tau_i = \theta_i - \theta_{base}` trimmed to their top ``density``
                     fraction by magnitude (per tensor), a sign elected per entry
                     :math:`\gamma = \mathrm{sign}(\sum_i w_i \hat\tau_i)`, and only agreeing entries added:
                     :math:`\theta_{base} + \sum_i w_i \hat\tau_i [\mathrm{sign}(\hat\tau_i) = \gamma]`
                     (Yadav et al., 2023, with the per-model weights as the scaling)
===================  ======================================================================================

With one fine-tuned model and its base, ``task_arithmetic`` at weight ``w`` is ``linear`` with weights
``(1-w, w)``; ``ties`` differs by trimming the small entries of the task vector.

``layer_scaling=alpha`` (``--layer-scaling``, methods with a base) scales each tensor's task-vector coefficients by
its depth, as LiNeS does (Wang et al., 2025): :math:`\alpha + (1-\alpha)\,d` with :math:`d = 0` for the
embeddings, :math:`(\ell+1)/L` for layer :math:`\ell` of :math:`L` and 1 for what follows the last layer (pooler,
final norm, Dense). Shallow layers, which hold the general features, stay near the base (what fine-tuning on
one task should not overwrite), the top layers take the full task vector.

What decides the output besides the weights — pooling, normalisation, the Dense projection's shape,
``max_seq_length``, prompts, similarity function and Matryoshka settings (``config_sentence_transformers.json``
keys) — is carried over and must agree across the inputs (an error names the first disagreement).

Example:
    >>> merged = merge_models(["runs/sts", "runs/nli"], [0.5, 0.5])  # doctest: +SKIP
    >>> merged.save("runs/merged")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from embforge.encoder import Encoder
from embforge.kinds import folder_kind, kind_record
from embforge.modeling.resolve import resolve_model_path
from embforge.modeling.st_folder import ST_CONFIG_FILE, read_st_config, write_json

if TYPE_CHECKING:
    from embforge.protocols import ModelPath

METHODS = ("linear", "task_arithmetic", "ties")
# keys of config_sentence_transformers.json that change what a model outputs (carried over, must agree)
_ST_KEYS = ("prompts", "default_prompt_name", "similarity_fn_name", "truncate_dim", "matryoshka_dims")


def model_settings(model: Encoder, folder: str | os.PathLike | None = None) -> dict[str, object]:
    """What must agree between merged models, besides the weights' names and shapes."""
    settings: dict[str, object] = {
        "pooling": model.pooling,
        "normalize": model.normalize,
        "max_seq_length": model.max_seq_length,
        "dense": None if model.dense is None else (model.dense.in_features, model.dense.out_features),
        "architecture": type(model.backbone).__name__,
    }
    extra = _st_config(folder)
    settings.update({key: extra.get(key) for key in _ST_KEYS})
    settings["similarity_fn_name"] = (
        extra.get("similarity_fn_name") or "cosine"
    )  # sentence-transformers' default
    settings["prompts"] = extra.get("prompts") or model.prompts or {}
    settings["default_prompt_name"] = extra.get("default_prompt_name", model.default_prompt_name)
    return settings


def _st_config(folder: ModelPath | None) -> dict[str, Any]:
    return {} if folder is None else read_st_config(resolve_model_path(folder))


def check_compatible(settings: Sequence[dict[str, object]], names: Sequence[str]) -> dict[str, object]:
    """The common settings, or a ``ValueError`` naming the first setting on which two models disagree."""
    first = settings[0]
    for name, other in zip(names[1:], settings[1:]):
        for key, value in first.items():
            if other.get(key) != value:
                raise ValueError(
                    f"cannot merge: {key} differs ({names[0]}: {value!r}, {name}: {other.get(key)!r}); "
                    "merged models must share pooling, normalisation, projection, max_seq_length, prompts "
                    "and Matryoshka settings"
                )
    return first


def trim_top(tensor: Tensor, density: float) -> Tensor:
    """A 0/1 mask of the ``density`` fraction of entries of largest magnitude (ties broken by position)."""
    if density >= 1.0:
        return torch.ones_like(tensor, dtype=torch.bool)
    flat = tensor.reshape(-1).abs()
    keep = max(1, round(density * flat.numel())) if flat.numel() else 0
    mask = torch.zeros(flat.numel(), dtype=torch.bool, device=tensor.device)
    if keep:
        mask[torch.topk(flat, keep, sorted=False).indices] = True
    return mask.reshape(tensor.shape)


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


def merge_state_dicts(
    states: Sequence[dict[str, Tensor]],
    weights: Sequence[float],
    *,
    method: str = "linear",
    base: dict[str, Tensor] | None = None,
    density: float = 0.2,
    layer_scaling: float | None = None,
) -> dict[str, Tensor]:
    """Merge state dicts of one architecture (see the module docstring for the formulas).

    Args:
        states: The models' state dicts (same keys and shapes).
        weights: One weight per model.
        method: ``linear``, ``task_arithmetic`` or ``ties``.
        base: The base model's state dict (needed by ``task_arithmetic`` and ``ties``).
        density: ``ties``: fraction of each task vector's entries kept (by magnitude).
        layer_scaling: ``alpha`` of the depth scaling of the task vectors (``None``: off; needs a base).
    """
    if method not in METHODS:
        raise ValueError(f"unknown merge method {method!r}; choose one of {', '.join(METHODS)}")
    if len(weights) != len(states):
        raise ValueError(f"{len(states)} models but {len(weights)} weights")
    if method == "linear":
        if base is not None:
            raise ValueError("linear merging takes no base model; use task_arithmetic or ties with --base")
        if abs(sum(weights) - 1.0) > 1e-6:
            raise ValueError(
                f"linear merging needs weights that sum to 1, got {list(weights)} (sum {sum(weights):g})"
            )
    elif base is None:
        raise ValueError(f"{method} merging needs the base model the others were fine-tuned from (--base)")
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density}")
    if layer_scaling is not None and (base is None or not 0 <= layer_scaling <= 1):
        raise ValueError(f"layer scaling needs a base model and an alpha in [0, 1], got {layer_scaling}")
    reference = base if base is not None else states[0]
    scale = layer_scales(list(reference), layer_scaling) if layer_scaling is not None else {}
    for i, state in enumerate(states):
        if state.keys() != reference.keys():
            missing = sorted(set(reference) ^ set(state))[:3]
            raise ValueError(f"model {i + 1} has different weights than the others (e.g. {missing})")
    merged: dict[str, Tensor] = {}
    for key, ref in reference.items():
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
        coefficients = _coefficients(
            tensors, weights, method, base[key] if base is not None else None, density
        )
        if layer_scaling is not None:
            coefficients = [c * scale[key] for c in coefficients]
        out = sum(
            (c * t.float() for c, t in zip(coefficients, tensors)), torch.zeros_like(ref, dtype=torch.float32)
        )
        if base is not None:
            rest = 1.0 - sum(coefficients, torch.zeros_like(ref, dtype=torch.float32))
            out = rest * base[key].float() + out
        merged[key] = out.to(ref.dtype)
    return merged


def _coefficients(
    tensors: Sequence[Tensor], weights: Sequence[float], method: str, base: Tensor | None, density: float
) -> list[Tensor | float]:
    if method != "ties":
        return [float(w) for w in weights]
    assert base is not None
    taus = [t.float() - base.float() for t in tensors]
    kept = [trim_top(tau, density) for tau in taus]
    elected = torch.sign(
        sum((w * tau * k for w, tau, k in zip(weights, taus, kept)), torch.zeros_like(taus[0]))
    )
    return [
        w * (k & (torch.sign(tau) == elected) & (elected != 0)).float()
        for w, tau, k in zip(weights, taus, kept)
    ]


class Merger:
    """Load the models (and ``base``) once, check their settings agree, and merge them at any weights.

    Args:
        models: Model folders (or aliases), same architecture.
        method: ``linear``, ``task_arithmetic`` or ``ties``.
        base: The base model (``task_arithmetic``, ``ties``).
        density: ``ties``: fraction of each task vector kept.
        layer_scaling: ``alpha`` of the depth scaling of the task vectors (LiNeS; ``None``: off).
    """

    def __init__(
        self,
        models: Sequence[str | os.PathLike],
        *,
        method: str = "linear",
        base: str | os.PathLike | None = None,
        density: float = 0.2,
        layer_scaling: float | None = None,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown merge method {method!r}; choose one of {', '.join(METHODS)}")
        if method == "linear" and len(models) < 2:
            raise ValueError("linear merging needs two or more models")
        if method != "linear" and (base is None or not models):
            raise ValueError(f"{method} merging needs one or more fine-tuned models and their base (--base)")
        _refuse_other_kinds([*models, *([base] if base is not None else [])])
        loaded = [Encoder.load(m) for m in models]
        base_model = Encoder.load(base) if base is not None else None
        everything = loaded + ([base_model] if base_model is not None else [])
        folders = [*models, *([base] if base is not None else [])]
        self.settings = check_compatible(
            [model_settings(m, f) for m, f in zip(everything, folders)], list(map(str, folders))
        )
        self.method, self.density, self.layer_scaling = method, density, layer_scaling
        self.names = [str(m) for m in models]
        self.states = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in loaded]
        self.base = None if base_model is None else base_model.state_dict()
        self.model = loaded[0]
        prompts, default = self.settings["prompts"], self.settings["default_prompt_name"]
        self.model.prompts = dict(prompts) if isinstance(prompts, dict) else {}
        self.model.default_prompt_name = default if isinstance(default, str) else None

    def merge(self, weights: Sequence[float] | None = None) -> Encoder:
        """The merged model at ``weights`` (``None``: equal weights, i.e. checkpoint averaging for ``linear``).

        The same :class:`Encoder` object is returned on every call, with its weights replaced.
        """
        weights = list(weights) if weights is not None else [1.0 / len(self.states)] * len(self.states)
        merged = merge_state_dicts(
            self.states,
            weights,
            method=self.method,
            base=self.base,
            density=self.density,
            layer_scaling=self.layer_scaling,
        )
        self.model.load_state_dict(merged)
        return self.model

    def save(self, path: str | os.PathLike, *, recipe: Mapping[str, object] | None = None) -> Path:
        """Save the current merge; carried-over sentence-transformers settings and the recipe go in its config."""
        out = Path(path)
        self.model.save(out)
        config = read_st_config(out)
        config.update({k: self.settings[k] for k in _ST_KEYS if self.settings.get(k) is not None})
        if recipe is not None:
            config["embforge_merge"] = recipe
        write_json(out / ST_CONFIG_FILE, config)
        return out


def sweep_weights(n_models: int, method: str, w: float) -> list[float]:
    """The weights a one-number sweep means: ``(1-w, w)`` for two linear models, ``w`` for every task vector."""
    if method == "linear":
        if n_models != 2:
            raise ValueError("--choose-on with linear merging sweeps the weight between exactly two models")
        return [1.0 - w, w]
    return [w] * n_models


def _refuse_other_kinds(folders: Sequence[str | os.PathLike]) -> None:
    """Merging averages dense bi-encoders' weights; other kinds (sparse, static, ...) get a clear error."""
    for folder in folders:
        kind = folder_kind(folder)
        if kind is not None and not kind_record(kind).mergeable:
            raise ValueError(
                f"{folder} is a {kind.value} model: embforge merge combines dense bi-encoders (sentence-transformers "
                "folders) only"
            )
