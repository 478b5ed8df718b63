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

from embforge.fields import about_field
from embforge.modeling.resolve import DEFAULT_MODEL
from embforge.training.config import FLAT_FIELDS, TrainConfig
from embforge.training.spec import RunSpec, load_toml


class PipelineError(ValueError):
    """A problem in a pipeline file; the message names the file, stage, task and field."""


_TASK_KEYS = {"name", "data", "loss", "weight", "options", "columns", "mine", "limit", "teacher", "lists"}
_TOP_KEYS = {"model", "output", "max_seq_length", "defaults", "stages", "teacher_cache"}
_CONFIG_FIELDS = set(FLAT_FIELDS) - {"output", "resume", "max_steps"}
_STAGE_KEYS = {"name", "tasks", "steps", "matryoshka_dims", "matryoshka_weights"} | _CONFIG_FIELDS


@dataclass
class TaskSpec:
    """One task of a stage, as written in the file."""

    name: str
    data: str
    loss: str
    weight: float = 1.0
    options: dict[str, Any] = field(default_factory=dict)
    columns: str | dict[str, str] | None = None
    mine: dict[str, Any] | None = None
    limit: int | None = None
    teacher: str | None = None
    lists: int | None = None  # group (query, candidate) rows into lists of this size for the teacher to score


@dataclass
class Stage:
    """One stage: its tasks, the trainer settings (its ``output`` and ``resume`` are set when it runs) and the
    Matryoshka dimensions."""

    name: str
    tasks: list[TaskSpec]
    config: TrainConfig
    matryoshka_dims: list[int] | None = None
    matryoshka_weights: list[float] | None = None


@dataclass
class Pipeline:
    """A parsed pipeline file."""

    stages: list[Stage]
    model: str = DEFAULT_MODEL
    output: str = "output"
    max_seq_length: int | None = None
    source: str = "pipeline"
    base_dir: Path = field(default_factory=Path.cwd)
    teacher_cache: str | None = None  # None: <output>/teacher-cache


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
        stages.append(Stage(name, tasks, config, raw.get("matryoshka_dims"), raw.get("matryoshka_weights")))
    return Pipeline(
        stages,
        model=values.get("model", DEFAULT_MODEL),
        output=values.get("output", "output"),
        max_seq_length=values.get("max_seq_length"),
        source=source,
        base_dir=base_dir or Path.cwd(),
        teacher_cache=values.get("teacher_cache"),
    )


def load_pipeline(path: str | Path) -> Pipeline:
    """Read and parse a pipeline TOML file (paths inside it are relative to the file)."""
    path = Path(path)
    return parse_pipeline(load_toml(path), source=str(path), base_dir=path.resolve().parent)


def is_pipeline(values: dict[str, Any]) -> bool:
    """Whether a TOML dict describes a pipeline (has ``[[stages]]``) rather than a single run."""
    return "stages" in values


_TOP_OVERRIDES = {"model", "max_seq_length"}
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
    top = {k: v for k, v in given.items() if k in _TOP_OVERRIDES}
    return dataclasses.replace(pipeline, stages=stages, **top), given


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
    """The folder of stage ``index`` (from 1): ``OUTPUT/stage-1-NAME``."""
    return Path(pipeline.output) / f"stage-{index}-{pipeline.stages[index - 1].name}"
