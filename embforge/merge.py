r"""Model merging for every model kind: load folders of one kind, check they agree, merge their weights, save.

Dense, cross-encoder, multi-vector (ColBERT: backbone + projection), sparse (SPLADE: an MLM head) and static (a
token table) folders merge the same way: each folder is loaded by its kind's model class (the registry record,
:func:`embforge.kinds.folder_record`), the models' state dicts are merged weight by weight
(:func:`embforge.merging.state.merge_state_dicts`) and the first model, holding the merged weights, is saved by its
class. What a kind needs besides its weights is data on its record: ``merge_settings`` names the attributes that
must agree (pooling, normalisation, activation, ColBERT's markers and lengths ...).

Methods (mergekit's definitions; formulas in :mod:`embforge.merging.methods`):

===================  ====================================================================================
``linear``           :math:`\sum_i w_i\theta_i`, :math:`\sum_i w_i = 1` (equal weights: checkpoint averaging)
``slerp``            spherical interpolation between two models at :math:`t = w_2`, per tensor
``task_arithmetic``  :math:`\theta_{base} + \sum_i w_i(\theta_i - \theta_{base})` (Ilharco et al., 2023)
``ties``             trimmed (``density``), sign-elected task vectors (Yadav et al., 2023)
``dare_linear``      task vectors' entries dropped with probability 1 - ``density``, the rest rescaled by
                     1/``density`` (Yu et al., 2024; seeded)
``dare_ties``        DARE's drop-and-rescale, then TIES's sign election
``model_stock``      :math:`\theta_{base} + t(\bar\theta - \theta_{base})`, :math:`t` from the angle between
                     the task vectors (Jang et al., 2024; two or more models, no weights)
===================  ====================================================================================

With one fine-tuned model and its base, ``task_arithmetic`` at weight ``w`` is ``linear`` with weights
``(1-w, w)``. ``layer_scaling=alpha`` (LiNeS) keeps shallow layers nearer the base (:mod:`embforge.merging.state`).

What decides the output besides the weights — the record's ``merge_settings``, the tokenizer's vocabulary and the
``config_sentence_transformers.json`` keys (prompts, similarity function, Matryoshka settings) — must agree across
the inputs (an error names the first disagreement) and is carried over.

Example:
    >>> merger = Merger(["runs/sts", "runs/nli"], method="dare_ties", base="all-MiniLM-L6-v2", density=0.5)  # doctest: +SKIP
    >>> model = merger.merge([0.5, 0.5])  # doctest: +SKIP
    >>> merger.save("runs/merged", recipe={"method": "dare_ties"})  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from torch import Tensor

from embforge.kinds import folder_kind, kind_record
from embforge.merging.methods import trim_top
from embforge.merging.records import METHODS, merge_method
from embforge.merging.state import (
    check_recipe,
    layer_depths,
    layer_scales,
    merge_state_dicts,
    share_clones,
)
from embforge.modeling.resolve import resolve_model_path
from embforge.modeling.st_folder import ST_CONFIG_FILE, read_st_config, write_json
from embforge.protocols import TrainableModel

if TYPE_CHECKING:
    from embforge.protocols import ModelPath

__all__ = [
    "METHODS",
    "Merger",
    "check_compatible",
    "layer_depths",
    "layer_scales",
    "merge_state_dicts",
    "model_settings",
    "sweep_weights",
    "trim_top",
]

# keys of config_sentence_transformers.json that change what a model outputs (carried over, must agree)
_ST_KEYS = ("prompts", "default_prompt_name", "similarity_fn_name", "truncate_dim", "matryoshka_dims")


class _Vocabulary(Protocol):
    def get_vocab(self) -> Mapping[str, int]: ...


class MergeableModel(TrainableModel, Protocol):
    """A model of any kind as merging uses it: weights in and out, a tokenizer, saved as a folder."""

    tokenizer: _Vocabulary

    def load_state_dict(
        self, state_dict: Mapping[str, Tensor], strict: bool = True, assign: bool = False
    ) -> object:
        """Replace the weights."""


def model_settings(model: MergeableModel, folder: ModelPath | None = None) -> dict[str, object]:
    """What must agree between merged models, besides the weights' names and shapes: the kind, the attributes its
    record names (``merge_settings``), the vocabulary and the folder's sentence-transformers settings."""
    record = kind_record(model)
    settings: dict[str, object] = {"kind": record.kind.value}
    settings.update({name: getattr(model, name) for name in record.merge_settings})
    vocab = sorted(model.tokenizer.get_vocab().items())
    digest = hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:12]
    settings["vocabulary"] = f"{len(vocab)} tokens, sha256 {digest}"
    extra = _st_config(folder)
    for key in _ST_KEYS:
        settings.setdefault(key, extra.get(key))
    # a folder that names no similarity function means sentence-transformers' default, cosine
    settings["similarity_fn_name"] = settings["similarity_fn_name"] or "cosine"
    settings["prompts"] = settings["prompts"] or {}
    return settings


