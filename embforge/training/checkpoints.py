"""Atomic training checkpoints that a resume can trust: model, losses, optimizer, scheduler, RNG and data position.

``<output>/checkpoints/`` holds::

    checkpoint-<step>/   model/, losses.safetensors, trainer_state.pt, progress.json, data.json, manifest.json
    latest               the name of the newest checkpoint of the current run
    run.json             the current run's id (written by :func:`start_run`)

* Each checkpoint is written to a temporary folder and renamed into place (:func:`embforge.files.atomic_dir`);
  ``latest`` is rewritten only after that, and pruning never removes the checkpoint it names.
* ``manifest.json`` lists every file's size and SHA-256 with the run's id and the step. :func:`load_trainer_state`
  verifies it before anything is loaded: a truncated file, a flipped bit in a tensor or a broken
  ``progress.json`` is a :class:`CheckpointError` naming the file, never a model silently resumed with garbage
  (the checks, with the finite-weights one, are :mod:`embforge.training.checkpoint_checks`).
* ``data.json`` lists each task's training files with their size and modification time
  (:mod:`embforge.data.identity`): a resume whose files changed is refused naming the file.
* Pruning (``keep``) counts only the current run's checkpoints (same run id), so a ``checkpoint-20`` left by an
  earlier run in the same folder neither survives in their place nor makes new ones disappear.
* ``--resume`` with nothing to resume (no checkpoint of this run) trains from step 0 with a
  :class:`ResumeWarning` on stderr and an ``{"event": "resume", "from": null, "warning": ...}`` line in
  ``metrics.jsonl``: a job script that always passes ``--resume`` must work on its first launch, and nothing is
  lost. Anything that is there but unusable (a dangling ``latest``, checkpoints without a pointer, a checksum
  mismatch) is an error instead: starting over would silently throw away work the user believes is kept.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from safetensors.torch import load_file, save_file

from embforge.files import append_jsonl, atomic_dir, write_text_atomic
from embforge.parallel import all_gather_objects, is_main
from embforge.training.checkpoint_checks import (
    MANIFEST,
    CheckpointError,
    ResumeWarning,
    check_finite,
    read_json,
    readable,
    sha256,
    verify_checkpoint,
)
from embforge.training.rng import rng_state, set_rng_state
from embforge.training.state import Progress

if TYPE_CHECKING:
    from embforge.protocols import TrainableModel

__all__ = [
    "LATEST",
    "CheckpointError",
    "ResumeWarning",
    "atomic_dir",
    "checkpoint_to_resume",
    "find_latest",
    "load_trainer_state",
    "read_data_files",
    "read_progress",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "start_run",
    "verify_checkpoint",
    "write_text_atomic",
]

LATEST = "latest"
DATA_FILES = "data.json"
RUN_FILE = "run.json"
FORMAT = 1
_NAME = re.compile(r"^checkpoint-(\d+)$")


class Stateful(Protocol):
    """A part of the trainer a checkpoint saves and a resume restores (optimiser, schedule, scaler, average)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> object: ...


# ------------------------------------------------------------------------------------------------- writing


def start_run(folder: Path, *, resume: bool, log: Path | None = None) -> Path | None:
    """What the trainer calls before its first step: the checkpoint to resume from, or ``None`` for step 0.

    With ``resume``, this is :func:`checkpoint_to_resume`. Without it, a new run begins: it gets a fresh id in
    ``run.json`` and the previous run's ``latest`` pointer is removed (its checkpoints stay), so that if this run
    is killed before its first checkpoint, ``--resume`` does not continue the previous run instead.

    Under torchrun every rank must call it: rank 0 alone reads and writes the folder, and the others get its
    answer. A rank that read ``latest`` itself could see an older checkpoint than rank 0 (rank 0 may still be
    saving the newest one when the others get here), and ranks resuming from different steps exchange tensors
    of different batches: gloo's "Received data size doesn't match expected size".
    """
    folder = Path(folder)
    answer = None
    if is_main():  # torchrun: rank 0 owns the folder and decides for every rank
        answer = _start_run(folder, resume=resume, log=log)
    chosen = all_gather_objects(answer.name if answer is not None else None)[0]
    return folder / chosen if chosen is not None else None


def _start_run(folder: Path, *, resume: bool, log: Path | None) -> Path | None:
    if resume:
        return checkpoint_to_resume(folder, log=log)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LATEST).unlink(missing_ok=True)
    write_text_atomic(folder / RUN_FILE, json.dumps({"run_id": uuid.uuid4().hex}) + "\n")
    return None


