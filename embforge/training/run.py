"""A training run described by data: which model, which files and loss, which hyper-parameters.

The CLI and TOML files build a :class:`RunSpec`; :func:`run` turns it into a model, tasks and an evaluator and
calls :func:`embforge.training.loop.train`. :func:`make_loss` and :func:`make_evaluator` are the one place that
builds losses and evaluators — multi-stage pipelines (:mod:`embforge.training.pipeline`) use them too.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from embforge.data.retrieval import training_pairs
from embforge.data.sources import RowSource, SourceOptions, open_source, row_count
from embforge.data.tables import Dataset, read_table
from embforge.kinds import is_single_vector, kind_record
from embforge.losses.base import EmbeddingLoss
from embforge.losses.cross import CrossLoss
from embforge.modeling.decoder import make_bidirectional
from embforge.modeling.encoding import BatchEncoding
from embforge.modeling.st_folder import is_cross_encoder_folder
from embforge.training.artifacts import claim_output
from embforge.training.config import TrainConfig, planned_steps
from embforge.training.loop import Evaluator, Refresher, train
from embforge.training.spec import RunSpec, load_toml, spec_from_dict
from embforge.training.tasks import Task

if TYPE_CHECKING:
    from embforge.kind_names import ModelKind
    from embforge.protocols import Embedder, Kinded
    from embforge.training.refresh import RefreshConfig
    from embforge.training.trainer import Trainable

__all__ = [
    "RunSpec",
    "build_tasks",
    "check_inputs",
    "load_model",
    "load_toml",
    "make_evaluator",
    "make_loss",
    "model_dim",
    "new_loss",
    "resolved_loss",
    "run",
    "source_options",
    "spec_from_dict",
    "with_lora",
]


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


def make_evaluator(path: str, model: Kinded, *, columns: str | dict[str, str] | None = None) -> Evaluator:
    """``model -> metrics`` for an evaluation file, by the model kind's evaluators (:mod:`embforge.kinds`): STS
    correlations for scored pairs, pair classification (accuracy, F1, AP, Spearman) for the 0/1 labels of a kind
    that has a ``pairs`` evaluator (a cross-encoder)."""
    record = kind_record(model)
    sts = record.evaluator("sts")
    if sts is None:
        raise ValueError(
            f"--eval {path}: {record.description} is evaluated on retrieval, not on scored pairs; use "
            "--retrieval-train FOLDER --retrieval-eval-split dev, or 'embforge eval retrieval' after training"
        )
    data = read_table(path, columns=columns)
    pairs = record.evaluator("pairs")
    chosen = pairs if pairs is not None and data.label_column == "label" else sts
    return lambda m: chosen(m, data)


def build_tasks(spec: RunSpec, model: Kinded) -> list[Task]:
    """One task per training file, all with the spec's loss."""
    if not spec.train:
        raise ValueError("no training data: pass --train FILE (or train = [...] in the config file)")
    tasks = []
    options = source_options(spec)  # one for the run: --max-bad-rows counts the bad rows of every file
    for path in spec.train:
        data = open_source(path, options)
        loss = make_loss(
            resolved_loss(spec),
            model=model,
            data=data,
            options=spec.loss_options,
            matryoshka_dims=spec.matryoshka_dims,
            matryoshka_weights=spec.matryoshka_weights,
        )
        task = Task(Path(path).stem, data, loss)
        task.validate()
        tasks.append(task)
    return tasks


def source_options(spec: RunSpec) -> SourceOptions:
    """How ``spec``'s training files are read (a stream's window is the plan's shuffle window)."""
    return SourceOptions(
        mode=spec.data_mode,
        columns=spec.columns,
        header=spec.header,
        max_bad_rows=spec.max_bad_rows,
        window=spec.config.data.shuffle_window or SourceOptions.window,
        cache_dir=spec.data_cache,
        split=spec.data_split,
    )


def resolved_loss(spec: RunSpec) -> str:
    """The loss a run trains with: ``spec.loss``, else the kind's ``retrieval_loss`` for a retrieval run and its
    ``default_loss`` otherwise (:mod:`embforge.kinds`: ``cosent`` for dense, ``splade`` for sparse, ``infonce``
    for multi-vector models)."""
    if spec.loss is not None:
        return spec.loss
    record = kind_record(spec.model_type)
    return record.retrieval_loss if spec.retrieval_train else record.default_loss


def load_model(spec: RunSpec) -> Trainable:
    """The model a run starts from, of the kind ``spec.model_type`` names (:mod:`embforge.kinds`): a pair scorer
    (cross-encoder) gets a new head sized for the loss; a single-vector model is checked against the Matryoshka
    dimensions; LoRA adapters where the run asks for them and the kind takes them."""
    record = kind_record(spec.model_type)
    if spec.config.lora.lora_r and not record.lora:
        raise ValueError(
            f"LoRA is not supported for {record.kind.value} models (their folders hold no adapters); train all "
            "weights (drop --lora-r)"
        )
    options: dict[str, Any] = {"max_seq_length": spec.max_seq_length}
    if record.pair_scoring:
        options["new_head"] = True
        if not is_cross_encoder_folder(spec.model):  # a new head: one logit, two for a classification loss
            options["num_labels"] = 2 if resolved_loss(spec) in ("ce", "softmax") else 1
    model: Trainable = record.model_cls().load(spec.model, **options)
    if (
        spec.bidirectional
    ):  # a decoder backbone attending both ways, saved in its config (modeling/decoder.py)
        make_bidirectional(model)
    dims = spec.matryoshka_dims
    if dims and is_single_vector(model) and max(dims) > model.dim:
        raise ValueError(f"matryoshka_dims: {max(dims)} is larger than the model's dimension {model.dim}")
    return with_lora(model, spec.config)


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


