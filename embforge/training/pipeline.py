"""Multi-stage training pipelines: a TOML file with ``[[stages]]``, run in order, resumable at stage and step.

A pipeline file::

    model = "all-MiniLM-L6-v2"
    output = "runs/three-stage"
    max_seq_length = 128
    [defaults]                      # TrainConfig fields shared by every stage
    batch_size = 32

    [[stages]]
    name = "retrieval"
    lr = 5e-5
    steps = 100                     # or: epochs = 1
    matryoshka_dims = [384, 256, 128, 64]   # optional: every task's loss wrapped by Matryoshka
      [[stages.tasks]]
      name = "scifact"
      data = "scifact:train"        # a built-in data set (see DATASETS) or a file (relative to the TOML)
      loss = "infonce"
      weight = 1.0
      options = { temperature = 0.05 }
      mine = { method = "bm25", num_negatives = 1 }   # optional: hard negatives mined when the stage starts

Every stage is validated before any training starts (unknown keys or losses, data lacking the columns its loss
needs, Matryoshka dimensions above the model's); errors name the stage, the task and the field. Stage *k*
trains in ``<output>/stage-<k>-<name>`` with the trainer's own checkpoints, starts from stage *k-1*'s model, and
writes ``stage_done.json`` when finished; a rerun skips finished stages and resumes the unfinished one from its
last checkpoint (a stage that starts for the first time is a new run, not a resume). Mined data is saved in the stage folder so a resumed stage trains on the same rows.

A task with ``teacher = "FOLDER"`` and ``loss = "mse_distill"`` regresses the teacher's embeddings of its texts
(``loss = "similarity_distill"``: matches the teacher's in-batch similarities instead, with no projection),
computed when the stage starts and cached in the top-level ``teacher_cache`` folder (default
``<output>/teacher-cache``); a model of another dimension first gets a trained projection to the teacher's one
(:mod:`embforge.distill.targets`). With ``loss = "kl_distill"`` or ``"margin_mse"`` the teacher scores each row's
candidates instead (the rows ``embforge score`` would write, cached there too); ``lists = SIZE`` first groups a
reranking set's ``(query, candidate)`` rows into lists of ``SIZE`` candidates (``embforge score --lists SIZE``)::

      [[stages.tasks]]
      name = "wikiqa-lists"
      data = "wikiqa:train"
      lists = 8
      teacher = "models/all-mpnet-base-v2"
      loss = "kl_distill"
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embforge.data.builtin import DATASETS, load_builtin
from embforge.data.retrieval import size_of, training_pairs
from embforge.data.tables import DataError, Dataset, read_table
from embforge.distill import targets
from embforge.distill.lists import candidate_lists
from embforge.kinds import ModelKind, kind_record
from embforge.losses.base import BaseLoss
from embforge.progress import phase
from embforge.training.artifacts import OutputInUse, claim_output, link_identical
from embforge.training.checkpoints import atomic_dir, write_text_atomic
from embforge.training.distributed import barrier, init_from_env, is_main
from embforge.training.loop import train
from embforge.training.pipeline_file import (
    Pipeline,
    PipelineError,
    Stage,
    TaskSpec,
    is_pipeline,
    load_pipeline,
    overridden_pipeline,
    parse_pipeline,
    stage_dir,
)
from embforge.training.run import make_loss, model_dim, new_loss
from embforge.training.tasks import Task

if TYPE_CHECKING:
    from embforge.retrieval.mining import MiningConfig

__all__ = [
    "Pipeline",
    "PipelineError",
    "Stage",
    "TaskSpec",
    "build_stage_tasks",
    "check_stage",
    "is_pipeline",
    "load_pipeline",
    "parse_pipeline",
    "run_pipeline",
    "stage_dir",
    "validate_pipeline",
]


def _load_source(spec: TaskSpec, pipeline: Pipeline, where: str) -> Any:
    """The task's data: a built-in ``name:split`` or a file; a RetrievalData only for built-in retrieval sets."""
    name, _, split = spec.data.partition(":")
    if name in DATASETS:
        try:
            return load_builtin(name, split or "train")
        except (ValueError, FileNotFoundError) as err:
            raise PipelineError(f"{where}: field 'data' = {spec.data!r}: {err}") from None
    path = Path(spec.data)
    path = path if path.is_absolute() else pipeline.base_dir / path
    if not path.exists():
        raise PipelineError(
            f"{where}: field 'data' = {spec.data!r}: no such file ({path}) and not a built-in data set "
            f"({', '.join(DATASETS)}, written name:split)"
        )
    try:
        return read_table(path, columns=spec.columns)
    except DataError as err:
        raise PipelineError(f"{where}: field 'data': {err}") from None


