"""Model kinds: which model class a ``--model-type`` (or a saved folder) stands for.

embforge trains several kinds of model through one loop: dense bi-encoders (one vector per text),
cross-encoders (a score per pair), multi-vector late-interaction models (ColBERT: a matrix per text), sparse
lexical models (SPLADE: a vocabulary-size vector, mostly zeros) and static embeddings (a token-embedding table,
no transformer). Each model class declares its kind as a class attribute ``kind``; code that must behave
differently per kind reads that declaration (or :func:`kind_of`), never guesses from attributes.

The class behind a kind is imported lazily, so ``import embforge.kinds`` stays cheap.
"""

from __future__ import annotations

import importlib
from enum import Enum
from typing import TYPE_CHECKING, Any

from embforge.modeling.resolve import resolve_model_path
from embforge.modeling.st_folder import has_modules, read_modules, read_st_config

if TYPE_CHECKING:
    from typing_extensions import TypeIs, Unpack

    from embforge.protocols import LoadOptions, ModelPath, PairScorer, TrainableEmbedder


class ModelKind(str, Enum):
    """The kinds of model embforge trains, evaluates, saves and serves."""

    DENSE = "dense"
    CROSS = "cross"
    MULTIVECTOR = "multivector"
    SPARSE = "sparse"
    STATIC = "static"


# kind -> "module:Class" (imported on first use)
MODEL_CLASSES: dict[ModelKind, str] = {
    ModelKind.DENSE: "embforge.encoder:Encoder",
    ModelKind.CROSS: "embforge.cross_encoder:CrossEncoder",
    ModelKind.MULTIVECTOR: "embforge.multivector:MultiVectorEncoder",
    ModelKind.SPARSE: "embforge.sparse.model:SparseEncoder",
    ModelKind.STATIC: "embforge.static.model:StaticEncoder",
}

# the names ``--model-type`` accepts for each kind ("bi" is the historical name of "dense")
_ALIASES = {"bi": ModelKind.DENSE, "colbert": ModelKind.MULTIVECTOR, "splade": ModelKind.SPARSE}
KIND_CHOICES = tuple(k.value for k in ModelKind)


def parse_kind(name: str | ModelKind) -> ModelKind:
    """``"sparse"`` -> :attr:`ModelKind.SPARSE` (``"bi"`` is accepted for ``"dense"``); a clear error otherwise."""
    if isinstance(name, ModelKind):
        return name
    key = str(name).strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    try:
        return ModelKind(key)
    except ValueError:
        raise ValueError(
            f"unknown model type {name!r}; choose one of {', '.join(KIND_CHOICES)} (bi = dense)"
        ) from None


def model_class(kind: str | ModelKind) -> Any:
    """The class that implements ``kind`` (its ``load(path, ...)`` reads a folder of that kind)."""
    module, _, name = MODEL_CLASSES[parse_kind(kind)].partition(":")
    return getattr(importlib.import_module(module), name)


def kind_of(model: object) -> ModelKind:
    """The kind a model declares (its ``kind``: a class attribute, or a property of a wrapper such as a Matryoshka
    view); dense for an object that declares none (the pipeline check's size-only stand-in)."""
    declared = getattr(model, "kind", None)
    return parse_kind(declared) if declared is not None else ModelKind.DENSE


def is_pair_scorer(model: object) -> TypeIs[PairScorer]:
    """Whether ``model`` declares itself a cross-encoder (:attr:`ModelKind.CROSS`): it scores pairs."""
    return kind_of(model) == ModelKind.CROSS


def is_single_vector(model: object) -> TypeIs[TrainableEmbedder]:
    """Whether ``model`` declares itself a dense or static embedder: one vector per text (``embed_ids``)."""
    return kind_of(model) in (ModelKind.DENSE, ModelKind.STATIC)


# sentence-transformers' ``config_sentence_transformers.json`` ``model_type`` -> kind
_ST_MODEL_TYPES = {
    "SentenceTransformer": ModelKind.DENSE,
    "CrossEncoder": ModelKind.CROSS,
    "SparseEncoder": ModelKind.SPARSE,
    "MultiVectorEncoder": ModelKind.MULTIVECTOR,
    "ColBERT": ModelKind.MULTIVECTOR,  # pylate's ColBERT folders
}
_STATIC_MODULE = "StaticEmbedding"


def folder_kind(path: ModelPath) -> ModelKind | None:
    """The kind a saved folder declares, or ``None`` when it does not say (a plain Hugging Face folder).

    Read from ``config_sentence_transformers.json`` (``model_type``) and, for sentence-transformers'
    ``StaticEmbedding`` models (whose ``model_type`` is ``SentenceTransformer``), from ``modules.json``.
    """
    root = resolve_model_path(path)
    if has_modules(root):
        types = [module.kind for module in read_modules(root)]
        if types and types[0] == _STATIC_MODULE:
            return ModelKind.STATIC
    model_type = read_st_config(root).get("model_type")
    return _ST_MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None


def load_any(path: ModelPath, **options: Unpack[LoadOptions]) -> Any:
    """Load a folder as the kind it declares (a dense :class:`~embforge.encoder.Encoder` when it does not say),
    with the options every kind's ``load`` takes."""
    kind = folder_kind(path) or ModelKind.DENSE
    return model_class(kind).load(path, **options)
