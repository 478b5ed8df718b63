"""What a config field is, declared once on the field: its range (checked by the config) and how it is offered as
a flag (help, group, placeholder, choices). The CLI generates its flags from it (``embforge.cli.train``).

>>> from dataclasses import dataclass, field
>>> @dataclass
... class Run:
...     steps: int = field(default=1, metadata=about("steps (default 1)", range=ranges.POSITIVE_INT))
...     def __post_init__(self) -> None:
...         check_ranges(self)
>>> Run(steps=0)
Traceback (most recent call last):
...
ValueError: steps must be a positive integer, got 0
>>> [(f.name, info.flag_of(f.name)) for f, info in described(Run)]
[('steps', '--steps')]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from embforge import ranges

KEY = "embforge"


@dataclass(frozen=True)
class About:
    """A field's range and flag. ``help=None``: no flag (the field is set in TOML files or Python only).

    ``value`` names the kind of a flag's value that is not a plain number or text (``data``: a data file or
    folder, ``folder``: a folder written to, ``device``, ``int_list``, ``option``: ``NAME=VALUE``), ``switch``
    makes an on/off flag (``negatable``: with a ``--no-`` form), ``repeat`` a flag given once per value.
    ``checked=False``: the range is the flag's only; the field's own module checks the value (with its words).
    ``pipeline``: why the field, which describes one run's task, cannot be set in every stage of a pipeline file.
    """

    help: str | None = None
    group: str = "data"
    range: ranges.Range | None = None
    checked: bool = True
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    value: str | None = None
    switch: bool = False
    negatable: bool = False
    repeat: bool = False
    name: str | None = None  # the flag, when not --<field-name>
    pipeline: str | None = None  # why a pipeline file cannot take the field in every stage (None: it can)

    def flag_of(self, field_name: str) -> str:
        return self.name or "--" + field_name.replace("_", "-")


def about(help: str | None = None, **details: Any) -> dict[str, About]:
    """``field(metadata=about(...))``: see :class:`About`."""
    return {KEY: About(help, **details)}


def setting(default: Any, help: str | None = None, **details: Any) -> Any:
    """A dataclass field with its range and flag declared: ``lr: float = setting(5e-5, "peak rate", range=...)``
    (a list or a dict: ``field(default_factory=list, metadata=about(...))``)."""
    return dataclasses.field(default=default, metadata=about(help, **details))


def described(cls: type) -> Iterator[tuple[dataclasses.Field[Any], About]]:
    """The fields of dataclass ``cls`` that offer a flag, in declaration order, with what they declare."""
    for item in dataclasses.fields(cls):
        info = item.metadata.get(KEY)
        if info is not None and info.help is not None:
            yield item, info


def about_field(cls: type, name: str) -> About:
    """What field ``name`` of dataclass ``cls`` declares (an empty :class:`About` when nothing)."""
    item = next(f for f in dataclasses.fields(cls) if f.name == name)
    return item.metadata.get(KEY, About())


def check_ranges(config: object) -> None:
    """:func:`embforge.ranges.check` every field of ``config`` that declares a ``range`` (a field whose default
    is ``None`` may be ``None``: not set)."""
    for item in dataclasses.fields(config):  # type: ignore[arg-type]
        info = item.metadata.get(KEY)
        if info is not None and info.range is not None and info.checked:
            ranges.check(item.name, getattr(config, item.name), info.range, optional=item.default is None)
