"""Atomic training checkpoints that a resume can trust: model, losses, optimizer, scheduler, RNG and data position.

``<output>/checkpoints/`` holds::

    checkpoint-<step>/   model/, losses.safetensors, trainer_state.pt, progress.json, data.json, manifest.json
    latest               the name of the newest checkpoint of the current run
    run.json             the current run's id (written by :func:`start_run`)

* Each checkpoint is written to a temporary folder and renamed into place (:func:`embforge.files.atomic_dir`);
  ``latest`` is rewritten only after that, and pruning never removes the checkpoint it names.
* ``manifest.json`` lists every file's size and SHA-256 with the run's id and the step. :func:`load_trainer_state`
  verifies it before anything is loaded: a truncated file, a flipped bit in a tensor or a broken
  ``progress.json`` is a :class:`CheckpointError` naming the file, never a model silently resumed with garbage.
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

import hashlib
import json
import re
import shutil
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from embforge.files import append_jsonl, atomic_dir, write_text_atomic
from embforge.training.distributed import all_gather_objects
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
    "latest_checkpoint",
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
MANIFEST = "manifest.json"
DATA_FILES = "data.json"
RUN_FILE = "run.json"
FORMAT = 1
_NAME = re.compile(r"^checkpoint-(\d+)$")


T = TypeVar("T")


class Stateful(Protocol):
    """A part of the trainer a checkpoint saves and a resume restores (optimiser, schedule, scaler, average)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> object: ...


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the file and what to do."""


class ResumeWarning(UserWarning):
    """``--resume`` found nothing to resume, or a checkpoint it cannot verify (written before manifests)."""


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
    if _is_main_process():  # torchrun: rank 0 owns the folder and decides for every rank
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
        p.relative_to(root).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
    manifest = {"format": FORMAT, "run_id": run_id, "step": step, "files": files}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------- finding


def _checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every finished ``checkpoint-<step>`` (not the ``.tmp``/``.old`` of a save)."""
    found = []
    for path in folder.glob("checkpoint-*"):
        match = _NAME.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _run_id(path: Path) -> str | None:
    """The ``run_id`` in a JSON file: a checkpoint's manifest or the output folder's run file (``None``: no such
    file, or unreadable)."""
    try:
        run = _read_json(path).get("run_id")
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
    if log is not None and _is_main_process():
        append_jsonl(log, {"event": "resume", "from": None, "warning": message})
    return None


def latest_checkpoint(folder: Path, *, log: Path | None = None) -> Path | None:
    """The checkpoint to resume from (:func:`checkpoint_to_resume`); kept for the trainer's current call.

    ``log`` defaults to the ``metrics.jsonl`` beside a folder named ``checkpoints`` (the trainer's layout). For a
    look-up that must not warn, use :func:`find_latest`.
    """
    folder = Path(folder)
    if log is None and folder.name == "checkpoints":
        log = folder.parent / "metrics.jsonl"
    return checkpoint_to_resume(folder, log=log)


def _is_main_process() -> bool:
    distributed = torch.distributed
    return not (distributed.is_available() and distributed.is_initialized() and distributed.get_rank() != 0)


# ------------------------------------------------------------------------------------------------- loading