# a training path with one of these suffixes is a file that must exist (others may be folders or data set ids)
_TABLE_SUFFIXES = (".csv", ".tsv", ".txt", ".jsonl", ".json", ".parquet")


def check_inputs(spec: RunSpec) -> None:
    """What can be checked in milliseconds, before a model takes seconds to load: the files exist and the loss
    is one the model type has.

    Raises:
        FileNotFoundError: a training or evaluation file, or the retrieval folder, does not exist.
        ValueError: an unknown loss name (with the names there are).
    """
    for path in spec.train:
        if Path(path).suffix.lower() in _TABLE_SUFFIXES and not Path(path).is_file():
            raise FileNotFoundError(f"training file {path!r} does not exist")
    if spec.eval and not Path(spec.eval).is_file():
        raise FileNotFoundError(f"evaluation file {spec.eval!r} does not exist")
    if spec.retrieval_train and not Path(spec.retrieval_train).is_dir():
        raise FileNotFoundError(f"retrieval folder {spec.retrieval_train!r} does not exist")
    name = resolved_loss(spec)
    if spec.model_type == "cross":
        from embforge.losses.cross import get_cross_loss

        get_cross_loss(name, **spec.loss_options)  # an unknown name or option is a ValueError naming it
    elif spec.model_type in ("bi", "dense"):
        from embforge.losses import LOSSES

        if name not in LOSSES:
            close = difflib.get_close_matches(name, LOSSES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown loss {name!r}{hint}; choose one of {', '.join(LOSSES)}")


def run(spec: RunSpec) -> dict[str, Any]:
    """Load the model, build tasks and the evaluator, train, and return the training summary.

    What is trained is printed to stderr (model, tasks with rows and loss, evaluation metric), so no default
    is applied silently. The inputs are checked (:func:`check_inputs`), and the output folder claimed
    (:func:`~embforge.training.artifacts.claim_output`: a folder in use needs ``--resume`` or ``--overwrite``),
    before the model loads.
    """
    check_inputs(spec)
    claim_output(spec.config.output, resume=spec.config.checkpoints.resume, overwrite=spec.overwrite)
    model = load_model(spec)
    tasks = build_tasks(spec, model) if spec.train or not spec.retrieval_train else []
    evaluator = make_evaluator(spec.eval, model, columns=spec.columns) if spec.eval else None
    refresher = None
    if spec.retrieval_train:
        tasks, refresher, retrieval_eval = _retrieval_setup(spec, model, tasks)
        evaluator = retrieval_eval or evaluator
    if not spec.config.quiet:
        described = ", ".join(
            f"{t.name} ({row_count(t.data) or 'streamed'} rows, loss {t.loss.name})" for t in tasks
        )
        print(f"train: {spec.model} ({spec.model_type}-encoder) on {described}", file=sys.stderr)
    return train(model, tasks, spec.config, evaluator=evaluator, refresher=refresher)


def _refresh_config(spec: RunSpec) -> RefreshConfig | None:
    """The mined negatives of a retrieval run and their ANCE refresh schedule; ``None``: in-batch negatives only."""
    from embforge.retrieval.mining import MiningConfig
    from embforge.training.refresh import RefreshConfig

    if spec.num_negatives == 0:
        return None
    mining = MiningConfig(method=spec.mine_method, num_negatives=spec.num_negatives, relative_margin=0.05)
    return RefreshConfig(
        every=spec.refresh_negatives_every,
        hard_ratio_start=spec.hard_ratio_start,
        hard_ratio_end=spec.hard_ratio_end,
        mining=mining,
    )


def _retrieval_setup(
    spec: RunSpec, model: Trainable, tasks: list[Task]
) -> tuple[list[Task], Refresher | None, Evaluator | None]:
    """Mined-negative retrieval task (+ ANCE refresh hook, + retrieval evaluator) from ``spec.retrieval_*``."""
    from embforge.data.folders import load_retrieval_folder
    from embforge.evaluate.retrieval import retrieval_evaluator
    from embforge.training.refresh import retrieval_training

    assert spec.retrieval_train is not None
    mines_with_model = (spec.num_negatives > 0 and spec.mine_method != "bm25") or spec.refresh_negatives_every
    record = kind_record(model)
    if not record.single_vector and mines_with_model:
        raise ValueError(
            f"a {record.kind.value} model does not mine its own negatives yet: use --mine-method bm25 (or "
            "--num-negatives 0), or mine with a dense model ('embforge mine') and train on that file"
        )
    data = load_retrieval_folder(spec.retrieval_train, spec.retrieval_split)
    rows = sum(1 for rel in data.qrels.values() for grade in rel.values() if grade > 0)
    steps = planned_steps([row_count(t.data) for t in tasks] + [rows], spec.config)
    pairs = training_pairs(data)
    loss = make_loss(resolved_loss(spec), model=model, data=pairs, options=spec.loss_options)
    tasks, refresher = retrieval_training(
        model,
        data=data,
        loss=loss,
        refresh=_refresh_config(spec),
        total_steps=steps,
        output=spec.config.output,
        other_tasks=tasks,
        resume=spec.config.checkpoints.resume,
    )
    evaluator = None
    if spec.retrieval_eval_split:
        evaluator = retrieval_evaluator(
            load_retrieval_folder(spec.retrieval_train, spec.retrieval_eval_split)
        )
    return tasks, refresher, evaluator
