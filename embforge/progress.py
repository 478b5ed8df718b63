"""Progress bars: tqdm with ETA, and one switch for a whole command (the CLI's ``--quiet``).

Library functions take ``show_progress: bool | None``; ``None`` means "decide for me": inside
:func:`progress_bars` (the CLI enters it around every verb) that is the command's setting, elsewhere a bar is
shown for long inputs on a terminal only, so library calls from scripts and tests stay silent. ``--quiet``
(``progress_bars(False)``) silences every bar, even those a caller asked for explicitly.

A phase that may take long and has no bar of its own (mining negatives, reading a large file, a quiet training
loop) runs inside :func:`phase`: if it takes longer than ``PHASE_DELAY`` seconds it says what it does in one line
on stderr, even in a quiet run — quiet silences bars and per-step output, not the line that says why a run is
busy for minutes. Quick phases print nothing, as quick bars do.

Example:
    >>> with progress_bars(False):
    ...     progress_enabled(True)
    False
    >>> progress_enabled(None, steps=3)  # outside a command: only long inputs on a terminal
    False
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")

_SETTING: ContextVar[bool | None] = ContextVar("embforge_progress", default=None)
AUTO_MIN_STEPS = 20  # outside a command, inputs of more batches than this get a bar (on a terminal)
BAR_DELAY = 1.0  # seconds before a bar appears: quick calls print nothing
PHASE_DELAY = 3.0  # seconds a phase runs before it says what it does: quick ones print nothing


@contextlib.contextmanager
def progress_bars(enabled: bool | None) -> Iterator[None]:
    """Inside, ``show_progress=None`` means ``enabled``; ``False`` also overrides explicit requests (quiet)."""
    token = _SETTING.set(enabled)
    try:
        yield
    finally:
        _SETTING.reset(token)


def progress_enabled(requested: bool | None = None, *, steps: int = 0) -> bool:
    """Whether to show a bar: quiet wins, then an explicit request, then the command's setting, then auto."""
    setting = _SETTING.get()
    if setting is False:
        return False
    if requested is not None:
        return requested
    if setting is True:
        return True
    return steps > AUTO_MIN_STEPS and sys.stderr.isatty()


def progress_bar(
    iterable: Iterable[T] | None = None,
    *,
    desc: str,
    total: int | None = None,
    enabled: bool = True,
    initial: int = 0,
    unit: str = "it",
) -> tqdm:
    """A tqdm bar with ETA: it appears after one second (quick calls print nothing), refreshes at least every
    second (every two when stderr is a log file, not a terminal), and is removed when it finishes inside another
    bar (e.g. encoding the dev set during training)."""
    terminal = sys.stderr.isatty()
    return tqdm(
        iterable,
        desc=desc,
        total=total,
        disable=not enabled,
        initial=initial,
        unit=unit,
        delay=BAR_DELAY,
        mininterval=0.2 if terminal else 2.0,
        maxinterval=2.0,
        leave=None,
        dynamic_ncols=True,
    )


@contextlib.contextmanager
def phase(text: str, *, enabled: bool = True) -> Iterator[None]:
    """Print ``text`` (one line, to stderr) if the block is still running after ``PHASE_DELAY`` seconds, quiet
    or not; nothing when it ends sooner, when not ``enabled``, or on a torchrun rank other than 0."""
    if not enabled or os.environ.get("RANK", "0") != "0":
        yield
        return
    if PHASE_DELAY <= 0:  # say it at once (tests)
        say(text)
        yield
        return
    timer = threading.Timer(PHASE_DELAY, say, args=(text,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def say(text: str) -> None:
    """One line on stderr, above any bar being drawn."""
    tqdm.write(text, file=sys.stderr)
    sys.stderr.flush()
