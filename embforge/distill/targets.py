"""Teacher targets of pipeline tasks that learn from a teacher: ``teacher = "FOLDER"`` with
``loss = "mse_distill"`` or ``"similarity_distill"`` (dimension-free: no projection).

The teacher embeds the task's texts once (cached on disk by
:func:`embforge.distill.signals.with_teacher_embeddings`); those embeddings become the rows' labels. A student whose
dimension differs from the teacher's gets a learned projection (:func:`embforge.distill.projection.add_projection`)
before the stage's losses are built, started at the least-squares map from its pooled embeddings of the task's
texts to the teacher's (:func:`embforge.distill.projection.fit_projection`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embforge.data.tables import Dataset
from embforge.distill.projection import add_projection, fit_projection
from embforge.distill.signals import with_teacher_embeddings
from embforge.encoder import Encoder

TEACHER_LOSSES = ("mse_distill", "similarity_distill")
PROJECTED_LOSSES = ("mse_distill",)  # compare embeddings coordinate by coordinate: the dimensions must agree


def check_teacher_task(loss: str, teacher: str | None, where: str) -> str | None:
    """An error message when a task's ``teacher`` and ``loss`` do not go together, else ``None``."""
    if teacher is not None and loss not in TEACHER_LOSSES:
        return (
            f"{where}: field 'teacher' gives embedding targets, which only losses {' / '.join(TEACHER_LOSSES)} read "
            f"(got loss {loss!r}); use embforge score for margin_mse / kl_distill"
        )
    if teacher is None and loss in TEACHER_LOSSES:
        return f'{where}: loss {loss!r} needs the teacher\'s embeddings: add teacher = "FOLDER"'
    return None


def text_only(data: Dataset) -> Dataset:
    """``data`` without its ``score`` / ``label`` column (a distillation task's labels are the teacher's)."""
    return Dataset(
        data.path, {c: data.columns[c] for c in data.text_columns}, list(data.lines), data.label_names
    )


def placeholder_targets(data: Dataset) -> Dataset:
    """Text columns plus a zero ``score`` column: what validation checks before the teacher has run."""
    rows = text_only(data)
    rows.columns["score"] = [0.0] * len(rows)
    return rows


def resolve_teacher(name: str, base_dir: Path) -> str:
    """The teacher folder: relative to the pipeline file when it exists there, else as written (cwd or alias)."""
    candidate = Path(name) if Path(name).is_absolute() else base_dir / name
    return str(candidate) if candidate.exists() else name


def teacher_targets(
    data: Dataset,
    teacher: str | Path | Encoder,
    *,
    model: Encoder,
    cache_dir: str | Path,
    seed: int = 42,
    show_progress: bool = True,
    loaded: dict[str, Encoder] | None = None,
    project: bool = True,
) -> Dataset:
    """``data``'s text columns with the teacher's embeddings as labels; the model gets a projection if needed
    (``project``: the loss compares coordinates; ``False`` for a dimension-free loss such as
    ``similarity_distill``).

    ``teacher`` is an encoder or a folder / alias, loaded on the model's device (once per ``loaded`` dict: the
    tasks of a stage that share a teacher load it once).

    Raises:
        ValueError: When the model already projects to a dimension other than the teacher's.
    """
    if isinstance(teacher, (str, Path)):
        loaded = {} if loaded is None else loaded
        if str(teacher) not in loaded:
            loaded[str(teacher)] = Encoder.load(teacher, device=str(model.device))
        teacher = loaded[str(teacher)]
    projected = project and int(model.dim) != int(teacher.dim)
    if projected:
        if model.dense is not None:
            raise ValueError(
                f"the model already projects to {model.dim} dimensions but the teacher has {teacher.dim}"
            )
        add_projection(model, int(teacher.dim), seed=seed)
    targeted = with_teacher_embeddings(
        text_only(data), teacher, cache_dir=cache_dir, show_progress=show_progress
    )
    if projected:
        column = targeted.columns[targeted.text_columns[0]]
        labels = np.asarray(targeted.columns["score"])  # (rows, dim) or (rows, columns, dim)
        fit_projection(model, column, labels if labels.ndim == 2 else labels[:, 0], seed=seed)
    return targeted