def save_checkpoint(
    folder: Path,
    *,
    model: TrainableModel,
    losses: torch.nn.ModuleList,
    trainer: Mapping[str, Stateful],
    progress: Progress,
    keep: int = 1,
    data_files: list[list[dict[str, Any]]] | None = None,
) -> Path:
    """Write ``folder/checkpoint-<step>`` atomically with its manifest, point ``latest`` at it, prune.

    Args:
        folder: The run's ``checkpoints`` folder.
        model: Saved with its own ``save`` into ``model/``.
        losses: The tasks' losses (their learnable parameters, e.g. a temperature).
        trainer: The training objects with a ``state_dict`` by name (``optimizer``, ``scheduler``, ``scaler``:
            the fp16 gradient scaler, disabled ones too); their states go into ``trainer_state.pt`` under those
            names, with the RNG state under ``rng``.
        progress: The trainer's progress, written as ``progress.json``. Its ``run_id`` is set on the first save
            of a run (``run.json``'s when :func:`start_run` wrote one, else a new id) and travels with it through
            resumes: it is what tells this run's checkpoints from an earlier run's.
        keep: How many of this run's checkpoints to keep (the newest); ``keep < 1`` keeps them all.
        data_files: Each task's training files (:func:`embforge.data.identity.identity`), written as
            ``data.json`` (:func:`read_data_files`).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if progress.run_id is None:
        progress.run_id = _run_id(folder / RUN_FILE) or uuid.uuid4().hex
    run_id = progress.run_id
    name = f"checkpoint-{progress.step}"

    def write(tmp: Path) -> None:
        model.save(tmp / "model")
        loss_state = {k: v.detach().cpu().contiguous() for k, v in losses.state_dict().items()}
        save_file(loss_state, str(tmp / "losses.safetensors"))
        states = {name: part.state_dict() for name, part in trainer.items()}
        torch.save({**states, "rng": rng_state()}, tmp / "trainer_state.pt")
        (tmp / "progress.json").write_text(json.dumps(progress.to_dict(), indent=2) + "\n", encoding="utf-8")
        if data_files is not None:
            (tmp / DATA_FILES).write_text(json.dumps(data_files, indent=1) + "\n", encoding="utf-8")
        _write_manifest(tmp, run_id=run_id, step=progress.step)

    atomic_dir(folder / name, write)
    write_text_atomic(folder / LATEST, name + "\n")
    ours = sorted((step, path) for step, path in _checkpoints(folder) if _run_id(path / MANIFEST) == run_id)
    stale = ours[:-keep] if keep >= 1 else []
    for _, path in stale:
        if path.name != name:
            shutil.rmtree(path, ignore_errors=True)
    return folder / name


def _write_manifest(root: Path, *, run_id: str, step: int) -> None:
    files = {
        p.relative_to(root).as_posix(): {"size": p.stat().st_size, "sha256": sha256(p)}
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
    manifest = {"format": FORMAT, "run_id": run_id, "step": step, "files": files}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------- finding


def _checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every finished ``checkpoint-<step>`` (not the ``.tmp``/``.old`` of a save)."""
    found = []
    for path in folder.glob("checkpoint-*"):
        match = _NAME.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def _run_id(path: Path) -> str | None:
    """The ``run_id`` in a JSON file: a checkpoint's manifest or the output folder's run file (``None``: no such
    file, or unreadable)."""
    try:
        run = read_json(path).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return run if isinstance(run, str) else None


def find_latest(folder: Path) -> Path | None:
    """The checkpoint ``folder/latest`` names, or ``None`` when the current run has none (no warning).

    Raises:
        CheckpointError: when ``latest`` is unreadable, names no checkpoint or one that does not exist, or is
            missing while the folder holds checkpoints that may be this run's.
    """
    folder = Path(folder)
    pointer = folder / LATEST
    present = _checkpoints(folder)
    listing = ", ".join(p.name for _, p in present) or "no checkpoints"
    if not pointer.exists():
        current = _run_id(folder / RUN_FILE)
        if not present or (current is not None and all(_run_id(p / MANIFEST) != current for _, p in present)):
            return None
        raise CheckpointError(
            f"{pointer}: missing, but {folder} holds {listing}; write the name of the one to resume from into "
            f"it (e.g. `echo {present[-1][1].name} > {pointer}`), or train without --resume"
        )
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{pointer}: unreadable ({err})") from None
    if not _NAME.match(name):
        raise CheckpointError(
            f"{pointer}: {name!r} is not a checkpoint name (checkpoint-<step>); {folder} holds {listing}"
        )
    path = folder / name
    if not path.is_dir():
        raise CheckpointError(
            f"{pointer}: points to {name}, which does not exist ({folder} holds {listing}); write the name of "
            "an existing checkpoint into it, or train without --resume"
        )
    return path


