"""What a finished training run keeps on disk.

While training, ``<output>/checkpoints/checkpoint-<step>/`` holds what ``--resume`` needs: a copy of the model, the
optimizer state (AdamW: two more tensors per weight, so twice the model's size), the scheduler and RNG states.
Once the run has finished, none of it is needed to use the model, and for all-MiniLM-L6-v2 it is 260 of the
435 MB of an STS-B run. :func:`finalize_run` removes it (unless asked to keep it, e.g. to continue training later
with a larger ``--max-steps``), removes half-written leftovers of interrupted saves, and stores a ``best/`` model
identical to the final one once (hard links), so both paths keep working.

A new run claims its folder first (:func:`claim_output`): a folder that is not empty is refused unless the run
resumes what is there (``--resume``) or clears it (``--overwrite``), so two runs never mix their ``metrics.jsonl``
or leave one's ``best/`` beside the other's model.

A finished run says so before any of that: :func:`mark_finished` writes ``finished.json`` (the step it ended at)
once the final model is saved, and the clean-up first renames ``checkpoints/`` aside (one atomic rename), then
deletes it. A kill at any point leaves either the training state or a run marked finished, never a run that
``--resume`` would train again from step 0: :func:`resume_finished` answers "nothing to do" and completes the
clean-up.

Example:
    >>> import tempfile, pathlib
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (run / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    >>> _ = (run / "checkpoints" / "checkpoint-2" / "trainer_state.pt").write_bytes(b"x" * 1000)
    >>> _ = (run / "model.safetensors").write_bytes(b"w" * 100)
    >>> finalize_run(run, keep_training_state=False)
    100
    >>> (run / "checkpoints").exists()
    False
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from embforge.files import write_text_atomic
from embforge.parallel import barrier, init_from_env, is_main

TRAINING_STATE = "checkpoints"  # the trainer's checkpoints: model copies, optimizer, scheduler, RNG, progress
BEST = "best"
FINISHED = "finished.json"  # {"steps": N}: the run ended at step N and its final model is saved
SUMMARY = "train_summary.json"
METRICS = "metrics.jsonl"
MINED = "refresh"  # a task's mined negatives, written before its first step (training/refresh.py)
# what only a training run writes (mined negatives before it trains, checkpoints/ from its first step, the rest as
# it logs and ends); a pipeline writes stage-<k>-<name>/ folders, each a run
RUN_FILES = (MINED, TRAINING_STATE, METRICS, SUMMARY, FINISHED)


class OutputInUse(ValueError):
    """A new run's output folder holds files already (an earlier run's, or others)."""


def claim_output(output_dir: str | os.PathLike, *, resume: bool, overwrite: bool) -> None:
    """Make ``output_dir`` the new run's before anything is written to it.

    A folder that does not exist or is empty is fine, and so is any folder with ``resume`` (the run continues
    what is there). Otherwise the run is refused unless ``overwrite``, which empties the folder first, and only
    a folder holding an earlier run (:func:`holds_a_run`): ``--overwrite`` pointed at a folder of other files by
    mistake deletes nothing. Emptying removes the folder's entries and never follows a link out of it (the link
    goes, not what it points to). Under torchrun every process checks (nothing is written yet, so all get the
    same answer) and rank 0 empties the folder while the others wait.

    Raises:
        OutputInUse: one line naming the folder, ``--resume`` and ``--overwrite`` (also when both are given).
    """
    root = Path(output_dir)
    if resume and overwrite:
        raise OutputInUse(
            f"{root}: --resume continues the run there and --overwrite deletes it; pass one of them"
        )
    entries = sorted(root.iterdir()) if root.is_dir() and not resume else []
    if entries and not overwrite:
        shown = ", ".join(e.name + ("/" if e.is_dir() else "") for e in entries[:3])
        more = f" and {len(entries) - 3} more" if len(entries) > 3 else ""
        raise OutputInUse(
            f"{root}: not empty ({shown}{more}); pass --resume to continue the run there, or --overwrite to "
            "delete what it holds and start a new run"
        )
    if entries and not holds_a_run(root):
        raise OutputInUse(
            f"{root}: --overwrite empties an earlier run's folder, and this one holds no previous run (no "
            f"{', '.join(RUN_FILES)}, no stage-* folder); empty it yourself or choose another --output "
            "(--resume continues a run there)"
        )
    init_from_env()  # torchrun: every process has looked before rank 0 deletes anything
    barrier()
    if entries and is_main():
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)  # links inside are removed, never followed
            else:
                entry.unlink()
    barrier()


def holds_a_run(output_dir: str | os.PathLike) -> bool:
    """Whether ``output_dir`` holds what a training run or a pipeline writes (:data:`RUN_FILES`, stage folders)."""
    root = Path(output_dir)
    return any((root / name).exists() for name in RUN_FILES) or any(
        p.is_dir() and p.name.startswith("stage-") for p in root.iterdir()
    )


def finalize_run(output_dir: str | os.PathLike, *, keep_training_state: bool) -> int:
    """Tidy a finished run's folder and return the bytes it keeps on disk (hard-linked files counted once).

    Args:
        output_dir: The run's output folder (``TrainConfig.output``).
        keep_training_state: Keep ``checkpoints/`` (optimizer and scheduler state, RNG, a model copy), so that
            ``--resume`` can continue the run later; ``False`` removes it.

    Returns:
        Bytes of the files left in ``output_dir``.
    """
    root = Path(output_dir)
    if not keep_training_state and (root / TRAINING_STATE).is_dir():
        aside = root / f"{TRAINING_STATE}.old"  # one rename: a kill leaves the whole state or none of it
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(root / TRAINING_STATE, aside)
    for leftover in [*root.glob("*.tmp"), *root.glob("*.old")]:  # interrupted saves and clean-ups
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
    link_identical(root / BEST, root)
    return disk_bytes(root)


def mark_finished(output_dir: str | os.PathLike, *, steps: int) -> None:
    """Record that the run in ``output_dir`` ended at ``steps`` with its final model saved (before clean-up)."""
    write_text_atomic(Path(output_dir) / FINISHED, json.dumps({"steps": steps}) + "\n")


def clear_finished(output_dir: str | os.PathLike) -> None:
    """A new run (not a resume) starts in ``output_dir``: it is not finished."""
    (Path(output_dir) / FINISHED).unlink(missing_ok=True)


def finished_steps(output_dir: str | os.PathLike) -> int | None:
    """The step a finished run in ``output_dir`` ended at, or ``None`` (not finished, or no such run)."""
    try:
        steps = json.loads((Path(output_dir) / FINISHED).read_text(encoding="utf-8")).get("steps")
    except (OSError, ValueError, AttributeError):
        return None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def resume_finished(
    output_dir: str | os.PathLike, total_steps: int, *, keep_training_state: bool, main: bool
) -> dict[str, Any] | None:
    """What ``--resume`` of a finished run does: the saved summary with ``nothing_to_do`` when the run already
    reached ``total_steps`` (the interrupted clean-up, if any, completed on ``main``), ``None`` when the run is
    not finished or can continue (a larger ``total_steps`` and the training state kept).

    Raises:
        ValueError: the run finished before ``total_steps`` and its training state was removed.
    """
    root = Path(output_dir)
    steps = finished_steps(root)
    if steps is None:
        return None
    if steps < total_steps:
        if (root / TRAINING_STATE).is_dir():  # kept: resume continues from its checkpoint (checkpoints.py)
            return None
        raise ValueError(
            f"{root}: the run finished at step {steps} and its training state was removed, so it cannot continue "
            f"to step {total_steps}; train without --resume to start over (--keep-training-state keeps what a "
            "later, longer run needs)"
        )
    try:
        summary = json.loads((root / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = {"steps": steps}
    if main:
        summary["bytes_on_disk"] = finalize_run(root, keep_training_state=keep_training_state)
        print(  # the answer to --resume: printed even with --quiet
            f"train: {root} finished at step {steps} (its final model is saved there): nothing to do; train "
            "without --resume to start over",
            file=sys.stderr,
        )
    return {**summary, "nothing_to_do": True}


def link_identical(copy: Path, original: Path) -> None:
    """Replace each file of ``copy`` that equals ``original``'s file of the same name by a hard link to it (a
    pipeline's ``final/`` and its last stage's model, ``best/`` and the final model)."""
    if not copy.is_dir():
        return
    for path in copy.rglob("*"):
        twin = original / path.relative_to(copy)
        if not path.is_file() or path.is_symlink() or not twin.is_file():
            continue
        if path.stat().st_ino == twin.stat().st_ino or not filecmp.cmp(path, twin, shallow=False):
            continue
        spare = path.with_name(path.name + ".link")
        try:
            os.link(twin, spare)
        except OSError:  # another file system, or no hard links here: keep the copy
            continue
        os.replace(spare, path)


def disk_bytes(folder: str | os.PathLike) -> int:
    """Bytes of the files under ``folder``, each hard-linked file counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path in Path(folder).rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        info = path.stat()
        if (info.st_dev, info.st_ino) not in seen:
            seen.add((info.st_dev, info.st_ino))
            total += info.st_size
    return total
