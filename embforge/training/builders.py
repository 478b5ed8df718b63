"""The one place that builds a run's parts from names: the model of a kind, its losses and its evaluators.

A single run (:mod:`embforge.training.run`) and a pipeline's stages (:mod:`embforge.training.pipeline`) both
build through these, for every model kind (:mod:`embforge.kinds`: the kind's record knows its model class, its
losses and its evaluators).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from embforge.data.retrieval import RetrievalData
from embforge.data.sources import RowSource
from embforge.data.tables import Dataset
from embforge.kinds import kind_record
from embforge.losses.base import EmbeddingLoss
from embforge.losses.cross import CrossLoss
from embforge.modeling.decoder import make_bidirectional
from embforge.modeling.encoding import BatchEncoding
from embforge.modeling.st_folder import is_cross_encoder_folder
from embforge.training.loop import Evaluator

if TYPE_CHECKING:
    from embforge.kind_names import ModelKind
    from embforge.protocols import Embedder, Kinded
    from embforge.training.config import TrainConfig
    from embforge.training.trainer import Trainable

__all__ = ["load_model", "make_evaluator", "make_loss", "model_dim", "new_loss", "with_lora"]

# the losses that train a cross-encoder's new head with two logits (a class per label) instead of one
_TWO_LOGIT_LOSSES = ("ce", "softmax")


def new_loss(
    name: str,
    *,
    kind: ModelKind | str = "dense",
    dim: int | None,
    data: Dataset | RowSource,
    options: dict[str, Any] | None = None,
    matryoshka_dims: list[int] | None = None,
    matryoshka_weights: list[float] | None = None,
) -> EmbeddingLoss | CrossLoss:
    """The loss ``name`` for a model of ``kind`` and dimension ``dim``, from the names and the data alone: the
    kind's record builds it (:meth:`~embforge.kinds.KindRecord.build_loss`: a cross-encoder loss for a
    cross-encoder, a MaxSim loss for a multi-vector model, an embedding loss otherwise).

    The number of classes (``softmax``, ``prototype``) comes from the data's integer labels. A pipeline checks
    its stages with this before any model is loaded; :func:`make_loss` adds the model's starting values.
    """
    record = kind_record(kind)
    labels = data.labels() if record.matryoshka and isinstance(data, Dataset) else None  # a stream's: unknown
    num_labels = int(labels.max()) + 1 if labels is not None and data.label_column == "label" else None
    loss = record.build_loss(
        name,
        dim=dim,
        num_labels=num_labels,
        matryoshka_dims=matryoshka_dims,
        matryoshka_weights=matryoshka_weights,
        **(options or {}),
    )
    return cast("EmbeddingLoss | CrossLoss", loss)


def model_dim(model: Kinded) -> int | None:
    """The dimension of ``model``'s embeddings; ``None`` for a pair scorer (a cross-encoder embeds nothing)."""
    return None if kind_record(model).pair_scoring else cast("Embedder", model).dim


def make_loss(
    name: str,
    *,
    model: Kinded,
    data: Dataset | RowSource,
    options: dict[str, Any] | None = None,
    matryoshka_dims: list[int] | None = None,
    matryoshka_weights: list[float] | None = None,
) -> EmbeddingLoss | CrossLoss:
    """The loss ``name`` for ``model`` (:func:`new_loss` for its kind and dimension); an embedding loss then
    sets its data-dependent starting values from ``model`` (:meth:`~embforge.losses.base.EmbeddingLoss.start_from`)
    when the data is a table (a stream's rows are not all known)."""
    loss = new_loss(
        name,
        kind=kind_record(model).kind,
        dim=model_dim(model),
        data=data,
        options=options,
        matryoshka_dims=matryoshka_dims,
        matryoshka_weights=matryoshka_weights,
    )
    # a loaded bi-encoder (a BatchEncoding); data-dependent starts read a whole table
    if isinstance(model, BatchEncoding) and isinstance(loss, EmbeddingLoss) and isinstance(data, Dataset):
        loss.start_from(model, data)
    return loss


