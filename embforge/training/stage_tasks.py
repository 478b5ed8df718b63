"""A stage's parts from its description: each task's data, teacher targets, mined negatives and loss, and the
stage's evaluator. A single run is a one-stage pipeline (:func:`embforge.training.run.as_pipeline`), so every
run's tasks are built here.

Errors name the pipeline file (or ``command line``), the stage, the task and the field.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embforge.data.builtin import DATASETS, load_builtin
from embforge.data.folders import load_retrieval_folder, retrieval_splits
from embforge.data.retrieval import RetrievalData, size_of, training_pairs
from embforge.data.sources import RowSource, SourceOptions, open_source, row_count
from embforge.data.tables import DataError, Dataset, read_table
from embforge.distill import targets
from embforge.distill.lists import candidate_lists
from embforge.kinds import kind_record
from embforge.losses.base import BaseLoss
from embforge.progress import phase
from embforge.training.builders import check_matryoshka, make_evaluator, make_loss, model_dim, new_loss
from embforge.training.config import planned_steps
from embforge.training.distributed import barrier, is_main
from embforge.training.loop import Evaluator, Refresher
from embforge.training.pipeline_file import (
    EvalSpec,
    Pipeline,
    PipelineDataError,
    PipelineError,
    Stage,
    TaskSpec,
)
from embforge.training.refresh import NegativeRefresher, RefreshConfig, RefreshHook, refresh_config
from embforge.training.tasks import Task

if TYPE_CHECKING:
    from embforge.kind_names import ModelKind
    from embforge.protocols import Kinded

__all__ = ["build_stage_tasks", "check_stage", "stage_evaluator", "where"]

Source = Dataset | RowSource | RetrievalData


def where(pipeline: Pipeline, index: int, stage: Stage) -> str:
    """How errors and progress lines name a stage: ``FILE: stage 2 ('name')``, or a single run's source."""
    return pipeline.source if pipeline.single else f"{pipeline.source}: stage {index} ({stage.name!r})"


def _load_source(data: str, split: str | None, options: SourceOptions, pipeline: Pipeline, at: str) -> Source:
    """Rows named by ``data``: a built-in ``name:split``, a retrieval folder (its ``split``), or a file, a folder
    of files or a Hub id read with ``options`` (:func:`~embforge.data.sources.open_source`); a path is relative to
    the pipeline file."""
    name, _, built_in_split = data.partition(":")
    try:
        if name in DATASETS:
            return load_builtin(name, built_in_split or split or "train")
        path = Path(data) if Path(data).is_absolute() else pipeline.base_dir / data
        if path.is_dir() and retrieval_splits(path):
            return load_retrieval_folder(path, split or "train")
        if not path.exists() and options.mode == "memory":
            raise PipelineError(
                f"{at}: field 'data' = {data!r}: no such file ({path}) and not a built-in data set "
                f"({', '.join(DATASETS)}, written name:split)"
            )
        return open_source(path if path.exists() else data, options)
    except PipelineError:
        raise
    except DataError as err:
        raise PipelineDataError(f"{at}: field 'data' = {data!r}: {err}") from None
    except (ValueError, FileNotFoundError) as err:
        raise PipelineError(f"{at}: field 'data' = {data!r}: {err}") from None


def _task_data(
    spec: TaskSpec, pipeline: Pipeline, at: str, kept: dict[str, Source] | None = None
) -> tuple[Source, Dataset | RowSource]:
    """A task's source (a RetrievalData for a retrieval set) and its training rows (``lists``, ``limit`` kept).
    Sources read in memory are kept in ``kept``, so the checks before training and the training read a file
    once."""
    problem = targets.check_teacher_task(spec.loss, spec.teacher, spec.lists, at)
    if problem:
        raise PipelineError(problem)
    key = repr((spec.data, spec.split, spec.columns, spec.header))
    source = (kept or {}).get(key)
    if source is None:
        with phase(f"train: {at}: reading {spec.data} ..."):
            pipeline.reading.bad_rows()  # one count of bad rows for all the run's sources
            options = dataclasses.replace(pipeline.reading, columns=spec.columns, header=spec.header)
            source = _load_source(spec.data, spec.split, options, pipeline, at)
        if kept is not None and isinstance(source, (Dataset, RetrievalData)):
            kept[key] = source
    data = training_pairs(source) if isinstance(source, RetrievalData) else source
    if not isinstance(data, Dataset):  # streamed or memory-mapped rows
        needs_table = {"lists": spec.lists, "limit": spec.limit, "teacher": spec.teacher, "mine": spec.mine}
        for key, value in needs_table.items():
            if value is not None:
                raise PipelineError(f"{at}: field {key!r} needs the rows in memory (data_mode 'memory')")
        return source, data
    if spec.lists is not None:
        try:
            data = candidate_lists(data, size=spec.lists, seed=targets.LISTS_SEED)
        except (TypeError, ValueError) as err:
            raise PipelineError(f"{at}: field 'lists' = {spec.lists!r}: {err}") from None
    if spec.limit is not None:
        data = data.subset(list(range(min(spec.limit, len(data)))))
    return source, data


