"""Range-checked argparse types: every numeric flag of every verb says what it accepts, and a value out of range
is refused at parse time in one line, ``embforge train: error: argument --max-steps: must be a positive integer,
got -5`` (exit status 2), before a model loads. Paths get the same treatment: a device or FIFO as a data file, a
file where a folder is written, a GPU this machine lacks.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from embforge import ranges

T = TypeVar("T")


class Checked(Generic[T]):
    """An argparse ``type=``: ``parse`` the text, then keep the value only if ``accept`` says so; else a one-line
    error saying what was ``expected``. ``metavar`` is the placeholder of the flag's value in ``--help``."""

    def __init__(
        self, name: str, parse: Callable[[str], T], accept: Callable[[T], bool], expected: str, metavar: str
    ) -> None:
        self.__name__ = name
        self.parse, self.accept, self.expected, self.metavar = parse, accept, expected, metavar

    def __call__(self, text: str) -> T:
        try:
            value = self.parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {self.expected}, got {text!r}") from None
        if not self.accept(value):
            raise argparse.ArgumentTypeError(f"must be {self.expected}, got {text}")
        return value

    def __repr__(self) -> str:
        return self.__name__


def integer(low: int, high: int | None = None, *, name: str | None = None) -> Checked[int]:
    """Integers from ``low`` to ``high`` (no limit when ``None``)."""
    allowed = ranges.integers(low, high)
    return Checked(name or f"integer({low}, {high})", int, allowed.accept, allowed.expected, "N")


def number(
    low: float = -math.inf, high: float = math.inf, *, open_low: bool = False, open_high: bool = False
) -> Checked[float]:
    """Finite numbers between ``low`` and ``high`` (excluded when ``open_low`` / ``open_high``); NaN and the
    infinities never pass (:func:`embforge.ranges.finite`, the check the library's configs make too)."""
    allowed = ranges.finite(low, high, open_low=open_low, open_high=open_high)
    return Checked(f"number({low}, {high})", float, allowed.accept, allowed.expected, "X")


positive_int = integer(1, name="positive_int")
non_negative_int = integer(0, name="non_negative_int")
port = integer(1, 65535, name="port")
seed = integer(0, 2**32 - 1, name="seed")  # what numpy's and torch's generators take
finite_float = number()
positive_float = number(0, open_low=True)
non_negative_float = number(0)
ratio = number(0, 1)
similarity = number(-1, 1)  # a cosine (or a Jaccard index, within it)
# a timeout: more than a day is a typo (and past ~24 days, epoll's millisecond count overflows)
seconds = number(0, 86400, open_low=True)


def _cores() -> int:
    return os.cpu_count() or 1


# More threads than cores only adds contention (the model's thread pools spin); 4 x the logical CPUs leaves room
# for a cgroup that reports fewer, and refuses the typo that makes onnxruntime start 100,000 threads.
THREADS_PER_CORE = 4


def threads(text: str) -> int:
    """A count of CPU threads: 1 to 4 x this machine's logical CPUs (more only contend for the cores)."""
    return _capped(text, low=1, name="threads")


def streams(text: str) -> int:
    """A count of inference streams: 0 (the runtime's choice) to 4 x this machine's logical CPUs."""
    return _capped(text, low=0, name="streams")


def _capped(text: str, *, low: int, name: str) -> int:
    cap = THREADS_PER_CORE * _cores()
    expected = f"an integer from {low} to {cap} ({THREADS_PER_CORE} x the {_cores()} CPUs here)"
    return Checked(name, int, lambda v: low <= v <= cap, expected, "N")(text)


def int_list(text: str) -> list[int]:
    """``"64,128,256"`` -> ``[64, 128, 256]``: positive integers, one or more."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"must be positive integers separated by commas, e.g. 64,128, got {text!r}"
        )
    return values


def float_list(text: str) -> list[float]:
    """``"0,0.5,1"`` -> ``[0.0, 0.5, 1.0]``: finite numbers, one or more."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(
            f"must be finite numbers separated by commas, e.g. 0,0.5,1, got {text!r}"
        )
    return values


def option(text: str) -> str:
    """One ``NAME=VALUE`` option (``--loss-option``, ``--index-option``): a value that is a number must be finite
    (``scale=nan`` would reach the loss as the text ``'nan'``)."""
    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} must look like NAME=VALUE")
    try:
        value = float(raw)
    except ValueError:
        return text
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: the value must be a finite number")
    return text


def _kind(mode: int) -> str | None:
    """What a path that is neither a regular file nor a folder is (``None`` for those two)."""
    for test, kind in (
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return kind
    return None


def data_path(text: str) -> str:
    """A data file or folder (or a data set id): a path that exists must be a regular file or a folder; a device
    or a FIFO would be read forever (``--train /dev/zero``)."""
    try:
        kind = _kind(os.stat(text).st_mode)
    except OSError:  # not there (a data set id, or a missing file the reader names)
        return text
    if kind:
        raise argparse.ArgumentTypeError(f"{text} is a {kind}, not a data file or folder")
    return text


def folder(text: str) -> str:
    """A folder written to (created when missing): a path that exists must be a folder."""
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a folder")
    return text


def device(text: str) -> str:
    """A torch device this machine has: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` (N below the GPU count), ``mps``."""
    if text == "auto":
        return text
    import torch

    try:
        where = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a device; use auto, cpu, cuda, cuda:N or mps"
        ) from None
    if where.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text}: this machine has no CUDA device; use cpu")
        if where.index is not None and where.index >= count:
            raise argparse.ArgumentTypeError(
                f"{text}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )
    if where.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text}: this machine has no MPS device; use cpu")
    return text
