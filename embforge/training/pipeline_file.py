"""A pipeline file read: its ``[[stages]]`` and ``[[stages.tasks]]`` as dataclasses, field names and types checked.

:mod:`embforge.training.pipeline` checks the stages' data and losses and runs them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embforge.data.sources import MODES, SourceOptions
from embforge.fields import about_field
from embforge.files import DataError
from embforge.modeling.resolve import DEFAULT_MODEL
from embforge.training.config import FLAT_FIELDS, TrainConfig
from embforge.training.spec import RunSpec, load_toml


class PipelineError(ValueError):
    """A problem in a pipeline file; the message names the file, stage, task and field."""


class PipelineDataError(PipelineError, DataError):
    """A bad row in a task's data: a :class:`PipelineError` naming the task, and a
    :class:`~embforge.files.DataError` naming the file, line and column."""


# the model and how files are read: one value for the whole pipeline (RunSpec fields of the same names)
_MODEL_KEYS = {"model", "model_type", "bidirectional", "max_seq_length"}
_READING = {
    "data_mode": "mode",
    "data_cache": "cache_dir",
    "data_split": "split",
    "max_bad_rows": "max_bad_rows",
}
_READING_KEYS = set(_READING)
_TOP_KEYS = {"output", "defaults", "stages", "teacher_cache"} | _MODEL_KEYS | _READING_KEYS
_CONFIG_FIELDS = set(FLAT_FIELDS) - {"output", "resume", "max_steps"}
_STAGE_KEYS = {"name", "tasks", "steps", "eval", "matryoshka_dims", "matryoshka_weights"} | _CONFIG_FIELDS


@dataclass
class TaskSpec:
    """One task of a stage, as written in the file.

    ``data`` is a built-in ``name:split``, a file, a folder of data files (``data_mode`` mmap/stream), a
    retrieval folder (BEIR or SciFact: its ``split`` qrels, default train) or a Hub data set id (mmap/stream).
    ``mine`` asks for hard negatives (:func:`embforge.training.refresh.refresh_config`: how, and how often they
    are refreshed)."""

    name: str
    data: str
    loss: str
    weight: float = 1.0
    options: dict[str, Any] = field(default_factory=dict)
    columns: str | dict[str, str] | None = None
    header: bool | None = None  # whether a CSV/TSV file has a header row (None: detected)
    split: str | None = None  # a retrieval folder's qrels split
    mine: dict[str, Any] | None = None
    limit: int | None = None
    teacher: str | None = None
    lists: int | None = None  # group (query, candidate) rows into lists of this size for the teacher to score


_TASK_KEYS = {f.name for f in dataclasses.fields(TaskSpec)}


@dataclass
class EvalSpec:
    """What a stage is evaluated on during training (the best value keeps ``best/``): a built-in
    ``name:split``, a file of scored pairs (``columns`` as for a task), or a retrieval folder's ``split``."""

    data: str
    split: str | None = None
    columns: str | dict[str, str] | None = None


@dataclass
class Stage:
    """One stage: its tasks, the trainer settings (its ``output`` and ``resume`` are set when it runs) and the
    Matryoshka dimensions."""

    name: str
    tasks: list[TaskSpec]
    config: TrainConfig
    matryoshka_dims: list[int] | None = None
    matryoshka_weights: list[float] | None = None
    eval: EvalSpec | None = None


@dataclass
class Pipeline:
    """A parsed pipeline file, or a single run (``single``: its one stage trains in ``output`` itself, with no
    ``stage-1-*`` folder and no ``final`` copy; :func:`embforge.training.run.as_pipeline`)."""

    stages: list[Stage]
    model: str = DEFAULT_MODEL
    output: str = "output"
    max_seq_length: int | None = None
    model_type: str = "dense"  # a kind of embforge.kinds (RunSpec.model_type)
    bidirectional: bool = False
    reading: SourceOptions = field(default_factory=SourceOptions)  # how the tasks' files are read
    source: str = "pipeline"
    base_dir: Path = field(default_factory=Path.cwd)
    teacher_cache: str | None = None  # None: <output>/teacher-cache
    single: bool = False


