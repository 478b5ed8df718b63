"""Every verb of ``embforge`` explains itself: a description, help on every flag, no raw docstring markup."""

from __future__ import annotations

import argparse
import re

import pytest

from embforge.cli import build_parser

MARKUP = re.compile(r":(?:func|mod|class|meth|data|attr|obj):|``")


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("embforge",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


PARSERS = list(_parsers(build_parser()))


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=[" ".join(p) for p, _ in PARSERS])
def test_verb_has_a_description_and_every_flag_has_help(path, parser):
    assert parser.description and parser.description.strip(), f"{' '.join(path)} has no description"
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                assert choice.help, f"{' '.join(path)} {choice.dest}: the sub-verb has no help"
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help.strip(), f"{' '.join(path)} {name} has no help text"


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=[" ".join(p) for p, _ in PARSERS])
def test_help_shows_no_docstring_markup(path, parser):
    text = parser.format_help()
    assert not MARKUP.search(text), f"{' '.join(path)} --help shows markup: {MARKUP.findall(text)}"


def test_every_verb_takes_quiet():
    for path, parser in PARSERS:
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions) and len(path) > 1:
            assert "--quiet" in parser._option_string_actions, f"{' '.join(path)} has no --quiet"


def _help_of(path: tuple[str, ...], dest: str) -> str:
    parser = dict(PARSERS)[path]
    return next(a.help for a in parser._actions if a.dest == dest) or ""


def test_train_help_states_the_default_loss_of_every_model_kind():
    from embforge.kinds import ModelKind
    from embforge.training.run import RunSpec, resolved_loss

    text = _help_of(("embforge", "train"), "loss")
    for kind in ModelKind:
        default = resolved_loss(RunSpec(model_type=kind.value))
        phrase = "default cosent" if default == "cosent" else f"{default} for {kind.value} models"
        assert phrase in text, (
            f"train --help does not say the default loss of {kind.value} models ({default})"
        )
    assert resolved_loss(RunSpec(retrieval_train="folder")) == "infonce"
    assert "infonce with --retrieval-train" in text


def test_train_help_lists_every_loss_of_every_kind():
    from embforge.losses import LOSSES
    from embforge.losses.cross import CROSS_LOSSES
    from embforge.losses.late import MULTIVECTOR_LOSSES

    text = _help_of(("embforge", "train"), "loss")
    for name in [*LOSSES, *CROSS_LOSSES, *MULTIVECTOR_LOSSES]:
        assert re.search(rf"\b{name}\b", text), f"train --help does not list the {name!r} loss"
    assert "multi-vector models: infonce, margin_mse, kl_distill" in text
