"""Training runs: a TOML file with ``[[stages]]`` run in order, resumable at stage and step; a single run is a
one-stage pipeline (:func:`embforge.training.run.as_pipeline`) trained in its output folder itself.

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
                                    # (refresh_every = N: re-mined with the current model every N steps)
    eval = "stsb:validation"        # optional: evaluated during the stage (eval_every, metric); best/ kept

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

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embforge.data.sources import row_count
from embforge.kinds import ModelKind, kind_record
from embforge.training.artifacts import OutputInUse, claim_output, link_identical
from embforge.training.builders import load_model, model_dim
from embforge.training.checkpoints import atomic_dir, write_text_atomic
from embforge.training.distributed import barrier, init_from_env, is_main
from embforge.training.loop import train
from embforge.training.pipeline_file import (
    EvalSpec,
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
from embforge.training.stage_tasks import build_stage_tasks, check_stage, stage_evaluator, where

if TYPE_CHECKING:
    from embforge.training.tasks import Task
    from embforge.training.trainer import Trainable

__all__ = [
    "EvalSpec",
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


def validate_pipeline(
    pipeline: Pipeline,
    *,
    dim: int | None,
    kind: ModelKind | str = "dense",
    kept: dict[str, Any] | None = None,
) -> None:
    """Check every stage (:func:`check_stage`) up front, for a model of ``kind`` and dimension ``dim`` (``None``
    for a cross-encoder); the first stage's sources are kept in ``kept`` when given (it trains next)."""
    for i, stage in enumerate(pipeline.stages, 1):
        check_stage(stage, i, pipeline, dim=dim, kind=kind, kept=kept if i == 1 else None)


def load_pipeline_model(pipeline: Pipeline) -> Trainable:
    """The model the pipeline starts from, of its ``model_type`` (:func:`~embforge.training.builders.load_model`;
    LoRA as the first stage asks, a cross-encoder's new head sized for the first stage's losses)."""
    first = pipeline.stages[0]
    return load_model(
        pipeline.model,
        pipeline.model_type,
        config=first.config,
        losses=[task.loss for task in first.tasks],
        max_seq_length=pipeline.max_seq_length,
        bidirectional=pipeline.bidirectional,
    )


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
        pipeline: A parsed pipeline (:func:`load_pipeline`), or a single run's (``pipeline.single``).
        output: Overrides the file's ``output`` folder.
        model: An already loaded model of any kind to train in place, e.g. a
            :class:`~embforge.cross_encoder.CrossEncoder` (else the pipeline's ``model`` is loaded as its
            ``model_type``).
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
        summaries]}``; the final model is saved in ``<output>/final`` (a single run's is ``output`` itself).
    """
    named = {"seed": seed, "device": device, "quiet": quiet, "allow_data_change": allow_data_change}
    named = {key: value for key, value in named.items() if value is not None}  # unset: the overrides' value
    pipeline, overridden = overridden_pipeline(pipeline, output, {**(overrides or {}), **named})
    out = Path(pipeline.output)
    try:  # a folder in use: --resume continues its stages, --overwrite empties it (training/artifacts.py)
        claim_output(out, resume=resume, overwrite=overwrite)
    except OutputInUse as err:
        raise (err if pipeline.single else PipelineError(f"{pipeline.source}: {err}")) from None
    model = load_pipeline_model(pipeline) if model is None else model
    kept: dict[str, Any] = {}  # the first stage's data, read once
    validate_pipeline(
        pipeline, dim=model_dim(model), kind=kind_record(model).kind, kept=kept
    )  # before writing
    init_from_env()  # torchrun: every process runs every stage (training/distributed.py), rank 0 writes
    barrier()  # every process has looked at the output before any creates a stage folder
    summaries = _run_stages(pipeline, model, on_step, resume=resume, kept=kept)
    final = out if pipeline.single else out / "final"
    if is_main() and not pipeline.single:
        atomic_dir(final, model.save)
        link_identical(final, stage_dir(pipeline, len(pipeline.stages)))  # one copy of the weights
    barrier()
    return {"output": str(out), "final": str(final), "overridden": overridden, "stages": summaries}


def _run_stages(
    pipeline: Pipeline,
    model: Any,
    on_step: Callable[[int, int], None] | None,
    *,
    resume: bool,
    kept: dict[str, Any],
) -> list[dict[str, Any]]:
    """Train ``model`` through the stages in order: a finished stage's summary is read back (its model loaded
    before the next stage trains), an unfinished one resumes from its checkpoints; the stages' summaries."""
    summaries: list[dict[str, Any]] = []
    loaded_from: Path | None = None
    for i, stage in enumerate(pipeline.stages, 1):
        folder = stage_dir(pipeline, i)
        done = folder / "stage_done.json"
        if done.exists() and not pipeline.single:
            summaries.append(json.loads(done.read_text()))
            loaded_from = folder
            continue
        if loaded_from is not None:  # resuming: start from the last finished stage's model
            model.load_weights(loaded_from)
            loaded_from = None
        folder.mkdir(parents=True, exist_ok=True)
        resumed = resume and (pipeline.single or (folder / "checkpoints").is_dir())
        evaluator = stage_evaluator(stage, i, pipeline, model)  # before mining: its needs are checked first
        tasks, refresher = build_stage_tasks(
            stage, i, pipeline, model=model, workdir=folder, resume=resumed, kept=kept if i == 1 else None
        )
        _say_what_trains(pipeline, i, tasks)
        config = stage.config.changed(output=str(folder), resume=resumed)
        step_hook = None if on_step is None else (lambda step, _i=i: on_step(_i, step))
        trained = train(model, tasks, config, evaluator=evaluator, refresher=refresher, on_step=step_hook)
        if pipeline.single:
            return [trained]
        summary = {"stage": i, "name": stage.name, **trained}
        if is_main():
            write_text_atomic(done, json.dumps(summary, indent=2, default=float) + "\n")
        summaries.append(summary)
    if loaded_from is not None:  # every stage was already done
        model.load_weights(loaded_from)
    return summaries


def _say_what_trains(pipeline: Pipeline, index: int, tasks: list[Task]) -> None:
    """What a stage trains, on stderr (model, tasks with rows and loss), so no default is applied silently."""
    if pipeline.stages[index - 1].config.quiet:
        return
    described = ", ".join(
        f"{t.name} ({row_count(t.data) or 'streamed'} rows, loss {t.loss.name})" for t in tasks
    )
    stage = "" if pipeline.single else f"{where(pipeline, index, pipeline.stages[index - 1])}: "
    kind = f"{pipeline.model} ({pipeline.model_type}-encoder)"
    print(f"train: {stage}{kind} on {described}", file=sys.stderr)