def _stage_loss(
    spec: TaskSpec, stage: Stage, data: Any, at: str, build: Callable[..., BaseLoss], base_dir: Path
) -> BaseLoss:
    """The task's loss from ``build`` (:func:`new_loss` for a model kind and dimension, or :func:`make_loss` for a
    model) with the stage's Matryoshka settings; a ``guide`` model folder is relative to the pipeline file, as a
    teacher is. An error names the stage, task and field."""
    options = dict(spec.options)
    if isinstance(options.get("guide"), str):
        options["guide"] = targets.resolve_teacher(options["guide"], base_dir)
    try:
        return build(
            spec.loss,
            data=data,
            options=options,
            matryoshka_dims=stage.matryoshka_dims,
            matryoshka_weights=stage.matryoshka_weights,
        )
    except ValueError as err:
        raise PipelineError(f"{at}: field 'loss' = {spec.loss!r}: {err}") from None


def _task(spec: TaskSpec, data: Dataset | RowSource, loss: BaseLoss, at: str) -> Task:
    """The task, its data checked against what its loss needs."""
    task = Task(spec.name, data, loss, weight=spec.weight)
    try:
        task.validate()
    except DataError as err:
        raise PipelineError(f"{at}: field 'data' = {spec.data!r} does not fit the loss: {err}") from None
    return task


def _mining(spec: TaskSpec, kind: ModelKind | str, at: str) -> RefreshConfig:
    """The task's ``mine = {...}`` checked for a model of ``kind``."""
    try:
        refresh = refresh_config(spec.mine or {})
    except ValueError as err:
        raise PipelineError(f"{at}: field 'mine': {err}") from None
    record = kind_record(kind)
    if spec.loss in targets.SCORE_LOSSES and spec.teacher is not None:
        raise PipelineError(
            f"{at}: field 'mine': the teacher scores the task's rows before negatives are mined; mine "
            "them in a file first ('embforge mine') and give the teacher that file"
        )
    if record.pair_scoring:
        raise PipelineError(
            f"{at}: field 'mine': negatives are mined with an embedding model, and a cross-encoder "
            "scores pairs; mine them in a file first ('embforge mine') and train on that file"
        )
    if not record.single_vector and (refresh.mining.method != "bm25" or refresh.every):
        raise PipelineError(
            f"{at}: field 'mine': a {record.kind.value} model does not mine its own negatives yet: use "
            "--mine-method bm25 (method = 'bm25' in a task's mine) or --num-negatives 0, or mine with a dense "
            "model ('embforge mine') and train on that file"
        )
    return refresh


def check_stage(
    stage: Stage,
    index: int,
    pipeline: Pipeline,
    *,
    dim: int | None,
    kind: ModelKind | str = "dense",
    kept: dict[str, Source] | None = None,
) -> None:
    """Check a stage before anything is written: its data exist and have the columns its losses need; the loss
    names, options and mining settings are valid (for a model of ``kind`` and dimension ``dim``); the sources
    read are kept in ``kept`` when given (:func:`build_stage_tasks` then reads none again)."""
    at_stage = where(pipeline, index, stage)
    problem = check_matryoshka(stage.matryoshka_dims, dim)
    if problem:
        raise PipelineError(f"{at_stage}: {problem}")
    refreshing = 0
    for spec in stage.tasks:
        at = f"{at_stage}, task {spec.name!r}"
        _, data = _task_data(spec, pipeline, at, kept)
        if spec.teacher is not None and isinstance(data, Dataset):  # the teacher's outputs will be the labels
            data = targets.placeholder_targets(data)
        build = functools.partial(new_loss, kind=kind, dim=dim)
        loss = _stage_loss(spec, stage, data, at, build, pipeline.base_dir)
        if spec.mine is not None and isinstance(data, Dataset):  # the rows mining reads
            refreshing += bool(_mining(spec, kind, at).every)
            data.require(["anchor", "positive"], purpose=f"mining for {at}")
        _task(spec, data, loss, at)
    if refreshing > 1:
        raise PipelineError(
            f"{at_stage}: at most one task of a stage refreshes its negatives (refresh_every)"
        )