def _as_training_rows(source: Any) -> Dataset:
    from embforge.data.retrieval import RetrievalData

    if isinstance(source, RetrievalData):
        return training_pairs(source)
    return source


def _where(pipeline: Pipeline, index: int, stage: Stage) -> str:
    return f"{pipeline.source}: stage {index} ({stage.name!r})"


def _check_matryoshka(stage: Stage, dim: int | None, where: str) -> None:
    """Matryoshka dimensions within the model's ``dim`` (a cross-encoder, ``dim=None``: its loss refuses them)."""
    if dim is not None and stage.matryoshka_dims and max(stage.matryoshka_dims) > dim:
        raise PipelineError(
            f"{where}: field 'matryoshka_dims': {max(stage.matryoshka_dims)} is larger than the model's "
            f"dimension {dim}; use values <= {dim}"
        )


def _task_data(spec: TaskSpec, pipeline: Pipeline, where: str) -> tuple[Any, Dataset]:
    """A task's source (a RetrievalData for a built-in retrieval set) and its training rows (``limit`` kept)."""
    problem = targets.check_teacher_task(spec.loss, spec.teacher, spec.lists, where)
    if problem:
        raise PipelineError(problem)
    with phase(f"train: {where}: reading {spec.data} ..."):
        source = _load_source(spec, pipeline, where)
    data = _as_training_rows(source)
    if spec.lists is not None:
        try:
            data = candidate_lists(data, size=spec.lists, seed=targets.LISTS_SEED)
        except (TypeError, ValueError) as err:
            raise PipelineError(f"{where}: field 'lists' = {spec.lists!r}: {err}") from None
    if spec.limit is not None:
        data = data.subset(list(range(min(spec.limit, len(data)))))
    return source, data


def _stage_loss(
    spec: TaskSpec, stage: Stage, data: Dataset, where: str, build: Callable[..., BaseLoss]
) -> BaseLoss:
    """The task's loss from ``build`` (:func:`new_loss` for a model kind and dimension, or :func:`make_loss` for a
    model) with the stage's Matryoshka settings; an error names the stage, task and field."""
    try:
        return build(
            spec.loss,
            data=data,
            options=spec.options,
            matryoshka_dims=stage.matryoshka_dims,
            matryoshka_weights=stage.matryoshka_weights,
        )
    except ValueError as err:
        raise PipelineError(f"{where}: field 'loss' = {spec.loss!r}: {err}") from None


def _task(spec: TaskSpec, data: Dataset, loss: BaseLoss, where: str) -> Task:
    """The task, its data checked against what its loss needs."""
    task = Task(spec.name, data, loss, weight=spec.weight)
    try:
        task.validate()
    except DataError as err:
        raise PipelineError(f"{where}: field 'data' = {spec.data!r} does not fit the loss: {err}") from None
    return task


def check_stage(
    stage: Stage, index: int, pipeline: Pipeline, *, dim: int | None, kind: ModelKind | str = "dense"
) -> None:
    """Check a stage before any model is loaded: its data exist and have the columns its losses need; the loss
    names, options and mining settings are valid; Matryoshka dimensions fit a model of ``dim`` (``None``: a
    cross-encoder)."""
    where_stage = _where(pipeline, index, stage)
    _check_matryoshka(stage, dim, where_stage)
    for spec in stage.tasks:
        where = f"{where_stage}, task {spec.name!r}"
        _, data = _task_data(spec, pipeline, where)
        if spec.teacher is not None:  # the teacher's embeddings or scores will be the labels
            data = targets.placeholder_targets(data)
        loss = _stage_loss(spec, stage, data, where, functools.partial(new_loss, kind=kind, dim=dim))
        if spec.mine is not None:  # the rows mining reads
            _mining_config(spec, where)
            if spec.loss in targets.SCORE_LOSSES and spec.teacher is not None:
                raise PipelineError(
                    f"{where}: field 'mine': the teacher scores the task's rows before negatives are mined; mine "
                    "them in a file first ('embforge mine') and give the teacher that file"
                )
            if kind_record(kind).pair_scoring:
                raise PipelineError(
                    f"{where}: field 'mine': negatives are mined with an embedding model, and a cross-encoder "
                    "scores pairs; mine them in a file first ('embforge mine') and train on that file"
                )
            data.require(["anchor", "positive"], purpose=f"mining for {where}")
        _task(spec, data, loss, where)