def checkpoint_to_resume(folder: Path, *, log: Path | None = None) -> Path | None:
    """:func:`find_latest`, saying so (a :class:`ResumeWarning`, and a line in ``log``) when there is nothing.

    Args:
        folder: The run's ``checkpoints`` folder.
        log: A JSONL log (the run's ``metrics.jsonl``) that gets ``{"event": "resume", "from": null,
            "warning": ...}`` when there is nothing to resume.
    """
    folder = Path(folder)
    path = find_latest(folder)
    if path is not None:
        return path
    others = [p.name for _, p in _checkpoints(folder)]
    message = (
        f"--resume: nothing to resume in {folder} (no checkpoint of this run); training starts at step 0"
    )
    if others:
        message += f" ({', '.join(others)} belongs to an earlier run: to resume it, write its name into {folder / LATEST})"
    warnings.warn(message, ResumeWarning, stacklevel=2)
    if log is not None and is_main():
        append_jsonl(log, {"event": "resume", "from": None, "warning": message})
    return None


# ------------------------------------------------------------------------------------------------- loading


def load_trainer_state(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], Progress]:
    """Verify a checkpoint (:func:`verify_checkpoint`), then read its trainer state (no unpickling of arbitrary
    objects), loss weights and progress.

    Raises:
        CheckpointError: naming the file that is missing, corrupted or cannot be decoded.
    """
    path = Path(path)
    verify_checkpoint(path)
    state = readable(
        path / "trainer_state.pt", lambda f: torch.load(f, weights_only=True, map_location="cpu")
    )
    missing = [
        k
        for k in ("optimizer", "scheduler", "scaler", "rng")
        if not isinstance(state, dict) or k not in state
    ]
    if missing:
        raise CheckpointError(
            f"{path / 'trainer_state.pt'}: has no {', '.join(missing)}; not a trainer state"
        )
    losses = readable(path / "losses.safetensors", lambda f: load_file(str(f)))
    progress = Progress.from_dict(read_progress(path))
    check_finite(path, state=state, losses=losses, advice=_earlier(path))
    return state, losses, progress


def _earlier(checkpoint: Path) -> str:
    """Advice naming the checkpoint before ``checkpoint`` of the same folder, if one is kept."""
    match = _NAME.match(checkpoint.name)
    step = int(match.group(1)) if match else -1
    before = [p for s, p in _checkpoints(checkpoint.parent) if s < step]
    pointer = checkpoint.parent / LATEST
    if before:
        return f"resume from the previous one, {before[-1].name} (`echo {before[-1].name} > {pointer}`)"
    return (
        "no earlier checkpoint is kept (keep_checkpoints keeps more): train without --resume, with a lower "
        "learning rate or amp='no'"
    )


def read_data_files(path: Path) -> list[list[dict[str, Any]]] | None:
    """The training files a checkpoint's run read (``data.json``); ``None`` for a checkpoint without one (written
    by an earlier embforge). The manifest has verified the file (:func:`load_trainer_state`)."""
    file = Path(path) / DATA_FILES
    return readable(file, read_json) if file.is_file() else None


def read_progress(path: Path) -> dict[str, Any]:
    """A checkpoint's ``progress`` dict (step, epoch, data position, ... as the trainer saved it).

    Raises:
        CheckpointError: when ``progress.json`` is missing, not JSON, or its step disagrees with the folder name.
    """
    file = Path(path) / "progress.json"
    if not file.is_file():
        raise CheckpointError(f"{file}: missing; this checkpoint cannot be resumed from")
    try:
        progress = read_json(file)
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"{file}: not valid JSON ({err}); this checkpoint cannot be resumed from"
        ) from None
    if not isinstance(progress, dict):
        raise CheckpointError(f"{file}: expected a JSON object, found {type(progress).__name__}")
    for key in ("step", "epoch", "position"):
        value = progress.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(f"{file}: {key!r} is {value!r}, not a step count")
    match = _NAME.match(Path(path).name)
    if match and int(match.group(1)) != progress.get("step"):
        raise CheckpointError(
            f"{file}: says step {progress.get('step')}, but the folder is {Path(path).name}"
        )
    return progress
