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

A config made of parts holds each part in a field made with ``metadata=PART`` whose default factory is the part's
dataclass; a part's fields keep their flat names (in TOML files, flags and keyword arguments), and
:func:`flat_fields` says which part each one lives in:

>>> @dataclass
... class Job:
...     name: str = "job"
...     run: Run = field(default_factory=Run, metadata=PART)
>>> [(owner, f.name) for owner, f in flat_fields(Job)]
[(None, 'name'), ('run', 'steps')]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from embforge import ranges

KEY = "embforge"
PART = MappingProxyType(
    {"embforge.part": True}
)  # the metadata of a field holding a part: field(..., metadata=PART)


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


def parts(cls: type) -> dict[str, type]:
    """``field name -> part class`` of dataclass ``cls``: its fields made with ``metadata=PART``."""
    return {item.name: owner for item in dataclasses.fields(cls) if (owner := _part_of(item)) is not None}


def _part_of(item: dataclasses.Field[object]) -> type | None:
    factory = item.default_factory
    return factory if item.metadata.get("embforge.part") and isinstance(factory, type) else None


def flat_fields(cls: type) -> Iterator[tuple[str | None, dataclasses.Field[object]]]:
    """The flat fields of dataclass ``cls``, in declaration order: its own (part ``None``) and each part's, with
    the name of the field holding that part. A flat name lives in exactly one place."""
    for item in dataclasses.fields(cls):
        owner = _part_of(item)
        if owner is None:
            yield None, item
        else:
            yield from ((item.name, inner) for inner in dataclasses.fields(owner))


def flat_values(config: object) -> dict[str, object]:
    """The flat fields of dataclass instance ``config`` and their values, in declaration order (its parts'
    fields in the part's place)."""
    return {
        item.name: getattr(config if owner is None else getattr(config, owner), item.name)
        for owner, item in flat_fields(type(config))
    }


def described(cls: type) -> Iterator[tuple[dataclasses.Field[Any], About]]:
    """The flat fields of dataclass ``cls`` (its parts' included) that offer a flag, in declaration order, with
    what they declare."""
    for _, item in flat_fields(cls):
        info = item.metadata.get(KEY)
        if info is not None and info.help is not None:
            yield item, info


def about_field(cls: type, name: str) -> About:
    """What flat field ``name`` of dataclass ``cls`` (or of one of its parts) declares (an empty :class:`About`
    when nothing)."""
    item = next(f for _, f in flat_fields(cls) if f.name == name)
    return item.metadata.get(KEY, About())


def check_ranges(config: object) -> None:
    """:func:`embforge.ranges.check` every field of ``config`` that declares a ``range`` (a field whose default
    is ``None`` may be ``None``: not set)."""
    for item in dataclasses.fields(config):  # type: ignore[arg-type]
        info = item.metadata.get(KEY)
        if info is not None and info.range is not None and info.checked:
            ranges.check(item.name, getattr(config, item.name), info.range, optional=item.default is None)