def build_stage_tasks(
    stage: Stage, index: int, pipeline: Pipeline, *, model: Any, workdir: Path
) -> list[Task]:
    """A stage's tasks for ``model``: their data, the teachers' targets, mined negatives and losses."""
    where_stage = _where(pipeline, index, stage)
    _check_matryoshka(stage, model_dim(model), where_stage)
    rows: dict[str, tuple[Any, Dataset]] = {}
    loaded: dict[str, Any] = {}  # teachers, loaded once per stage
    for spec in stage.tasks:  # data first: a teacher task may give the model a projection the losses must see
        where = f"{where_stage}, task {spec.name!r}"
        source, data = _task_data(spec, pipeline, where)
        if spec.teacher is not None:
            data = _with_teacher(spec, data, stage, pipeline, model, where, loaded)
        rows[spec.name] = source, data
    tasks = []
    for spec in stage.tasks:
        where = f"{where_stage}, task {spec.name!r}"
        source, data = rows[spec.name]
        loss = _stage_loss(spec, stage, data, where, functools.partial(make_loss, model=model))
        if spec.mine is not None:
            data = _mined(spec, source, data, model, workdir, where)
        tasks.append(_task(spec, data, loss, where))
    return tasks


def _with_teacher(
    spec: TaskSpec, data: Dataset, stage: Stage, pipeline: Pipeline, model: Any, where: str, loaded: dict
) -> Dataset:
    """The task's texts with the teacher's scores or embeddings as labels (cached), projecting the model if
    needed."""
    cache = pipeline.teacher_cache or str(Path(pipeline.output) / "teacher-cache")
    try:
        teacher = targets.resolve_teacher(str(spec.teacher), pipeline.base_dir)
        if spec.loss in targets.SCORE_LOSSES:
            scorer = targets.load_teacher(teacher, str(model.device), loaded)
            # torchrun: rank 0 scores, every process reads the file it wrote
            path = targets.scored_file(
                data, scorer, cache_dir=cache, show_progress=not stage.config.quiet, write=is_main()
            )
            barrier()
            return read_table(path)
        return targets.teacher_targets(
            data,
            teacher,
            model=model,
            cache_dir=cache,
            seed=stage.config.seed,
            show_progress=not stage.config.quiet,
            loaded=loaded,
            project=spec.loss in targets.PROJECTED_LOSSES,
        )
    except (OSError, ValueError) as err:
        raise PipelineError(f"{where}: field 'teacher' = {spec.teacher!r}: {err}") from None


def _mining_config(spec: TaskSpec, where: str) -> MiningConfig:
    from embforge.retrieval.mining import MiningConfig

    try:
        return MiningConfig(**(spec.mine or {}))
    except (TypeError, ValueError) as err:
        raise PipelineError(f"{where}: field 'mine': {err}") from None


def _mined(spec: TaskSpec, source: Any, data: Dataset, model: Any, workdir: Path, where: str) -> Dataset:
    """Hard negatives for a task, mined with the current model at the stage's start (cached in ``workdir``)."""
    from embforge.retrieval.mining import mine, write_jsonl
    from embforge.retrieval.sharded import sharded

    config = _mining_config(spec, where)
    cached = workdir / f"mined-{spec.name}.jsonl"
    if cached.exists():
        return read_table(cached)
    rows, n = (source if spec.limit is None else data), config.num_negatives
    how = f"{n} {'BM25' if config.method == 'bm25' else config.method} negative{'s' * (n != 1)} per query"
    with phase(f"train: {where}: mining {how} ({size_of(rows)}) ..."):
        mined = mine(
            sharded(model), rows, config
        )  # torchrun: each encodes a share, all get the rows; 0 writes
    if is_main():
        workdir.mkdir(parents=True, exist_ok=True)
        write_jsonl(mined, cached.with_suffix(".tmp"))
        cached.with_suffix(".tmp").replace(cached)
    barrier()
    return read_table(cached)


def validate_pipeline(pipeline: Pipeline, *, dim: int | None, kind: ModelKind | str = "dense") -> None:
    """Check every stage (:func:`check_stage`) up front, for a model of ``kind`` and dimension ``dim`` (``None``
    for a cross-encoder)."""
    for i, stage in enumerate(pipeline.stages, 1):
        check_stage(stage, i, pipeline, dim=dim, kind=kind)