def _st_config(folder: ModelPath | None) -> dict[str, object]:
    return {} if folder is None else dict(read_st_config(resolve_model_path(folder)))


def check_compatible(settings: Sequence[dict[str, object]], names: Sequence[str]) -> dict[str, object]:
    """The common settings, or a ``ValueError`` naming the first setting on which two models disagree."""
    first = settings[0]
    for name, other in zip(names[1:], settings[1:]):
        for key, value in first.items():
            if other.get(key) != value:
                raise ValueError(
                    f"cannot merge: {key} differs ({names[0]}: {value!r}, {name}: {other.get(key)!r}); "
                    "merged models must be of one kind and share their vocabulary, pooling, normalisation, "
                    "max_seq_length, prompts and similar settings"
                )
    return first


class Merger:
    """Load the models (and ``base``) once, check their settings agree, and merge them at any weights.

    Args:
        models: Model folders (or aliases) of one kind and architecture.
        method: A name of :data:`~embforge.merging.records.METHODS` (``linear``, ``slerp``, ``task_arithmetic``,
            ``ties``, ``dare_linear``, ``dare_ties``, ``model_stock``).
        base: The base model (the methods on task vectors).
        density: ``ties``: fraction of each task vector kept; ``dare_*``: probability of keeping an entry.
        layer_scaling: ``alpha`` of the depth scaling of the task vectors (LiNeS; ``None``: off).
        seed: ``dare_*``: the seed of the random drops.
        normalize: ``ties``/``dare_ties``: average the agreeing task vectors instead of summing them
            (mergekit's ``normalize``).
    """

    def __init__(
        self,
        models: Sequence[ModelPath],
        *,
        method: str = "linear",
        base: ModelPath | None = None,
        density: float = 0.2,
        layer_scaling: float | None = None,
        seed: int = 0,
        normalize: bool = False,
    ) -> None:
        self.record = merge_method(method)
        check_recipe(
            self.record,
            len(models),
            None,
            has_base=base is not None,
            density=density,
            layer_scaling=layer_scaling,
            normalize=normalize,
        )
        folders = [*models, *([base] if base is not None else [])]
        loaded = [_load(f, folders) for f in folders]
        self.settings = check_compatible(
            [model_settings(m, f) for m, f in zip(loaded, folders)], list(map(str, folders))
        )
        self.carried = {k: v for k, v in _st_config(folders[0]).items() if k in _ST_KEYS and v is not None}
        self.method, self.density, self.layer_scaling, self.seed = method, density, layer_scaling, seed
        self.normalize = normalize
        self.names = [str(m) for m in models]
        self.states = [share_clones(m.state_dict()) for m in loaded[: len(models)]]
        self.base = None if base is None else dict(loaded[-1].state_dict())
        self.model = loaded[0]

    def merge(self, weights: Sequence[float] | None = None) -> MergeableModel:
        """The merged model at ``weights`` (``None``: equal weights, i.e. checkpoint averaging for ``linear``; the
        only choice for ``model_stock``).

        The same model object is returned on every call, with its weights replaced.
        """
        merged = merge_state_dicts(
            self.states,
            None if weights is None else list(weights),
            method=self.method,
            base=self.base,
            density=self.density,
            layer_scaling=self.layer_scaling,
            seed=self.seed,
            normalize=self.normalize,
        )
        self.model.load_state_dict(merged)
        return self.model

    def save(self, path: str | os.PathLike, *, recipe: Mapping[str, object] | None = None) -> Path:
        """Save the current merge; carried-over sentence-transformers settings and the recipe go in its config."""
        out = Path(path)
        self.model.save(out)
        config = read_st_config(out)
        config.update(self.carried)
        if recipe is not None:
            config["embforge_merge"] = recipe
        write_json(out / ST_CONFIG_FILE, config)
        return out


def _load(folder: ModelPath, folders: Sequence[ModelPath]) -> MergeableModel:
    """``folder`` loaded by the class of the kind it declares; a folder that declares none (a plain Hugging Face
    folder, e.g. the base of a sparse model) as the kind the first declaring folder of the merge has."""
    kinds = [folder_kind(f) for f in folders]
    kind = folder_kind(folder) or next((k for k in kinds if k is not None), "dense")
    model: MergeableModel = kind_record(kind).model_cls().load(folder)
    return model


def sweep_weights(n_models: int, method: str, w: float) -> list[float]:
    """The weights a one-number sweep means: ``(1-w, w)`` between two models (``linear``, ``slerp``), ``w`` for
    every task vector (the methods with a base)."""
    record = merge_method(method)
    if record.weights == "none":
        raise ValueError(f"{method} merging has no weight to choose: drop --choose-on")
    if record.weights == "sum_to_one":
        if n_models != 2:
            raise ValueError(
                f"--choose-on with {method} merging sweeps the weight between exactly two models"
            )
        return [1.0 - w, w]
    return [w] * n_models
