"""The shared argument helpers of ``embforge.cli.common``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from embforge.cli.common import add_actions, add_eval_kind, config_from_args


@dataclass
class _Config:
    max_inputs: int = 1
    timeout_s: float = 2.0
    names: list[str] = field(default_factory=list)
    derived: int = field(default=0, init=False)


def test_config_from_args_takes_same_named_flags_and_keeps_defaults_of_the_rest():
    args = argparse.Namespace(max_inputs=7, timeout=3.0, derived=99, unrelated="x")
    config = config_from_args(_Config, args, timeout_s=args.timeout)
    assert config == _Config(max_inputs=7, timeout_s=3.0)
    assert config.derived == 0  # a field the constructor does not take is never filled from a flag


def test_config_from_args_values_win_over_flags():
    config = config_from_args(_Config, argparse.Namespace(max_inputs=7), max_inputs=8)
    assert config.max_inputs == 8


def test_add_eval_kind_gives_model_data_batch_size_and_func():
    parser = argparse.ArgumentParser()
    evals = parser.add_subparsers(dest="kind", required=True)

    def run(args: argparse.Namespace) -> dict:
        """a demo score (0-100)

        Score a model on a demo file.
        """
        return {}

    kind = add_eval_kind(evals, "demo", run, data_flag="--train")
    assert kind.description == "Score a model on a demo file."
    assert "a demo score (0-100)" in parser.format_help() or evals.choices["demo"] is kind
    kind.add_argument("--extra", type=int, default=1)
    args = parser.parse_args(["demo", "--train", "t.csv", "--batch-size", "5", "--model", "m"])
    assert (args.train, args.batch_size, args.model, args.extra, args.func) == ("t.csv", 5, "m", 1, run)
    assert parser.parse_args(["demo", "--train", "t.csv"]).batch_size == 64


def test_add_actions_requires_an_action():
    parser = argparse.ArgumentParser()
    verbs = parser.add_subparsers(dest="verb", required=True)
    actions = add_actions(verbs, "thing", help="h", dest="action")
    actions.add_parser("do")
    assert parser.parse_args(["thing", "do"]).action == "do"
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["thing"])
    assert stop.value.code == 2