def _unknown(keys: set[str], allowed: set[str], where: str) -> None:
    extra = sorted(keys - allowed)
    if extra:
        raise PipelineError(
            f"{where}: unknown field(s) {', '.join(extra)}; valid: {', '.join(sorted(allowed))}"
        )


def _not_honoured(keys: set[str], where: str) -> None:
    """A config field a pipeline cannot honour (LoRA, evaluation: what the field declares) is an error naming it,
    never a value silently ignored."""
    for key in sorted(keys & _CONFIG_FIELDS):
        reason = about_field(TrainConfig, key).pipeline
        if reason:
            raise PipelineError(f"{where}: field {key!r}: {reason}")


def parse_pipeline(
    values: dict[str, Any], *, source: str = "pipeline", base_dir: Path | None = None
) -> Pipeline:
    """Build a :class:`Pipeline` from a TOML dict, checking field names and types (not yet data or model)."""
    _unknown(set(values), _TOP_KEYS, source)
    stages_raw = values.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise PipelineError(
            f"{source}: no [[stages]]; a pipeline needs at least one stage with [[stages.tasks]]"
        )
    defaults = dict(values.get("defaults", {}))
    _unknown(set(defaults), _CONFIG_FIELDS, f"{source}: [defaults]")
    _not_honoured(set(defaults), f"{source}: [defaults]")
    stages = []
    for i, raw in enumerate(stages_raw, 1):
        name = str(raw.get("name", f"stage{i}"))
        where = f"{source}: stage {i} ({name!r})"
        _unknown(set(raw), _STAGE_KEYS, where)
        _not_honoured(set(raw), where)
        tasks_raw = raw.get("tasks")
        if not isinstance(tasks_raw, list) or not tasks_raw:
            raise PipelineError(f"{where}: field 'tasks' is missing or empty; add [[stages.tasks]] tables")
        tasks = []
        for j, t in enumerate(tasks_raw, 1):
            task_where = f"{where}, task {j} ({t.get('name', '?')!r})"
            _unknown(set(t), _TASK_KEYS, task_where)
            for key in ("data", "loss"):
                if not isinstance(t.get(key), str):
                    raise PipelineError(f"{task_where}: field {key!r} is required (a string)")
            tasks.append(TaskSpec(**{"name": t.get("name", f"task{j}"), **t}))
        settings = {**defaults, **{k: v for k, v in raw.items() if k in _CONFIG_FIELDS}}
        if "steps" in raw:
            settings["max_steps"] = raw["steps"]
        try:
            config = TrainConfig(**settings)
        except (TypeError, ValueError) as err:
            raise PipelineError(f"{where}: {err}") from None
        matryoshka = raw.get("matryoshka_dims"), raw.get("matryoshka_weights")
        stages.append(Stage(name, tasks, config, *matryoshka, eval=_eval_spec(raw.get("eval"), where)))
    model = {key: values[key] for key in _MODEL_KEYS if key in values}
    return Pipeline(
        stages,
        **model,
        output=values.get("output", "output"),
        reading=_reading(values, source),
        source=source,
        base_dir=base_dir or Path.cwd(),
        teacher_cache=values.get("teacher_cache"),
    )


def _eval_spec(value: Any, where: str) -> EvalSpec | None:
    """A stage's ``eval``: ``"name:split"`` or a file, or ``{ data = ..., split = ..., columns = ... }``."""
    if value is None or isinstance(value, str):
        return None if value is None else EvalSpec(value)
    if isinstance(value, dict) and isinstance(value.get("data"), str):
        _unknown(set(value), {f.name for f in dataclasses.fields(EvalSpec)}, f"{where}: field 'eval'")
        return EvalSpec(**value)
    raise PipelineError(f"{where}: field 'eval' is a data set or file, or a table with 'data' (a string)")


def _reading(values: Mapping[str, Any], source: str, base: SourceOptions | None = None) -> SourceOptions:
    """How the pipeline's files are read: ``base`` with the ``data_mode`` ... keys of ``values`` set
    (:class:`~embforge.data.sources.SourceOptions`)."""
    given = {_READING[key]: value for key, value in values.items() if key in _READING}
    options = dataclasses.replace(base or SourceOptions(), **given)
    if options.mode not in MODES:
        raise PipelineError(f"{source}: field 'data_mode': one of {', '.join(MODES)}, got {options.mode!r}")
    return options


