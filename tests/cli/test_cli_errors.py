"""Issue #48: every user error of the command line ends in one line naming the flag or file, never a traceback.

Each row of :data:`CASES` runs ``embforge`` on a wrong value (a number out of range, a file of the wrong kind, a
model folder with a broken file) and asserts: a non-zero exit status, no traceback, and one ``error:`` line, the
last one on stderr, that names the flag or the file. Most rows run in-process through :func:`embforge.cli.main`;
the few that could hang or eat memory on a regression (``/dev/zero``, a FIFO, 100,000 onnxruntime threads) run in
a subprocess with a time and memory limit.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from embforge.cli import build_parser, main
from embforge.cli.values import (
    data_path,
    device,
    finite_float,
    folder,
    non_negative_float,
    non_negative_int,
    number,
    option,
    port,
    positive_float,
    positive_int,
    ratio,
    seconds,
    streams,
    threads,
)
from tests.conftest import free_port


class Case(NamedTuple):
    """``argv`` (``{name}`` fields filled from the test's paths) must fail with an error line holding ``names``."""

    id: str
    argv: str
    names: str
    subprocess: bool = False
    xfail: str | None = None


TRAIN = "train --model {model} --train {sts} --output {out} --batch-size 8 --quiet"
SERVE = "serve --model {model} --port {port}"
ENCODE = "encode --input {texts} --output {out}.npy"

CASES = [
    # item 13: numbers accepted with odd effects
    Case("serve --port 70000", SERVE.replace("{port}", "70000"), "--port"),
    Case("serve --timeout nan", f"{SERVE} --timeout nan", "--timeout"),
    Case("serve --keep-alive nan", f"{SERVE} --keep-alive nan", "--keep-alive"),
    Case("serve --threads -4", f"{SERVE} --threads -4", "--threads"),
    Case("serve --streams -3", f"{SERVE} --streams -3", "--streams"),
    # an index option without an index folder was dropped silently (the in-memory stores take none)
    Case("serve --index-option without --index", f"{SERVE} --index-option m=32", "--index-option"),
    Case("serve --qdrant-url without --index", f"{SERVE} --qdrant-url http://localhost:6333", "--qdrant-url"),
    Case("serve --threads 100000", f"{SERVE} --backend onnx --threads 100000", "--threads", subprocess=True),
    Case("train --max-steps -5", f"{TRAIN} --max-steps -5", "--max-steps"),
    Case("train --max-steps 0", f"{TRAIN} --max-steps 0", "--max-steps"),
    Case("train --warmup-ratio 5", f"{TRAIN} --warmup-ratio 5", "--warmup-ratio"),
    Case("train --warmup-ratio -1", f"{TRAIN} --warmup-ratio -1", "--warmup-ratio"),
    Case("train --max-grad-norm nan", f"{TRAIN} --max-grad-norm nan", "--max-grad-norm"),
    Case("train --save-every -1", f"{TRAIN} --save-every -1", "--save-every"),
    Case("train --lr inf", f"{TRAIN} --lr inf", "--lr"),
    Case("train --weight-decay nan", f"{TRAIN} --weight-decay nan", "--weight-decay"),
    Case("train --loss-option scale=nan", f"{TRAIN} --loss-option scale=nan", "scale=nan"),
    Case("train --device cuda:7", f"{TRAIN} --device cuda:7", "cuda:7"),
    Case("encode --batch-size 0", f"{ENCODE} --model {{model}} --batch-size 0", "--batch-size"),
    Case(
        "distill-static --pca-dims -5",
        "distill-static --model {model} --output {out} --pca-dims -5",
        "--pca-dims",
    ),
    # files of the wrong kind
    Case("train --train /dev/zero", TRAIN.replace("{sts}", "/dev/zero"), "/dev/zero", subprocess=True),
    Case("train --train FIFO", TRAIN.replace("{sts}", "{fifo}"), "{fifo}", subprocess=True),
    Case("train --output FILE", TRAIN.replace("{out}", "{file}"), "{file}"),
    Case("serve --calibration DIR", f"{SERVE} --calibration {{folder}}", "{folder}"),
    Case("serve --index FILE", f"{SERVE} --index {{file}}", "{file}"),
    Case("index search --index FILE", "index search --model {model} --index {file} --query a", "{file}"),
    # a model folder with a broken file
    Case("model.safetensors not safetensors", f"{ENCODE} --model {{bad_weights}}", "model.safetensors"),
    Case("tokenizer.json not JSON", f"{ENCODE} --model {{bad_tokenizer}}", "tokenizer.json"),
]


@pytest.fixture
def paths(tmp_path: Path, tiny_model_dir: Path, sts_csv: Path) -> dict[str, str]:
    """The files the cases name: a tiny model, good data, and files of the wrong kind."""
    texts = tmp_path / "texts.txt"
    texts.write_text("a cat\na dog\n")
    regular = tmp_path / "regular-file"
    regular.write_text("not a folder\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    bad_weights = tmp_path / "bad-weights"
    shutil.copytree(tiny_model_dir, bad_weights)
    (bad_weights / "model.safetensors").write_bytes(b"\x00garbage, not safetensors" * 40)
    bad_tokenizer = tmp_path / "bad-tokenizer"
    shutil.copytree(tiny_model_dir, bad_tokenizer)
    (bad_tokenizer / "tokenizer.json").write_text("{ this is not JSON")
    folder = tmp_path / "a-folder"
    folder.mkdir()
    return {
        "model": str(tiny_model_dir),
        "sts": str(sts_csv),
        "texts": str(texts),
        "out": str(tmp_path / "out"),
        "file": str(regular),
        "fifo": str(fifo),
        "folder": str(folder),
        "bad_weights": str(bad_weights),
        "bad_tokenizer": str(bad_tokenizer),
        "port": str(free_port()),
    }


def _limited() -> None:  # pragma: no cover (runs in the child)
    """A child's limits: 4 GiB of address space (a read of /dev/zero or a thread storm fails, not the machine)."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def _run_subprocess(argv: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "embforge", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=_limited,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as expired:
        err = expired.stderr.decode() if isinstance(expired.stderr, bytes) else expired.stderr or ""
        pytest.fail(f"still running after 120 s; stderr: {err[-2000:]}")
    return done.returncode, done.stderr


def _run_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except Exception as error:  # the test's own report of what a user would see as a traceback
        err = capsys.readouterr().err
        pytest.fail(f"Traceback: uncaught {type(error).__name__}: {error}\nstderr: {err[-2000:]}")
    return code, capsys.readouterr().err


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A case that gets as far as starting the server failed to refuse its value: fail instead of listening."""
    import uvicorn

    def refuse(self: object, *args: object, **kwargs: object) -> None:
        raise AssertionError("the value was accepted: the server would start")

    monkeypatch.setattr(uvicorn.Server, "run", refuse)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=False, reason=c.xfail)] if c.xfail else [])
        for c in CASES
    ],
)
def test_a_user_error_is_one_line_naming_the_flag_or_file(case: Case, paths, capsys, no_server):
    argv = [part.format(**paths) for part in case.argv.split()]
    code, err = _run_subprocess(argv) if case.subprocess else _run_in_process(argv, capsys)
    assert code != 0, f"exit status 0; stderr: {err[-2000:]}"
    assert "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err[-3000:]
    assert errors[0] == err.strip().splitlines()[-1], err[-3000:]
    assert case.names.format(**paths) in errors[0]


