"""The ``embforge`` command. Each verb lives in a small module with a ``register(verbs, evals)`` function.

Handlers return a dict (printed as one JSON line, the last line of stdout) or ``None``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from collections.abc import Iterator, Sequence

VERB_MODULES = [
    "embforge.cli.train",
    "embforge.cli.evaluate",
    "embforge.cli.encode",
    "embforge.cli.eval_tasks",
    "embforge.cli.export",
    "embforge.cli.serve",
    "embforge.cli.retrieval",
    "embforge.cli.cross",
    "embforge.cli.report",
    "embforge.cli.score",
    "embforge.cli.merge",
    "embforge.cli.curate",
    "embforge.cli.static",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embforge", description="Fine-tune, evaluate, export and serve text embedding models."
    )
    parser.add_argument("--version", action="version", version=_version())
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    eval_parser = verbs.add_parser("eval", help="evaluate a model; prints a JSON line of metrics last")
    evals = eval_parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    for name in VERB_MODULES:
        importlib.import_module(name).register(verbs, evals)
    for help_text, sub in _walk(parser):
        _finish(sub, help_text)
    return parser


def _walk(
    parser: argparse.ArgumentParser, help_text: str | None = None
) -> Iterator[tuple[str | None, argparse.ArgumentParser]]:
    """Every parser of the tree with the help its parent lists it under."""
    yield help_text, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield from _walk(sub, helps.get(name))


def _finish(parser: argparse.ArgumentParser, help_text: str | None) -> None:
    """Plain-text help everywhere (docstrings' reST markup removed), a description for every verb (its one-line
    help when it has none), and ``--quiet`` on every leaf verb."""
    has_verbs = any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    if not has_verbs and "--quiet" not in parser._option_string_actions and parser.prog != "embforge":
        parser.add_argument("--quiet", action="store_true", help="no progress bars (for scripts and logs)")
    for action in parser._actions:
        action.help = plain_text(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = plain_text(choice.help)
    if not parser.description and help_text:
        parser.description = help_text[0].upper() + help_text[1:] + "."
    parser.description = plain_text(parser.description)


def plain_text(text: str | None) -> str | None:
    """``:func:`embforge.x.y``` -> ``embforge.x.y``; ````code```` -> ``code`` (argparse prints text as is).

    >>> plain_text("see :func:`embforge.cli.main` and ``--amp``")
    'see embforge.cli.main and --amp'
    """
    if text is None:
        return None
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "")


# What the library raises, with a message for the user, about the user's input: a value, a file, a path that is
# the wrong kind of thing, a missing optional package, a run that diverged (FloatingPointError names the step and
# what to lower). Anything else is a bug and keeps its traceback.
USER_ERRORS = (
    ValueError,
    KeyError,
    ImportError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    FloatingPointError,
)


def _one_line(error: BaseException) -> str:
    """The error's message on one line; an ``OSError`` as ``PATH: what is wrong`` (not ``[Errno 21] ...``)."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return " ".join(str(error).split())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from embforge.modeling.precision import inference_autocast
    from embforge.progress import progress_bars

    try:  # bars on every long step (with ETA) unless --quiet
        with (
            progress_bars(not getattr(args, "quiet", False)),
            inference_autocast(getattr(args, "inference_amp", "no")),
        ):
            result = args.func(args)
    except USER_ERRORS as err:
        print(f"embforge {args.verb}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result, default=float))
    return 0


def _version() -> str:
    from embforge import __version__

    return f"embforge {__version__}"
