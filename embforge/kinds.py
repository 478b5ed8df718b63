"""Model kinds as registered records: what each kind needs, asked by the code that trains, evaluates and serves it.

embforge trains several kinds of model through one loop: dense bi-encoders (one vector per text),
cross-encoders (a score per pair), multi-vector late-interaction models (ColBERT: a matrix per text), sparse
lexical models (SPLADE: a vocabulary-size vector, mostly zeros) and static embeddings (a token-embedding table,
no transformer). Each model class declares its kind as a class attribute ``kind``
(:class:`~embforge.kind_names.ModelKind`); each kind has one :class:`KindRecord` in :data:`KINDS` naming its
model class, its losses and default loss, how its training tasks are prepared, how it is served, its evaluators,
whether it exports to ONNX and the ``--model-type`` aliases. Generic code asks the record
(``kind_record(model).serving``, ``.exportable``, ``.default_loss`` ...); it never compares kinds. A sixth kind
is one more record (and its classes).

Everything a record names is a ``"module:attribute"`` string imported on first use, so ``import embforge.kinds``
stays cheap (no torch model, no scipy, no server).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from embforge.kind_names import ModelKind
from embforge.modeling.resolve import resolve_model_path
from embforge.modeling.st_folder import has_modules, read_modules, read_st_config

if TYPE_CHECKING:
    from typing_extensions import TypeIs, Unpack

    from embforge.losses.base import BaseLoss
    from embforge.protocols import Embedder, Kinded, LoadOptions, ModelPath, PairScorer, TrainableEmbedder

__all__ = [
    "KINDS",
    "KIND_CHOICES",
    "KindRecord",
    "ModelKind",
    "folder_kind",
    "folder_record",
    "is_pair_scorer",
    "is_single_vector",
    "kind_of",
    "kind_record",
    "load_any",
    "model_class",
    "parse_kind",
]


def load_named(name: str) -> Any:
    """The object a ``"module:attribute"`` string names (the module imported now)."""
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class KindRecord:
    """What one model kind needs; each ``"module:attribute"`` field is imported on first use.

    Attributes:
        kind: The kind's name (``--model-type``, a saved folder's declaration).
        model_class: Its model class; ``load(path, **options)`` reads a folder of the kind.
        description: What a folder of the kind is, in an error (``"a sparse (SPLADE) embedding model"``).
        aliases: Other names ``--model-type`` accepts for it.
        losses: Its table of losses, name -> class.
        loss_factory: ``factory(name, **options)`` builds one of :attr:`losses` (a bi-encoder factory also takes
            ``dim``, ``num_labels`` and ``matryoshka_dims``/``matryoshka_weights``: see :attr:`matryoshka`).
        default_loss: The loss a run trains with when it names none.
        retrieval_loss: The loss a run on a retrieval folder (``--retrieval-train``) trains with by default.
        prepared_task: The prepared-task class (:mod:`embforge.training.tasks`): how a task's columns become the
            model's inputs (texts' token ids, the query column marked through ``tokenize_ids(is_query=True)``;
            or tokenised pairs).
        serving: Its serving record (:class:`embforge.serve.serving.KindServing`); ``None``: served as a reranker.
        evaluators: Evaluation name -> function: ``sts`` (scored pairs), ``pairs`` (0/1 labels) and ``retrieval``
            when the kind scores retrieval its own way (else its vectors are searched by
            :func:`embforge.evaluate.retrieval.evaluate_retrieval`).
        exportable: Whether ``embforge export`` writes an ONNX graph of it (and the ONNX runtimes load it).
        no_export: Why not, in a refusal (after "PATH is ").
        single_vector: One vector per text (``embed_ids``, ``.npy`` output, Matryoshka-capable).
        pair_scoring: Scores pairs of texts (a cross-encoder): it embeds nothing, has no ``dim``.
        matryoshka: Its losses can be wrapped at several dimensions (``matryoshka_dims``).
        lora: Whether LoRA adapters train on it (its folder can hold them).
        merge_settings: The model's attributes that ``embforge merge`` requires equal across the models it merges
            (besides the weights' names and shapes, the vocabulary and the saved sentence-transformers settings).
        st_model_types: ``config_sentence_transformers.json`` ``model_type`` values declaring the kind.
        st_first_module: A ``modules.json`` first module declaring the kind (static: ``StaticEmbedding``).
        card: ``card(folder) -> facts`` of its model-card section (:mod:`embforge.training.kind_cards`); ``None``:
            the dense or cross-encoder card.
    """

    kind: ModelKind
    model_class: str
    description: str
    aliases: tuple[str, ...] = ()
    losses: str = "embforge.losses:LOSSES"
    loss_factory: str = "embforge.losses:get_loss"
    default_loss: str = "cosent"
    retrieval_loss: str = "infonce"
    prepared_task: str = "embforge.training.tasks:PreparedEmbeddingTask"
    serving: str | None = None
    evaluators: Mapping[str, str] = field(
        default_factory=lambda: {"sts": "embforge.evaluate.sts:evaluate_sts"}
    )
    exportable: bool = False
    no_export: str = ""
    single_vector: bool = False
    pair_scoring: bool = False
    matryoshka: bool = True
    lora: bool = True
    merge_settings: tuple[str, ...] = ()
    st_model_types: tuple[str, ...] = ()
    st_first_module: str | None = None
    card: str | None = None

    def model_cls(self) -> Any:
        """The model class (imported now)."""
        return load_named(self.model_class)

    def loss_names(self) -> tuple[str, ...]:
        """The names of the kind's losses."""
        return tuple(cast("Mapping[str, object]", load_named(self.losses)))

    def build_loss(
        self,
        name: str,
        *,
        dim: int | None = None,
        num_labels: int | None = None,
        matryoshka_dims: list[int] | None = None,
        matryoshka_weights: list[float] | None = None,
        **options: object,
    ) -> BaseLoss:
        """The kind's loss ``name`` with ``options``; ``dim``/``num_labels`` (softmax, prototype) and Matryoshka
        dimensions for a kind whose losses take them, ``matryoshka_dims`` refused for the others."""
        factory: Callable[..., BaseLoss] = load_named(self.loss_factory)
        if not self.matryoshka:
            if matryoshka_dims:
                raise ValueError(
                    f"matryoshka_dims applies to bi-encoders only, not to {self.description}; drop it"
                )
            return factory(name, **options)
        return factory(
            name,
            dim=dim,
            num_labels=num_labels,
            matryoshka_dims=matryoshka_dims,
            matryoshka_weights=matryoshka_weights,
            **options,
        )

    def serving_class(self) -> Any:
        """The serving record class; a ``ValueError`` for a kind the embedding server does not serve."""
        if self.serving is None:
            raise ValueError(
                f"a {self.kind.value} model is not an embedding model: serve a cross-encoder with --reranker"
            )
        return load_named(self.serving)

    def evaluator(self, name: str) -> Callable[..., dict[str, float]] | None:
        """The kind's evaluator ``name`` (``sts``, ``pairs``, ``retrieval``), ``None`` when it has none."""
        target = self.evaluators.get(name)
        return None if target is None else load_named(target)


_NO_ONNX = "'embforge serve' (PyTorch)"

KINDS: dict[ModelKind, KindRecord] = {
    record.kind: record
    for record in (
        KindRecord(
            ModelKind.DENSE,
            "embforge.encoder:Encoder",
            "a dense embedding model (sentence-transformers folder)",
            aliases=("bi",),  # the historical name
            serving="embforge.serve.dense:DenseServing",
            exportable=True,
            single_vector=True,
            merge_settings=("pooling", "normalize", "max_seq_length", "prompts", "default_prompt_name"),
            st_model_types=("SentenceTransformer",),
        ),
        KindRecord(
            ModelKind.CROSS,
            "embforge.cross_encoder:CrossEncoder",
            "a cross-encoder",
            losses="embforge.losses.cross:CROSS_LOSSES",
            loss_factory="embforge.losses.cross:get_cross_loss",
            prepared_task="embforge.training.tasks:PreparedCrossTask",
            evaluators={
                "sts": "embforge.evaluate.sts:evaluate_sts",
                "pairs": "embforge.evaluate.pairs:evaluate_pairs",
            },
            exportable=True,
            pair_scoring=True,
            matryoshka=False,
            merge_settings=("max_seq_length", "activation", "num_labels"),
            st_model_types=("CrossEncoder",),
        ),
        KindRecord(
            ModelKind.MULTIVECTOR,
            "embforge.multivector:MultiVectorEncoder",
            "a multi-vector (ColBERT) embedding model",
            aliases=("colbert",),
            losses="embforge.losses.late:MULTIVECTOR_LOSSES",  # MaxSim versions of infonce, margin_mse, kl_distill
            loss_factory="embforge.losses.late:get_multivector_loss",
            default_loss="infonce",
            serving="embforge.multivector.serve:MultiVectorServing",
            evaluators={"retrieval": "embforge.multivector.evaluate:evaluate_multivector"},  # MaxSim, no STS
            no_export=(
                "a multi-vector (ColBERT) model: embforge has no ONNX export for it yet; serve it with "
                f"{_NO_ONNX}, or export it with pylate's own tools"
            ),
            matryoshka=False,
            merge_settings=("settings", "prompts"),  # ColBERTSettings: markers, lengths, skiplist
            st_model_types=("MultiVectorEncoder", "ColBERT"),  # ColBERT: pylate's folders
            card="embforge.training.kind_cards:multivector_card",
        ),
        KindRecord(
            ModelKind.SPARSE,
            "embforge.sparse.model:SparseEncoder",
            "a sparse (SPLADE) embedding model",
            aliases=("splade",),
            default_loss="splade",
            retrieval_loss="splade",
            serving="embforge.sparse.serve:SparseServing",
            evaluators={
                "sts": "embforge.evaluate.sts:evaluate_sts",
                "retrieval": "embforge.sparse.evaluate:evaluate_sparse",  # dot products over an inverted index
            },
            no_export=(
                "a sparse (SPLADE) model: embforge has no ONNX export for sparse models yet; serve it with "
                f"{_NO_ONNX}, or export it with sentence-transformers' SparseEncoder(backend='onnx')"
            ),
            lora=False,  # its folder holds no adapters
            merge_settings=(
                "pooling",
                "activation",
                "max_seq_length",
                "prompts",
                "default_prompt_name",
                "inference_free",
            ),
            st_model_types=("SparseEncoder",),
            card="embforge.training.kind_cards:sparse_card",
        ),
        KindRecord(
            ModelKind.STATIC,
            "embforge.static.model:StaticEncoder",
            "a static embedding model",
            serving="embforge.serve.dense:DenseServing",
            no_export=(
                "a static embedding model: there is no transformer to export (encoding is a token-table lookup, "
                "already faster than an ONNX graph); serve or load the folder as it is"
            ),
            single_vector=True,
            lora=False,  # its folder holds no adapters
            merge_settings=("normalize", "max_seq_length", "prompts", "default_prompt_name"),
            st_first_module="StaticEmbedding",  # sentence-transformers' static models say SentenceTransformer
            card="embforge.training.kind_cards:static_card",
        ),
    )
}

KIND_CHOICES = tuple(k.value for k in ModelKind)
_NAMES = {name: record.kind for record in KINDS.values() for name in (record.kind.value, *record.aliases)}


def parse_kind(name: str | ModelKind) -> ModelKind:
    """``"sparse"`` -> :attr:`ModelKind.SPARSE` (a record's aliases too: ``"bi"`` is ``"dense"``); a clear error
    otherwise."""
    if isinstance(name, ModelKind):
        return name
    key = str(name).strip().lower()
    if key not in _NAMES:
        aliases = ", ".join(f"{a} = {r.kind.value}" for r in KINDS.values() for a in r.aliases)
        raise ValueError(f"unknown model type {name!r}; choose one of {', '.join(KIND_CHOICES)} ({aliases})")
    return _NAMES[key]


def kind_of(model: object) -> ModelKind:
    """The kind a model declares (its ``kind``: a class attribute, or a property of a wrapper such as a Matryoshka
    view); dense for an object that declares none (the pipeline check's size-only stand-in)."""
    declared = getattr(model, "kind", None)
    return parse_kind(declared) if declared is not None else ModelKind.DENSE


def kind_record(model_or_kind: str | ModelKind | Kinded | object) -> KindRecord:
    """The record of a kind, given its name (or alias) or a model that declares it."""
    if isinstance(model_or_kind, str):  # a ModelKind is a str too
        return KINDS[parse_kind(model_or_kind)]
    return KINDS[kind_of(model_or_kind)]


def model_class(kind: str | ModelKind) -> Any:
    """The class that implements ``kind`` (its ``load(path, ...)`` reads a folder of that kind)."""
    return kind_record(kind).model_cls()


def is_pair_scorer(model: object) -> TypeIs[PairScorer]:
    """Whether ``model`` declares a pair-scoring kind (a cross-encoder)."""
    return kind_record(model).pair_scoring


def is_single_vector(model: object) -> TypeIs[TrainableEmbedder]:
    """Whether ``model`` declares a single-vector kind (dense, static): one vector per text (``embed_ids``)."""
    return kind_record(model).single_vector


_ST_MODEL_TYPES = {name: r.kind for r in KINDS.values() for name in r.st_model_types}
_FIRST_MODULES = {r.st_first_module: r.kind for r in KINDS.values() if r.st_first_module}


def folder_kind(path: ModelPath) -> ModelKind | None:
    """The kind a saved folder declares, or ``None`` when it does not say (a plain Hugging Face folder).

    Read from ``config_sentence_transformers.json`` (``model_type``) and, for sentence-transformers'
    ``StaticEmbedding`` models (whose ``model_type`` is ``SentenceTransformer``), from ``modules.json``.
    """
    root = resolve_model_path(path)
    if has_modules(root):
        types = [module.kind for module in read_modules(root)]
        if types and types[0] in _FIRST_MODULES:
            return _FIRST_MODULES[types[0]]
    model_type = read_st_config(root).get("model_type")
    return _ST_MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None


def folder_record(path: ModelPath) -> KindRecord:
    """The record of the kind a saved folder declares; dense for a folder that does not say (a plain Hugging
    Face or sentence-transformers folder)."""
    return KINDS[folder_kind(path) or ModelKind.DENSE]


def load_any(path: ModelPath, **options: Unpack[LoadOptions]) -> Embedder | PairScorer:
    """Load a folder as the kind it declares (a dense :class:`~embforge.encoder.Encoder` when it does not say),
    with the options every kind's ``load`` takes."""
    model: Embedder | PairScorer = folder_record(path).model_cls().load(path, **options)
    return model