def load_pipeline(path: str | Path) -> Pipeline:
    """Read and parse a pipeline TOML file (paths inside it are relative to the file)."""
    path = Path(path)
    return parse_pipeline(load_toml(path), source=str(path), base_dir=path.resolve().parent)


def is_pipeline(values: dict[str, Any]) -> bool:
    """Whether a TOML dict describes a pipeline (has ``[[stages]]``) rather than a single run."""
    return "stages" in values


_TOP_OVERRIDES = _MODEL_KEYS | _READING_KEYS
_STAGE_OVERRIDES = {"matryoshka_dims", "matryoshka_weights"}


def refusal(key: str) -> str | None:
    """Why a single run's field ``key`` cannot be given with a pipeline file (what the field declares, e.g.
    ``loss``: each task names its own); ``None`` when it overrides every stage or the pipeline's model."""
    for owner, names in (
        (RunSpec, {f.name for f in dataclasses.fields(RunSpec)}),
        (TrainConfig, FLAT_FIELDS),
    ):
        if key in names and about_field(owner, key).pipeline:
            return about_field(owner, key).pipeline
    if key in _TOP_OVERRIDES or key in _STAGE_OVERRIDES or key in _CONFIG_FIELDS | {"max_steps"}:
        return None
    return "it is not a field of a pipeline"


def with_overrides(pipeline: Pipeline, values: Mapping[str, Any]) -> tuple[Pipeline, dict[str, Any]]:
    """``pipeline`` with ``values`` (those not ``None``) set in every stage (TrainConfig and Matryoshka fields)
    or on the pipeline (``model``, ``max_seq_length``), and what was set. ``epochs`` without ``max_steps``
    also clears every stage's ``steps``.

    Raises:
        PipelineError: a field that cannot apply to every stage (:func:`refusal`), or a value out of range.
    """
    given = {key: value for key, value in values.items() if value is not None}
    for key in given:
        reason = refusal(key)
        if reason:
            raise PipelineError(f"{pipeline.source}: {key} cannot be set for a pipeline: {reason}")
    if "epochs" in given and "max_steps" not in given:
        given["max_steps"] = None
    config = {k: v for k, v in given.items() if k in _CONFIG_FIELDS | {"max_steps"}}
    stage = {k: v for k, v in given.items() if k in _STAGE_OVERRIDES}
    try:
        stages = [
            dataclasses.replace(s, config=dataclasses.replace(s.config, **config), **stage)
            for s in pipeline.stages
        ]
    except (TypeError, ValueError) as err:
        raise PipelineError(f"{pipeline.source}: {err}") from None
    top = {k: v for k, v in given.items() if k in _MODEL_KEYS}
    reading = _reading(given, pipeline.source, pipeline.reading)
    return dataclasses.replace(pipeline, stages=stages, reading=reading, **top), given


def overridden_pipeline(
    pipeline: Pipeline, output: str | None, given: Mapping[str, Any]
) -> tuple[Pipeline, dict[str, Any]]:
    """``pipeline`` with the fields ``given`` set in every stage and its output folder
    replaced by ``output`` when given; and the fields set, said on stderr unless quiet."""
    pipeline, overridden = with_overrides(
        pipeline, {key: value for key, value in given.items() if value is not None}
    )
    pipeline = dataclasses.replace(pipeline, output=pipeline.output if output is None else output)
    if overridden and not pipeline.stages[0].config.quiet:
        changed = ", ".join(f"{key} = {value!r}" for key, value in overridden.items())
        print(f"train: {pipeline.source}: set in every stage: {changed}", file=sys.stderr)
    return pipeline, overridden


def stage_dir(pipeline: Pipeline, index: int) -> Path:
    """The folder of stage ``index`` (from 1): ``OUTPUT/stage-1-NAME``; a single run's: ``OUTPUT``."""
    if pipeline.single:
        return Path(pipeline.output)
    return Path(pipeline.output) / f"stage-{index}-{pipeline.stages[index - 1].name}"
