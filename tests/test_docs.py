"""The documentation tells the truth: the site's code blocks run, and no page (README.md, docs/) names a file,
module, CLI verb, flag or make target that does not exist.

- Python blocks of docs/ run as written in a fresh interpreter from a scratch folder beside ``../shared`` (the
  README's run in tests/test_readme.py); a ``print(...)  # text`` line must print ``text``.
- ``embforge ...`` lines of bash blocks (``torchrun ... -m embforge`` too) parse with embforge's own parser;
  ``benchmarks/*.py`` lines name a script that exists and flags it defines; ``make X`` names a Makefile target.
- In the prose: ``embforge.x.y`` resolves (module, then attributes), a path such as ``embforge/modeling/packing.py``
  or ``benchmarks/bench_train.py`` exists, `` `embforge verb --flag` `` names a verb and its flag, and every
  ``--flag`` is one of embforge's, one of a benchmark script's, or one of the few other tools' listed here.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import re
import shlex
import sys

import pytest

from embforge.cli import build_parser

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib
from tests.conftest import requires_data, requires_minilm, shared_data
from tests.doc_pages import (
    DOCS,
    ROOT,
    blocks,
    command_lines,
    expected_prints,
    name,
    pages,
    prose,
    run_python_block,
)

SITE_PAGES = [p for p in pages() if p.is_relative_to(DOCS)]
PYTHON = [
    (name(p), i, code) for p in SITE_PAGES for i, code in enumerate(blocks(p.read_text("utf-8"), "python"))
]
COMMANDS = [(name(p), c) for p in SITE_PAGES for c in command_lines(p.read_text("utf-8"))]

# flags of the other tools the pages show (torchrun, Slurm, pip, the Hub CLI, mkdocs, pytest)
OTHER_TOOLS_FLAGS = {
    "--nproc-per-node",
    "--nnodes",
    "--rdzv-backend",
    "--rdzv-endpoint",
    "--rdzv-id",
    "--nodes",
    "--ntasks-per-node",
    "--gpus-per-node",
    "--cpus-per-task",
    "--local-dir",
    "--no-deps",
    "--strict",
    "--ignore",
}
# the package's subfolders and top-level files a page may name relative to embforge/
PACKAGE = ROOT / "embforge"


def test_the_site_has_pages_and_runnable_blocks():
    assert len(SITE_PAGES) >= 20
    assert len(PYTHON) >= 5
    assert len(COMMANDS) >= 30


@requires_minilm
@requires_data
@pytest.mark.integration
@pytest.mark.parametrize(("page", "number", "code"), PYTHON, ids=[f"{p}#{i + 1}" for p, i, _ in PYTHON])
def test_python_block_runs(page, number, code, tmp_path):
    done = run_python_block(code, tmp_path, shared_data())
    assert done.returncode == 0, f"{page} block {number + 1} failed:\n{code}\n{done.stderr[-3000:]}"
    printed = [line.strip() for line in done.stdout.splitlines()]
    for expected in expected_prints(code):
        assert expected in printed, f"{page} block {number + 1} promises {expected!r}, printed {printed}"


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}: {c[:60]}" for p, c in COMMANDS])
def test_command_parses(page, command, capsys):
    try:
        build_parser().parse_args(shlex.split(command)[1:])
    except SystemExit:
        pytest.fail(f"{page}'s `{command}` does not parse: {capsys.readouterr().err.strip()}")


@pytest.mark.parametrize("page", SITE_PAGES, ids=name)
def test_toml_blocks_parse(page):
    for block in blocks(page.read_text("utf-8"), "toml"):
        tomllib.loads(block)


@functools.cache
def cli_options() -> dict[tuple[str, ...], set[str]]:
    """Every verb path of ``embforge`` (``()``, ``("train",)``, ``("eval", "sts")`` ...) and its option strings."""
    found: dict[tuple[str, ...], set[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        found[path] = {s for a in parser._actions for s in a.option_strings}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for verb, sub in action.choices.items():
                    walk(sub, (*path, verb))

    walk(build_parser(), ())
    return found


@functools.cache
def script_flags(script: str) -> set[str]:
    """The ``--flags`` a benchmark or docs script defines (its source's quoted ``"--name"`` strings)."""
    return set(re.findall(r"[\"'](--[a-z][\w-]*)[\"']", (ROOT / script).read_text("utf-8")))


@functools.cache
def known_flags() -> set[str]:
    flags = {f for options in cli_options().values() for f in options}
    for script in [*ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("docs/*.py")]:
        flags |= script_flags(script.relative_to(ROOT).as_posix())
    return flags | OTHER_TOOLS_FLAGS


@functools.cache
def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text("utf-8")
    return {t for line in re.findall(r"^([\w.-][\w. -]*):(?!=)", text, re.M) for t in line.split()}


def resolves(dotted: str) -> bool:
    """``embforge.a.b.C.d``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def path_exists(path: str) -> bool:
    """A repository path, or one relative to embforge/ (``training/loop.py``), or a bare script name."""
    path = path.rstrip("/")
    if (ROOT / path).exists() or (PACKAGE / path).exists():
        return True
    if "/" not in path:
        return any(any(ROOT.glob(f"{top}/**/{path}")) for top in ("benchmarks", "embforge", "tests", "docs"))
    return False


def _spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(text))


def named_paths(text: str) -> list[str]:
    """Paths the prose and blocks name: under embforge/ tests/ benchmarks/ docs/, or ``*.py`` in a code span."""
    top = "|".join(["embforge", "tests", "benchmarks", r"\.ci"])
    found = re.findall(rf"(?<![\w./-])((?:{top})/[\w./-]*[\w/])", text)
    found += re.findall(r"(?<![\w./-])(docs/[\w/-]+\.(?:md|py))", text)
    for span in _spans(text):
        script = re.fullmatch(r"[\w./-]+\.py", span) and not span.startswith(("runs/", "/"))
        if script or re.fullmatch(
            r"(Makefile|pyproject\.toml|constraints\.txt|mkdocs\.yml|CHANGELOG\.md)", span
        ):
            found.append(span)
    return found


@pytest.mark.parametrize("page", pages(), ids=name)
def test_named_modules_exist(page):
    text = page.read_text("utf-8")
    dotted = set(re.findall(r"(?<![\w./-])(embforge(?:\.[A-Za-z_]\w*)+)", prose(text)))
    dotted |= set(re.findall(r"^::: (embforge[\w.]*)", text, re.M))
    missing = sorted(d for d in dotted if not resolves(d))
    assert not missing, f"{name(page)} names {missing}, which embforge does not have"


@pytest.mark.parametrize("page", pages(), ids=name)
def test_named_paths_exist(page):
    missing = sorted({p for p in named_paths(page.read_text("utf-8")) if not path_exists(p)})
    assert not missing, f"{name(page)} names {missing}, which the repository lacks"


@pytest.mark.parametrize("page", pages(), ids=name)
def test_named_verbs_and_their_flags_exist(page):
    options = cli_options()
    wrong = []
    for span in _spans(page.read_text("utf-8")):
        if not span.startswith("embforge "):
            continue
        words = span.split()[1:]
        path: tuple[str, ...] = ()
        for word in words:
            if (*path, word) in options:
                path = (*path, word)
            elif not word.startswith("-"):
                break
        if not path:
            wrong.append(f"`{span}`: no verb {words[0]!r}")
            continue
        subverbs = {p[len(path)] for p in options if len(p) > len(path) and p[: len(path)] == path}
        if subverbs and len(words) > len(path) and re.fullmatch(r"[a-z][\w-]*", words[len(path)]):
            wrong.append(f"`{span}`: {' '.join(path)} has no {words[len(path)]!r}")
        for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", span):
            if flag not in options[path] and flag not in options[()]:
                wrong.append(f"`{span}`: {' '.join(path)} has no {flag}")
    assert not wrong, f"{name(page)}: {wrong}"


@pytest.mark.parametrize("page", pages(), ids=name)
def test_named_flags_exist(page):
    text = page.read_text("utf-8")
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])", prose(text)))
    unknown = sorted(flags - known_flags())
    assert not unknown, (
        f"{name(page)} names {unknown}: no embforge verb, benchmark script or listed tool has them"
    )


@pytest.mark.parametrize("page", pages(), ids=name)
def test_script_lines_name_scripts_and_their_flags(page):
    wrong = []
    for block in blocks(page.read_text("utf-8"), "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line)
            for script in re.findall(r"(?<![\w/])((?:benchmarks|docs)/[\w/]+\.py)", line):
                if not (ROOT / script).exists():
                    wrong.append(f"{script} does not exist")
                    continue
                rest = line.split(script, 1)[1]
                wrong += [f"{script} has no {f}" for f in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest)
                          if f not in script_flags(script)]  # fmt: skip
            wrong += [f"no make target {t!r}" for t in re.findall(r"(?:^|\s)make ([a-z][\w-]*)", line)
                      if t not in make_targets()]  # fmt: skip
    for target in re.findall(r"`make ([a-z][\w-]*)", prose(page.read_text("utf-8"))):
        if target not in make_targets():
            wrong.append(f"no make target {target!r}")
    assert not wrong, f"{name(page)}: {wrong}"


@pytest.mark.parametrize("page", pages(), ids=name)
def test_no_page_says_training_data_is_tokenised_ahead(page):
    # the code tokenises per batch (embforge.training.tasks.PreparedEmbeddingTask): nothing before the first step
    text = " ".join(page.read_text("utf-8").split())
    claims = re.findall(
        r"tokeni[sz]\w* (?:every text column |the whole training set )?(?:once )?(?:up front|at start-up)"
        r"|tokeni[sz]es every text column once",
        text,
    )
    assert not claims, f"{name(page)} says {claims}; training data is tokenised per batch"