def make_evaluator(data: Dataset | RetrievalData, model: Kinded, *, where: str = "--eval") -> Evaluator:
    """``model -> metrics`` for evaluation data, by the model kind's evaluators (:mod:`embforge.kinds`):
    retrieval metrics (NDCG@10 ...) for retrieval data, STS correlations for scored pairs, pair classification
    (accuracy, F1, AP, Spearman) for the 0/1 labels of a kind that has a ``pairs`` evaluator (a cross-encoder)."""
    if isinstance(data, RetrievalData):
        from embforge.evaluate.retrieval import retrieval_evaluator

        return retrieval_evaluator(data)
    record = kind_record(model)
    sts = record.evaluator("sts")
    if sts is None:
        raise ValueError(
            f"{where} {data.path}: {record.description} is evaluated on retrieval, not on scored pairs; use "
            "--retrieval-train FOLDER --retrieval-eval-split dev, or 'embforge eval retrieval' after training"
        )
    pairs = record.evaluator("pairs")
    chosen = pairs if pairs is not None and data.label_column == "label" else sts
    return lambda m: chosen(m, data)


def load_model(
    path: str,
    kind: ModelKind | str,
    *,
    config: TrainConfig,
    losses: list[str],
    max_seq_length: int | None = None,
    bidirectional: bool = False,
) -> Trainable:
    """The model at ``path`` as the kind ``kind`` (:mod:`embforge.kinds`): a pair scorer (cross-encoder) gets a
    new head sized for ``losses`` (two logits for a classification loss); a decoder backbone made bidirectional
    when asked (saved in its config, :mod:`embforge.modeling.decoder`); LoRA adapters where ``config`` asks for
    them and the kind takes them."""
    record = kind_record(kind)
    if config.lora.lora_r and not record.lora:
        raise ValueError(
            f"LoRA is not supported for {record.kind.value} models (their folders hold no adapters); train all "
            "weights (drop --lora-r)"
        )
    options: dict[str, Any] = {"max_seq_length": max_seq_length}
    if record.pair_scoring:
        options["new_head"] = True
        if not is_cross_encoder_folder(path):  # a new head: one logit, two for a classification loss
            options["num_labels"] = 2 if any(name in _TWO_LOGIT_LOSSES for name in losses) else 1
    model: Trainable = record.model_cls().load(path, **options)
    if bidirectional:
        make_bidirectional(model)
    return with_lora(model, config)


def check_matryoshka(dims: list[int] | None, dim: int | None) -> str | None:
    """What is wrong with Matryoshka dimensions ``dims`` for a model of dimension ``dim`` (one above it), or
    ``None`` (also for ``dim=None``, a cross-encoder: its loss refuses them)."""
    if dim is not None and dims and max(dims) > dim:
        return f"field 'matryoshka_dims': {max(dims)} is larger than the model's dimension {dim}; use values <= {dim}"
    return None


def with_lora(model: Any, config: TrainConfig) -> Any:
    """``model`` with LoRA adapters when ``config.lora.lora_r`` > 0 (only the adapters train); else unchanged."""
    from embforge.modeling.lora import LoraConfig, apply_lora, uses_adapters

    lora = LoraConfig.from_fields(config.lora)
    if lora.adapter_name is not None:  # a named task adapter beside the model's others (modeling/adapters.py)
        from embforge.modeling.adapters import add_task_adapter

        if not lora.enabled:
            raise ValueError(f"--adapter-name {lora.adapter_name} needs --lora-r (the adapter's rank)")
        return add_task_adapter(
            model, lora.adapter_name, r=lora.r, alpha=lora.alpha, dropout=lora.dropout, targets=lora.targets,
            seed=config.seed,
        )  # fmt: skip
    if lora.enabled and not uses_adapters(model):  # an adapted folder already brings its adapters
        apply_lora(
            model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout, targets=lora.targets, seed=config.seed
        )
    return model