def verify_checkpoint(path: Path) -> None:
    """Check every file of a checkpoint against its manifest (size, then SHA-256).

    A checkpoint without a manifest (written by an older embforge) gets a :class:`ResumeWarning` and only a
    readability check of its ``.safetensors`` files: a flipped bit there cannot be detected.

    Raises:
        CheckpointError: naming the first file that is missing, of the wrong size or with other contents.
    """
    path = Path(path)
    manifest_file = path / MANIFEST
    if not manifest_file.exists():
        warnings.warn(
            f"{path}: no manifest (written by an older embforge): its files cannot be verified against checksums",
            ResumeWarning,
            stacklevel=2,
        )
        for tensors in sorted(path.rglob("*.safetensors")):
            _readable(tensors, lambda f: safe_open(str(f), framework="pt").keys())
        return
    try:
        manifest = _read_json(manifest_file)
        files = manifest["files"]
        entries = [(str(k), int(v["size"]), str(v["sha256"])) for k, v in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(
            f"{manifest_file}: unreadable ({type(err).__name__}: {err}); the checkpoint cannot be verified — "
            "train without --resume, or point latest at another checkpoint"
        ) from None
    advice = "this checkpoint cannot be resumed from; train without --resume, or point latest at another checkpoint"
    for name, size, digest in entries:
        file = path / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise CheckpointError(f"{manifest_file}: lists {name!r}, a path outside the checkpoint")
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (listed in {MANIFEST}); {advice}")
        actual = file.stat().st_size
        if actual != size:
            raise CheckpointError(
                f"{file}: {actual} bytes, but the checkpoint wrote {size} (truncated or overwritten); {advice}"
            )
        if _sha256(file) != digest:
            raise CheckpointError(
                f"{file}: its contents changed after the checkpoint was written (SHA-256 differs from "
                f"{MANIFEST}: corrupted on disk or in a copy); {advice}"
            )


def _readable(file: Path, read: Callable[[Path], T]) -> T:
    """``read(file)``, with any failure to decode it turned into a :class:`CheckpointError` naming the file."""
    if not file.is_file():
        raise CheckpointError(f"{file}: missing; this checkpoint cannot be resumed from")
    try:
        return read(file)
    except Exception as err:  # torch/safetensors/json raise many kinds for a damaged file
        raise CheckpointError(
            f"{file}: cannot be read ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
            "this checkpoint cannot be resumed from"
        ) from err


def load_trainer_state(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], Progress]:
    """Verify a checkpoint (:func:`verify_checkpoint`), then read its trainer state (no unpickling of arbitrary
    objects), loss weights and progress.

    Raises:
        CheckpointError: naming the file that is missing, corrupted or cannot be decoded.
    """
    path = Path(path)
    verify_checkpoint(path)
    state = _readable(
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
    losses = _readable(path / "losses.safetensors", lambda f: load_file(str(f)))
    progress = Progress.from_dict(read_progress(path))
    _check_finite(path, state=state, losses=losses)
    return state, losses, progress


# a weight this large overflows float32 in its first matrix product: only an overflowing step writes one
LARGEST_WEIGHT = 1e19


def _check_finite(path: Path, *, state: dict[str, Any], losses: dict[str, torch.Tensor]) -> None:
    """Refuse a checkpoint holding NaN, infinite or overflowing weights, or a non-finite optimiser state.

    A manifest cannot catch these: a step that overflowed before the loss guard fired writes them, checksums and
    all. Resumed, such a run would die steps later with a misleading "lower the learning rate".
    """
    for file in sorted((path / "model").rglob("*.safetensors")):
        with safe_open(str(file), framework="pt") as tensors:
            for name in tensors.keys():  # noqa: SIM118 (safe_open is not a dict)
                _finite(path, file, name, tensors.get_tensor(name), largest=LARGEST_WEIGHT)
    for name, tensor in losses.items():
        _finite(path, path / "losses.safetensors", name, tensor, largest=LARGEST_WEIGHT)
    for name, tensor in _tensors(state.get("optimizer"), "optimizer"):
        _finite(path, path / "trainer_state.pt", name, tensor, largest=None)


def _tensors(value: Any, name: str) -> list[tuple[str, torch.Tensor]]:
    """Every floating-point tensor inside nested dicts and lists, with its path (``optimizer.state.0.exp_avg``)."""
    if isinstance(value, torch.Tensor):
        return [(name, value)] if value.is_floating_point() else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    return [found for key, item in items for found in _tensors(item, f"{name}.{key}")]


def _finite(checkpoint: Path, file: Path, name: str, tensor: torch.Tensor, *, largest: float | None) -> None:
    values = tensor.float()
    bad = ~torch.isfinite(values)
    what = "non-finite values (NaN or infinity)"
    if largest is not None and not bad.any():
        bad = values.abs() > largest
        what = f"overflowing values (beyond {largest:g})"
    if not bad.any():
        return
    example = values[bad].flatten()[0].item()
    raise CheckpointError(
        f"{file}: {name} holds {int(bad.sum())} {what}, e.g. {example}: {checkpoint.name} was saved after a "
        f"step that overflowed and cannot be resumed from; {_earlier(checkpoint)}"
    )


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
    return _readable(file, _read_json) if file.is_file() else None


def read_progress(path: Path) -> dict[str, Any]:
    """A checkpoint's ``progress`` dict (step, epoch, data position, ... as the trainer saved it).

    Raises:
        CheckpointError: when ``progress.json`` is missing, not JSON, or its step disagrees with the folder name.
    """
    file = Path(path) / "progress.json"
    if not file.is_file():
        raise CheckpointError(f"{file}: missing; this checkpoint cannot be resumed from")
    try:
        progress = _read_json(file)
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
