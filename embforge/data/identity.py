"""Which files a training run reads, as a checkpoint records them, and what changed since.

A resumed run continues at the row its checkpoint stopped at (:mod:`embforge.training.sampling`): that row is only
the same row if the files are the same. Each checkpoint keeps every task's files with their size and modification
time (:func:`identity`, read back by :func:`first_change`), so a file replaced, rewritten or deleted since is
named when ``--resume`` starts, not trained on silently. A modification time is what the memory-mapped cache
trusts too (:func:`embforge.data.sources.open_source`); a copy that does not keep it (``cp`` without ``-p``)
reads as a change.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "pairs.csv"
>>> _ = path.write_text("anchor,positive\\na cat,a dog\\n")
>>> recorded = identity([[path]])
>>> first_change(recorded, identity([[path]])) is None
True
>>> _ = path.write_text("anchor,positive\\na cow,a hen and a fox\\n")
>>> first_change(recorded, identity([[path]]))  # doctest: +ELLIPSIS
Change(subject='.../pairs.csv', what='changed', detail='38 bytes, 28 then')
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple


def identity(files: Sequence[Sequence[str | os.PathLike]]) -> list[list[dict[str, Any]]]:
    """Per task, its files' absolute paths, sizes and modification times (nanoseconds)."""
    found = []
    for task in files:
        entries = []
        for name in task:
            path = Path(name).resolve()
            info = path.stat()
            entries.append({"path": str(path), "size": info.st_size, "mtime_ns": info.st_mtime_ns})
        found.append(entries)
    return found


class Change(NamedTuple):
    """What differs: ``subject`` (a file) is ``what`` (changed, deleted ...), with ``detail`` (sizes) or ``""``."""

    subject: str
    what: str
    detail: str = ""


def first_change(
    recorded: Sequence[Sequence[dict[str, Any]]], current: Sequence[Sequence[dict[str, Any]]]
) -> Change | None:
    """The first file of ``recorded`` that ``current`` (the same run's files now) lacks or holds with another size
    or modification time, or a file a task reads now and did not; ``None``: the same files."""
    if len(recorded) != len(current):
        return Change("the run", f"has {len(current)} training task(s), {len(recorded)}")
    for task, (before, now) in enumerate(zip(recorded, current), start=1):
        by_path = {entry["path"]: entry for entry in now}
        for entry in before:
            path, present = entry["path"], by_path.get(entry["path"])
            if not Path(path).exists():
                return Change(path, "deleted")
            if present is None:
                return Change(path, f"no longer read by task {task}")
            if present["size"] != entry["size"]:
                return Change(path, "changed", f"{present['size']} bytes, {entry['size']} then")
            if present["mtime_ns"] != entry["mtime_ns"]:
                return Change(path, "changed", f"{present['size']} bytes, modified at another time")
        known = {entry["path"] for entry in before}
        for entry in now:
            if entry["path"] not in known:
                return Change(entry["path"], f"new in task {task}")
    return None
