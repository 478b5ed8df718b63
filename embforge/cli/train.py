"""``embforge train``: fine-tune a model from files (flags and/or a TOML config)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from embforge.cli.common import parse_options
from embforge.cli.values import Checked, data_path, device, folder, int_list, option
from embforge.fields import About, described

# the sections of `train --help`, in order; each field names its section (embforge.fields.About.group)
GROUPS = {
    "data": "what to train on and how it is read",
    "model": "the model trained",
    "loss": "what is optimised",
    "optimisation": "steps, batch and learning rate",
    "scale": "memory, precision, devices",
    "evaluation": "what is measured during training (the best value keeps best/)",
    "output": "what is written, and resuming",
}
# the kinds of value a field names (About.value) -> the argparse type that reads and checks one
_VALUES: dict[str, Callable[[str], object]] = {
    "data": data_path,
    "folder": folder,
    "device": device,
    "int_list": int_list,
    "option": option,
}


def _fields() -> list[tuple[dataclasses.Field[object], About]]:
    """The fields of a run that have a flag: :class:`RunSpec`'s, then :class:`TrainConfig`'s."""
    from embforge.training.config import TrainConfig
    from embforge.training.spec import RunSpec

    return [*described(RunSpec), *described(TrainConfig)]


def _value_type(item: dataclasses.Field[object], info: About) -> Callable[[str], object]:
    """The argparse type of a field's flag: its named kind of value, else its range (an integer field's values
    parse as integers), else text."""
    if info.value is not None:
        return _VALUES[info.value]
    if info.range is not None:
        integral = str(item.type).startswith("int")
        parse: Callable[[str], Any] = int if integral else float
        return Checked(item.name, parse, info.range.accept, info.range.expected, "N" if integral else "X")
    return str


def _loss_help(text: str) -> str:
    from embforge.losses import LOSSES
    from embforge.losses.cross import CROSS_LOSSES
    from embforge.losses.late import MULTIVECTOR_LOSSES

    cross, late = ", ".join(CROSS_LOSSES), ", ".join(MULTIVECTOR_LOSSES)
    return f"{text}: {', '.join(LOSSES)}; cross-encoders (--model-type cross): {cross}; multi-vector models: {late}"


def _add_flag(group: argparse._ArgumentGroup, item: dataclasses.Field[object], info: About) -> None:
    """The flag of one field, generated from what the field declares."""
    text = _loss_help(str(info.help)) if item.name == "loss" else info.help
    flag = info.flag_of(item.name)
    if info.switch:
        action = argparse.BooleanOptionalAction if info.negatable else "store_true"
        group.add_argument(flag, dest=item.name, action=action, default=None, help=text)
        return
    kind = _value_type(item, info)
    group.add_argument(
        flag,
        dest=item.name,
        type=kind,
        default=None,
        action="append" if info.repeat else "store",
        metavar=None if info.choices else info.metavar or getattr(kind, "metavar", "VALUE"),
        choices=info.choices,
        help=text,
    )


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser("train", help="fine-tune a model", description=__doc__)
    group = {title: parser.add_argument_group(title, text) for title, text in GROUPS.items()}
    parser.add_argument(
        "config_file", nargs="?", metavar="RUN.toml", help="optional TOML run file (flags override it)"
    )
    parser.add_argument(
        "--config",
        dest="config_flag",
        metavar="RUN.toml",
        help="TOML run file (same as the positional argument)",
    )
    for item, info in _fields():  # every flag generated from the field it sets
        _add_flag(group[info.group], item, info)
    parser.set_defaults(func=run_train)


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The run's fields the command line set, keyed by field."""
    given = {item.name: getattr(args, item.name) for item, _ in _fields()}
    if given["loss_options"]:
        given["loss_options"] = parse_options(given["loss_options"])
    return {key: value for key, value in given.items() if value is not None}


def _flag(key: str) -> str:
    """The flag that sets field ``key``."""
    return next(info.flag_of(item.name) for item, info in _fields() if item.name == key)


def _run_pipeline(path: str, given: dict[str, Any]) -> Mapping[str, object] | None:
    """Run the pipeline file ``path``; each flag given overrides its field in every stage, or is refused in one
    line naming it (a flag that describes one run's task: --train, --loss ...), never dropped."""
    from embforge.training.distributed import is_main
    from embforge.training.pipeline import load_pipeline, run_pipeline
    from embforge.training.pipeline_file import refusal

    output, resume, overwrite = (
        given.pop("output", None),
        given.pop("resume", False),
        given.pop("overwrite", False),
    )
    for key in given:
        reason = refusal(key)
        if reason:
            raise ValueError(f"{_flag(key)} cannot be given with a pipeline file ({path}): {reason}")
    result = run_pipeline(
        load_pipeline(path), output=output, resume=resume, overwrite=overwrite, overrides=given
    )
    return result if is_main() else None  # torchrun: rank 0 prints


def run_train(args: argparse.Namespace) -> Mapping[str, object] | None:
    from embforge.training.distributed import is_main
    from embforge.training.run import load_toml, run, spec_from_dict

    path = args.config_file or args.config_flag
    values: dict[str, Any] = load_toml(path) if path else {}
    given = _given(args)
    if path and "stages" in values:  # a multi-stage pipeline file (embforge/pipeline.py)
        return _run_pipeline(path, given)
    if "loss_options" in given:
        given["loss_options"] = {**values.get("loss_options", {}), **given["loss_options"]}
    spec = spec_from_dict({**values, **given}, source=path or "command line")
    summary = run(spec, source=path or "command line")
    return {"output": spec.config.output, **summary} if is_main() else None
