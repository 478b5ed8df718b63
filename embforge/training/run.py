"""A training run described by data: which model, which files and loss, which hyper-parameters.

The CLI and TOML files build a :class:`RunSpec`; :func:`run` turns it into a one-stage pipeline
(:func:`as_pipeline`) and runs it as every pipeline runs (:func:`embforge.training.pipeline.run_pipeline`): the
same task building, mining, evaluation and model loading, trained in the run's output folder itself.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embforge.data.sources import SourceOptions
from embforge.kinds import kind_record
from embforge.training.builders import make_evaluator, make_loss, model_dim, new_loss, with_lora
from embforge.training.pipeline import load_pipeline_model, run_pipeline
from embforge.training.pipeline_file import EvalSpec, Pipeline, Stage, TaskSpec
from embforge.training.spec import RunSpec, load_toml, spec_from_dict
from embforge.training.stage_tasks import build_stage_tasks

if TYPE_CHECKING:
    from embforge.training.tasks import Task
    from embforge.training.trainer import Trainable

__all__ = [
    "RunSpec",
    "as_pipeline",
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
    "spec_from_dict",
    "with_lora",
]


def resolved_loss(spec: RunSpec) -> str:
    """The loss a run trains with: ``spec.loss``, else the kind's ``retrieval_loss`` for a retrieval run and its
    ``default_loss`` otherwise (:mod:`embforge.kinds`: ``cosent`` for dense, ``splade`` for sparse, ``infonce``
    for multi-vector models)."""
    if spec.loss is not None:
        return spec.loss
    record = kind_record(spec.model_type)
    return record.retrieval_loss if spec.retrieval_train else record.default_loss


def _retrieval_task(spec: RunSpec) -> TaskSpec:
    """``--retrieval-train FOLDER``: a task on the folder's qrels, its negatives mined (and refreshed) by the one
    mining mechanism of training (a task's ``mine``, :func:`embforge.training.refresh.refresh_config`)."""
    assert spec.retrieval_train is not None
    mine = None
    if spec.num_negatives:
        mine = {
            "method": spec.mine_method,
            "num_negatives": spec.num_negatives,
            "relative_margin": 0.05,
            "refresh_every": spec.refresh_negatives_every,
            "hard_ratio_start": spec.hard_ratio_start,
            "hard_ratio_end": spec.hard_ratio_end,
        }
    return TaskSpec(
        "retrieval",
        spec.retrieval_train,
        resolved_loss(spec),
        options=spec.loss_options,
        split=spec.retrieval_split,
        mine=mine,
    )


def as_pipeline(spec: RunSpec, *, source: str = "command line") -> Pipeline:
    """The run as a one-stage pipeline: a task per training file (named by its stem) and one for the retrieval
    folder, the evaluation file or retrieval split as the stage's ``eval``; trained in ``output`` itself."""
    tasks = [
        TaskSpec(Path(path).stem, path, resolved_loss(spec), options=spec.loss_options, columns=spec.columns,
                 header=spec.header)
        for path in spec.train
    ]  # fmt: skip
    if spec.retrieval_train:
        tasks.append(_retrieval_task(spec))
    evaluation = None
    if spec.retrieval_eval_split and spec.retrieval_train:
        evaluation = EvalSpec(spec.retrieval_train, split=spec.retrieval_eval_split)
    elif spec.eval:
        evaluation = EvalSpec(spec.eval, columns=spec.columns)
    stage = Stage("train", tasks, spec.config, spec.matryoshka_dims, spec.matryoshka_weights, eval=evaluation)
    reading = SourceOptions(
        mode=spec.data_mode,
        max_bad_rows=spec.max_bad_rows,
        cache_dir=spec.data_cache,
        split=spec.data_split,
        window=spec.config.data.shuffle_window or SourceOptions.window,
    )
    return Pipeline(
        [stage],
        model=spec.model,
        output=spec.config.output,
        max_seq_length=spec.max_seq_length,
        model_type=spec.model_type,
        bidirectional=spec.bidirectional,
        reading=reading,
        source=source,
        single=True,
    )


def load_model(spec: RunSpec) -> Trainable:
    """The model a run starts from (:func:`embforge.training.pipeline.load_pipeline_model` of its pipeline)."""
    return load_pipeline_model(as_pipeline(spec))


def build_tasks(spec: RunSpec, model: Any) -> list[Task]:
    """The run's tasks for ``model``, built as a pipeline stage's are."""
    pipeline = as_pipeline(spec)
    output = Path(spec.config.output)
    return build_stage_tasks(pipeline.stages[0], 1, pipeline, model=model, workdir=output)[0]


# a training path with one of these suffixes is a file that must exist (others may be folders or data set ids)
_TABLE_SUFFIXES = (".csv", ".tsv", ".txt", ".jsonl", ".json", ".parquet")


def check_inputs(spec: RunSpec) -> None:
    """What can be checked in milliseconds, before a model takes seconds to load: there is training data, the
    files exist, the evaluation is named once, and the loss is one the model type has.

    Raises:
        FileNotFoundError: a training or evaluation file, or the retrieval folder, does not exist.
        ValueError: no training data, an unknown loss name (with the names there are).
    """
    if not spec.train and not spec.retrieval_train:
        raise ValueError("no training data: pass --train FILE (or train = [...] in the config file)")
    for path in spec.train:
        if Path(path).suffix.lower() in _TABLE_SUFFIXES and not Path(path).is_file():
            raise FileNotFoundError(f"training file {path!r} does not exist")
    if spec.eval and not Path(spec.eval).is_file():
        raise FileNotFoundError(f"evaluation file {spec.eval!r} does not exist")
    if spec.retrieval_train and not Path(spec.retrieval_train).is_dir():
        raise FileNotFoundError(f"retrieval folder {spec.retrieval_train!r} does not exist")
    if spec.eval and spec.retrieval_eval_split and spec.retrieval_train:
        raise ValueError("--eval and --retrieval-eval-split both name what is evaluated; give one of them")
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


def run(spec: RunSpec, *, source: str = "command line") -> dict[str, Any]:
    """Check the inputs (:func:`check_inputs`), then train the run as a one-stage pipeline in its output folder
    and return the training summary.

    What is trained is printed to stderr (model, tasks with rows and loss), so no default is applied silently.
    The output folder is claimed (:func:`~embforge.training.artifacts.claim_output`: a folder in use needs
    ``--resume`` or ``--overwrite``) before the model loads.
    """
    check_inputs(spec)
    checkpoints = spec.config.checkpoints
    result = run_pipeline(
        as_pipeline(spec, source=source), resume=checkpoints.resume, overwrite=spec.overwrite
    )
    return dict(result["stages"][0])
