"""Range checks for numbers, one wording for the CLI's flags and the library's configs.

A :class:`Range` says which numbers it accepts and how to say so ("a number in [0, 1]"). The CLI's argparse types
(``embforge.cli.values``) and the configs' ``__post_init__`` (``TrainConfig``, ``ServeConfig`` ...) share them,
so ``lr = nan`` in a TOML file or in Python is refused as ``--lr nan`` is. NaN and the infinities never pass
(a NaN compares false with every bound, so ``if lr <= 0`` lets it through; these checks do not), nor do booleans
(``epochs = true``), nor a fraction where an integer is counted.

>>> check("lr", float("nan"), POSITIVE)
Traceback (most recent call last):
...
ValueError: lr must be a finite number > 0, got nan
>>> check("max_steps", None, POSITIVE_INT, optional=True)  # None: not set
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """The values a number may take: ``accept(value)`` and, in words, ``expected`` ("a positive integer")."""

    expected: str
    accept: Callable[[object], bool]


def integers(low: int, high: int | None = None) -> Range:
    """Integers from ``low`` to ``high`` (no limit when ``None``); a bool or a float is not one."""
    if high is not None:
        expected = f"an integer from {low} to {high}"
    else:
        expected = "a positive integer" if low == 1 else f"an integer >= {low}"

    def accept(value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            return False
        return low <= int(value) and (high is None or int(value) <= high)

    return Range(expected, accept)


def finite(
    low: float = -math.inf, high: float = math.inf, *, open_low: bool = False, open_high: bool = False
) -> Range:
    """Finite numbers between ``low`` and ``high`` (excluded when ``open_low`` / ``open_high``)."""
    if math.isinf(low) and math.isinf(high):
        expected = "a finite number"
    elif math.isinf(high):
        expected = f"a finite number {'>' if open_low else '>='} {low:g}"
    else:
        expected = f"a number in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"

    def accept(value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        number = float(value)
        above = number > low if open_low else number >= low
        below = number < high if open_high else number <= high
        return math.isfinite(number) and above and below

    return Range(expected, accept)


POSITIVE_INT = integers(1)
NON_NEGATIVE_INT = integers(0)
SEED = integers(0, 2**32 - 1)  # what numpy's and torch's generators take
FINITE = finite()
POSITIVE = finite(0, open_low=True)
NON_NEGATIVE = finite(0)
RATIO = finite(0, 1)
# a timeout: more than a day is a typo (and past ~24 days, epoll's millisecond count overflows)
SECONDS = finite(0, 86400, open_low=True)


def check(name: str, value: object, allowed: Range, *, optional: bool = False, hint: str = "") -> None:
    """Raise ``ValueError("<name> must be <allowed.expected>[ (<hint>)], got <value>")`` unless ``allowed``
    accepts ``value`` (or it is ``None`` and ``optional``)."""
    if (optional and value is None) or allowed.accept(value):
        return
    note = f" ({hint})" if hint else ""
    raise ValueError(f"{name} must be {allowed.expected}{note}, got {value!r}")


def check_fields(config: object, rules: dict[str, Range], *, optional: frozenset[str] = frozenset()) -> None:
    """:func:`check` each field of ``config`` named in ``rules`` (those in ``optional`` may be ``None``)."""
    for name, allowed in rules.items():
        check(name, getattr(config, name), allowed, optional=name in optional)