def build_stage_tasks(
    stage: Stage,
    index: int,
    pipeline: Pipeline,
    *,
    model: Any,
    workdir: Path,
    resume: bool = False,
    kept: dict[str, Source] | None = None,
) -> tuple[list[Task], Refresher | None]:
    """A stage's tasks for ``model``: their data (from ``kept`` when :func:`check_stage` read them), the
    teachers' targets, mined negatives and losses; and the trainer's hook that refreshes a task's negatives, if
    one asks (``mine = { refresh_every = N }``)."""
    at_stage = where(pipeline, index, stage)
    problem = check_matryoshka(stage.matryoshka_dims, model_dim(model))
    if problem:
        raise PipelineError(f"{at_stage}: {problem}")
    rows: dict[str, tuple[Source, Any]] = {}
    loaded: dict[str, Any] = {}  # teachers, loaded once per stage
    for spec in stage.tasks:  # data first: a teacher task may give the model a projection the losses must see
        at = f"{at_stage}, task {spec.name!r}"
        source, data = _task_data(spec, pipeline, at, kept)
        if spec.teacher is not None:
            data = _with_teacher(spec, data, stage, pipeline, model, at, loaded)
        rows[spec.name] = source, data
    tasks, miners = [], []
    for spec in stage.tasks:
        at = f"{at_stage}, task {spec.name!r}"
        source, data = rows[spec.name]
        loss = _stage_loss(
            spec, stage, data, at, functools.partial(make_loss, model=model), pipeline.base_dir
        )
        if spec.mine is None:
            tasks.append(_task(spec, data, loss, at))
            continue
        mined_from = source if spec.limit is None and isinstance(source, RetrievalData) else data
        miner = NegativeRefresher(
            mined_from, loss, _mining(spec, kind_record(model).kind, at), total_steps=0, log_dir=workdir,
            name=spec.name,
        )  # fmt: skip
        refresh = miner.config
        n, method = refresh.mining.num_negatives, refresh.mining.method
        how = f"{n} {'BM25' if method == 'bm25' else method} negative{'s' * (n != 1)} per query"
        with phase(f"train: {at}: mining {how} ({size_of(mined_from)}) ..."):
            mined = miner.start(model, resume=resume)[0]
        tasks.append(_task(spec, mined.data, loss, at))
        miners.append(miner)
    hook = None
    steps = planned_steps([row_count(t.data) for t in tasks], stage.config) if miners else 0
    for miner in miners:  # the hard-negative ratio's schedule runs over the stage's steps
        miner.total_steps = steps
        if miner.config.every:
            hook = RefreshHook(miner, tasks)
    return tasks, hook


def _with_teacher(
    spec: TaskSpec, data: Any, stage: Stage, pipeline: Pipeline, model: Any, at: str, loaded: dict
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
        raise PipelineError(f"{at}: field 'teacher' = {spec.teacher!r}: {err}") from None


def stage_evaluator(stage: Stage, index: int, pipeline: Pipeline, model: Kinded) -> Evaluator | None:
    """What ``model`` is evaluated on during the stage (:func:`~embforge.training.builders.make_evaluator`)."""
    spec: EvalSpec | None = stage.eval
    if spec is None:
        return None
    at = f"{where(pipeline, index, stage)}, eval"
    data = _load_source(spec.data, spec.split, SourceOptions(columns=spec.columns), pipeline, at)
    if not isinstance(data, (Dataset, RetrievalData)):
        raise PipelineError(f"{at}: field 'eval' = {spec.data!r}: evaluation data is read in memory")
    try:
        return make_evaluator(data, model)
    except ValueError as err:
        raise PipelineError(f"{at}: {err}") from None