# ------------------------------------------------------------------ every numeric flag of every verb has a range


def _leaf_parsers(parser: argparse.ArgumentParser, path: str = "embforge"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaf_parsers(sub, f"{path} {name}")


def test_every_numeric_flag_of_every_verb_is_range_checked():
    """A bare ``type=int`` / ``type=float`` takes -5, 0, nan and inf; every numeric flag says what it accepts."""
    bare = [
        f"{path} {'/'.join(action.option_strings)}"
        for path, parser in _leaf_parsers(build_parser())
        for action in parser._actions
        if action.type in (int, float)
    ]
    assert bare == []


@pytest.mark.parametrize(
    ("checker", "good", "bad"),
    [
        (positive_int, {"1": 1, "7": 7}, ["0", "-5", "1.5", "x", ""]),
        (non_negative_int, {"0": 0, "3": 3}, ["-1", "nan"]),
        (port, {"1": 1, "65535": 65535}, ["0", "70000", "-1"]),
        (positive_float, {"1e-5": 1e-5, "3": 3.0}, ["0", "-1", "nan", "inf", "-inf", "1e999"]),
        (non_negative_float, {"0": 0.0, "2.5": 2.5}, ["-0.1", "nan", "inf"]),
        (ratio, {"0": 0.0, "1": 1.0, "0.5": 0.5}, ["-1", "5", "1.01", "nan"]),
        (number(0, 1, open_high=True), {"0": 0.0, "0.99": 0.99}, ["1", "nan"]),
        (number(0, 1, open_low=True), {"1": 1.0, "0.01": 0.01}, ["0", "nan"]),
        (seconds, {"30": 30.0, "0.5": 0.5}, ["0", "nan", "inf", "1e9"]),
        (finite_float, {"-3": -3.0, "0": 0.0}, ["nan", "inf", "-inf"]),
    ],
)
def test_a_range_checker_keeps_good_values_and_refuses_the_rest_in_one_line(checker, good, bad):
    assert {text: checker(text) for text in good} == good
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match=r"^must be .*, got ") as refused:
            checker(text)
        assert "\n" not in str(refused.value)


def test_threads_are_capped_at_four_per_cpu(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert threads("8") == 8 and streams("0") == 0
    for text in ("0", "9", "100000", "-4"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"from 1 to 8 \(4 x the 2 CPUs here\)"):
            threads(text)


def test_numbers_the_user_gave_reach_the_run_and_defaults_stay_unset():
    parser = build_parser()
    args = parser.parse_args(["train", "--train", "t.csv", "--max-steps", "3", "--warmup-ratio", "0"])
    assert (args.max_steps, args.warmup_ratio, args.lr, args.epochs) == (3, 0.0, None, None)  # None: no limit
    args = parser.parse_args(["serve", "--port", "65535", "--timeout", "0.5", "--threads", "1"])
    assert (args.port, args.timeout, args.threads, args.streams) == (65535, 0.5, 1, 0)
    args = parser.parse_args(["merge", "--models", "a", "b", "--output", "o", "--weights", "0.3,0.7"])
    assert (args.weights, args.grid[:3]) == ([0.3, 0.7], [0.0, 0.1, 0.2])


def test_paths_that_may_not_exist_yet_pass_and_a_device_this_machine_has_passes(tmp_path):
    assert data_path("sentence-transformers/stsb") == "sentence-transformers/stsb"  # a data set id
    assert data_path(str(tmp_path)) == str(tmp_path)  # a folder of data files
    assert folder(str(tmp_path / "new")) == str(tmp_path / "new")
    assert device("cpu") == "cpu" and device("auto") == "auto"
    with pytest.raises(argparse.ArgumentTypeError, match="'gpu' is not a device"):
        device("gpu")


def test_a_number_inside_an_option_must_be_finite():
    assert option("scale=20") == "scale=20" and option("name=nan-ish") == "name=nan-ish"
    for text in ("scale=nan", "scale=inf", "scale=1e999", "scale"):
        with pytest.raises(argparse.ArgumentTypeError, match="scale"):
            option(text)
