"""Teacher targets of pipeline tasks that learn from a teacher (``teacher = "FOLDER"``).

- ``loss = "mse_distill"`` or ``"similarity_distill"`` (dimension-free: no projection): the teacher's embeddings
  of the task's texts are the labels (:func:`teacher_targets`).
- ``loss = "kl_distill"`` or ``"margin_mse"``: the teacher's scores of each row's candidates are the labels
  (:func:`scored_file`), as ``embforge score`` would write them; with ``lists = SIZE`` the task's
  ``(query, candidate)`` rows are first grouped into candidate lists (:func:`embforge.distill.lists.candidate_lists`).
  The scored rows are cached as a JSONL file in the teacher cache, keyed by the teacher's weights and the rows.

For the embedding losses, the teacher embeds the task's texts once (cached on disk by
:func:`embforge.distill.signals.with_teacher_embeddings`); those embeddings become the rows' labels. A student whose
dimension differs from the teacher's gets a learned projection (:func:`embforge.distill.projection.add_projection`)
before the stage's losses are built, started at the least-squares map from its pooled embeddings of the task's
texts to the teacher's (:func:`embforge.distill.projection.fit_projection`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from embforge.cross_encoder import CrossEncoder, is_cross_encoder_folder
from embforge.data.tables import Dataset
from embforge.distill.projection import add_projection, fit_projection
from embforge.distill.signals import score_rows, teacher_tag, with_teacher_embeddings, write_scored
from embforge.encoder import Encoder

EMBEDDING_LOSSES = ("mse_distill", "similarity_distill")  # labels: the teacher's embeddings of the texts
SCORE_LOSSES = ("kl_distill", "margin_mse")  # labels: the teacher's scores of each row's candidates
TEACHER_LOSSES = EMBEDDING_LOSSES + SCORE_LOSSES
PROJECTED_LOSSES = ("mse_distill",)  # compare embeddings coordinate by coordinate: the dimensions must agree
# the top-up draw of short candidate lists: embforge score's default, so both write the same rows
LISTS_SEED = 0


def check_teacher_task(loss: str, teacher: str | None, lists: int | None, where: str) -> str | None:
    """An error message when a task's ``teacher``, ``lists`` and ``loss`` do not go together, else ``None``."""
    if teacher is not None and loss not in TEACHER_LOSSES:
        return (
            f"{where}: field 'teacher' gives the labels, which only losses {' / '.join(TEACHER_LOSSES)} read "
            f"(got loss {loss!r})"
        )
    if teacher is None and loss in EMBEDDING_LOSSES:
        return f'{where}: loss {loss!r} needs the teacher\'s embeddings: add teacher = "FOLDER"'
    if lists is not None and (teacher is None or loss not in SCORE_LOSSES):
        return (
            f"{where}: field 'lists' builds candidate lists for a teacher to score: it needs teacher = \"FOLDER\" "
            f"and loss {' / '.join(SCORE_LOSSES)} (got loss {loss!r}"
            f"{', no teacher' if teacher is None else ''})"
        )
    return None


def text_only(data: Dataset) -> Dataset:
    """``data`` without its ``score`` / ``label`` column (a distillation task's labels are the teacher's)."""
    return Dataset(
        data.path, {c: data.columns[c] for c in data.text_columns}, list(data.lines), data.label_names
    )


def placeholder_targets(data: Dataset) -> Dataset:
    """Text columns plus a zero ``score`` column (a list of zeros per row of 3+ text columns, one per candidate):
    what validation checks before the teacher has run."""
    rows = text_only(data)
    candidates = len(rows.text_columns) - 1
    rows.columns["score"] = [0.0 if candidates == 1 else [0.0] * candidates for _ in range(len(rows))]
    return rows


def resolve_teacher(name: str, base_dir: Path) -> str:
    """The teacher folder: relative to the pipeline file when it exists there, else as written (cwd or alias)."""
    candidate = Path(name) if Path(name).is_absolute() else base_dir / name
    return str(candidate) if candidate.exists() else name


def load_teacher(name: str, device: str, loaded: dict[str, Encoder | CrossEncoder]) -> Encoder | CrossEncoder:
    """The teacher folder / alias ``name`` on ``device``, loaded once per ``loaded`` dict (a cross-encoder when
    its folder says so)."""
    if name not in loaded:
        kind = CrossEncoder if is_cross_encoder_folder(name) else Encoder
        loaded[name] = kind.load(name, device=device)
    return loaded[name]


def teacher_targets(
    data: Dataset,
    teacher: str | Path | Encoder,
    *,
    model: Encoder,
    cache_dir: str | Path,
    seed: int = 42,
    show_progress: bool = True,
    loaded: dict[str, Encoder | CrossEncoder] | None = None,
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
        found = load_teacher(str(teacher), str(model.device), {} if loaded is None else loaded)
        if not isinstance(found, Encoder):
            raise ValueError(f"{teacher} is a cross-encoder: it scores pairs, it has no embeddings to distil")
        teacher = found
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


def scored_file(
    data: Dataset,
    teacher: Encoder | CrossEncoder,
    *,
    cache_dir: str | Path,
    show_progress: bool = True,
    write: bool = True,
) -> Path:
    """The JSONL of ``data``'s text columns with the teacher's scores (``[T(q, c) for c in candidates]`` per row
    of 3+ text columns): ``cache_dir/scores-<key>.jsonl``, keyed by the teacher's weights and the rows, written
    when this teacher has not scored these rows yet (read it with :func:`~embforge.data.tables.read_table`). A
    bi-encoder teacher's embeddings of the texts are cached there too, as they are computed (resumable).

    It is the file ``embforge score`` writes (same scorer, batch size and writer), so a pipeline task and a file
    scored beforehand train on the same values. ``write=False`` (a torchrun process other than rank 0) only names
    the file rank 0 writes.
    """
    rows = text_only(data)
    digest = hashlib.sha256(teacher_tag(teacher).encode())
    for column in rows.text_columns:
        digest.update(column.encode() + b"\1")
        for text in rows.columns[column]:
            digest.update(text.encode() + b"\0")
    path = Path(cache_dir) / f"scores-{digest.hexdigest()[:20]}.jsonl"
    if write and not path.exists():
        scores = score_rows(teacher, rows, show_progress=show_progress, cache_dir=cache_dir)
        partial = write_scored(rows, scores, path.with_suffix(f".{os.getpid()}.tmp.jsonl"))  # one per writer
        partial.replace(path)
    return path