def run_pipeline(
    pipeline: Pipeline,
    *,
    output: str | None = None,
    model: Any = None,
    device: str | None = None,
    quiet: bool | None = None,
    on_step: Callable[[int, int], None] | None = None,
    resume: bool = True,
    seed: int | None = None,
    overwrite: bool = False,
    allow_data_change: bool | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Validate, then run the stages in order, skipping finished ones and resuming an unfinished one.

    Args:
        pipeline: A parsed pipeline (:func:`load_pipeline`).
        output: Overrides the file's ``output`` folder.
        model: An already loaded model of any kind to train in place, e.g. a
            :class:`~embforge.cross_encoder.CrossEncoder` (else the file's ``model`` is loaded as an encoder).
        device: Overrides every stage's device.
        quiet: Overrides every stage's progress-bar setting.
        on_step: Called with ``(stage number, step)`` after every optimiser step.
        resume: Skip finished stages and resume the unfinished one from its last checkpoint; with ``False`` an
            output folder that is not empty is an error (nothing is overwritten) unless ``overwrite``.
        seed: Overrides every stage's seed (sampling, dropout, new heads and projections).
        overwrite: Empty an output folder that holds an earlier run first (with ``resume=False``).
        allow_data_change: Overrides every stage's ``allow_data_change`` (resume although data changed).
        overrides: Fields set in every stage (``lr``, ``batch_size`` ...) or on the pipeline (``model``):
            :func:`~embforge.training.pipeline_file.with_overrides`; a field that cannot apply to every stage
            (``loss``, ``train`` ...) is a :class:`PipelineError` naming it.

    Returns:
        ``{"output", "final", "overridden": {field: value set in every stage}, "stages": [per-stage training
        summaries]}``; the final model is saved in ``<output>/final``.
    """
    from embforge.encoder import Encoder

    named = {"seed": seed, "device": device, "quiet": quiet, "allow_data_change": allow_data_change}
    named = {key: value for key, value in named.items() if value is not None}  # unset: the overrides' value
    pipeline, overridden = overridden_pipeline(pipeline, output, {**(overrides or {}), **named})
    if model is None:
        model = Encoder.load(pipeline.model, max_seq_length=pipeline.max_seq_length)
    validate_pipeline(pipeline, dim=model_dim(model), kind=kind_record(model).kind)  # before any training
    out = Path(pipeline.output)
    try:  # a folder in use: --resume continues its stages, --overwrite empties it (training/artifacts.py)
        claim_output(out, resume=resume, overwrite=overwrite)
    except OutputInUse as err:
        raise PipelineError(f"{pipeline.source}: {err}") from None
    init_from_env()  # torchrun: every process runs every stage (training/distributed.py), rank 0 writes
    barrier()  # every process has looked at the output before any creates a stage folder
    out.mkdir(parents=True, exist_ok=True)
    summaries = _run_stages(pipeline, model, on_step)
    if is_main():
        atomic_dir(out / "final", model.save)
        link_identical(out / "final", stage_dir(pipeline, len(pipeline.stages)))  # one copy of the weights
    barrier()
    return {"output": str(out), "final": str(out / "final"), "overridden": overridden, "stages": summaries}


def _run_stages(
    pipeline: Pipeline, model: Any, on_step: Callable[[int, int], None] | None
) -> list[dict[str, Any]]:
    """Train ``model`` through the stages in order: a finished stage's summary is read back (its model loaded
    before the next stage trains), an unfinished one resumes from its checkpoints; the stages' summaries."""
    summaries: list[dict[str, Any]] = []
    loaded_from: Path | None = None
    for i, stage in enumerate(pipeline.stages, 1):
        folder = stage_dir(pipeline, i)
        done = folder / "stage_done.json"
        if done.exists():
            summaries.append(json.loads(done.read_text()))
            loaded_from = folder
            continue
        if loaded_from is not None:  # resuming: start from the last finished stage's model
            model.load_weights(loaded_from)
            loaded_from = None
        tasks = build_stage_tasks(stage, i, pipeline, model=model, workdir=folder)
        config = stage.config.changed(output=str(folder), resume=(folder / "checkpoints").is_dir())
        step_hook = None if on_step is None else (lambda step, _i=i: on_step(_i, step))
        summary = {"stage": i, "name": stage.name, **train(model, tasks, config, on_step=step_hook)}
        if is_main():
            write_text_atomic(done, json.dumps(summary, indent=2, default=float) + "\n")
        summaries.append(summary)
    if loaded_from is not None:  # every stage was already done
        model.load_weights(loaded_from)
    return summaries
