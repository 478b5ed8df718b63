"""The README tells the truth: its Python blocks run as written, its ``embforge`` command lines parse.

Python blocks run in a fresh interpreter from a scratch folder whose ``../shared/data`` is the data root, as a
newcomer runs them from the repository; a ``print(...)  # text`` line must print ``text``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from embforge.cli import build_parser
from tests.conftest import requires_data, requires_minilm, shared_data
from tests.doc_pages import README, blocks, command_lines, expected_prints, run_python_block

TEXT = README.read_text(encoding="utf-8")
PYTHON = blocks(TEXT, "python")


def test_readme_has_python_blocks():
    assert len(PYTHON) >= 1


@requires_minilm
@requires_data
@pytest.mark.integration
@pytest.mark.parametrize("number", range(len(PYTHON)))
def test_readme_python_block_runs(number, tmp_path):
    code = PYTHON[number]
    done = run_python_block(code, tmp_path, shared_data())
    assert done.returncode == 0, f"README block {number + 1} failed:\n{code}\n{done.stderr[-3000:]}"
    printed = [line.strip() for line in done.stdout.splitlines()]
    for expected in expected_prints(code):
        assert expected in printed, f"README block {number + 1} promises {expected!r}, printed {printed}"


COMMANDS = command_lines(TEXT)


def test_readme_has_commands():
    assert len(COMMANDS) >= 5


def test_readme_is_short():
    # a README says what to do; the site explains (docs/) and the changelog keeps the history
    assert len(TEXT.splitlines()) <= 250


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_parses(command, capsys):
    try:
        build_parser().parse_args(shlex.split(command)[1:])
    except SystemExit:
        pytest.fail(f"the README's `{command}` does not parse: {capsys.readouterr().err.strip()}")


def _architecture_map() -> str:
    text = README.read_text(encoding="utf-8")
    return re.search(r"^## Architecture\n\n```\n(.*?)^```", text, re.S | re.M).group(1)


def test_architecture_map_names_every_package_and_top_level_module():
    package = README.parent / "embforge"
    names = [f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()]
    names += [p.name for p in package.glob("*.py") if p.name != "__init__.py"]
    block = _architecture_map()
    missing = [name for name in sorted(names) if not re.search(rf"(?<![\w/]){re.escape(name)}", block)]
    assert not missing, f"README's Architecture map does not name {missing}"


def test_architecture_map_names_only_what_exists():
    package = README.parent / "embforge"
    for line in _architecture_map().splitlines()[1:]:
        if not line.startswith("  ") or line.startswith("   "):
            continue  # a continuation line
        for name in re.split(r",\s*", re.split(r"\s{2,}", line.strip())[0]):
            assert (package / name).exists(), f"README's Architecture map names {name}, which embforge/ lacks"


def test_intro_names_every_loss():
    from embforge.losses import LOSSES
    from embforge.losses.cross import CROSS_LOSSES
    from embforge.losses.late import MULTIVECTOR_LOSSES

    intro = README.read_text(encoding="utf-8").split("\n## ", 1)[0]
    for name in [*LOSSES, *CROSS_LOSSES, *MULTIVECTOR_LOSSES]:
        assert f"`{name}`" in intro, f"README's intro does not name the {name!r} loss"


def test_tests_mirror_the_package_folders():
    tests = Path(__file__).resolve().parent
    package = README.parent / "embforge"
    for folder in tests.iterdir():
        if folder.is_dir() and (folder / "__init__.py").exists():
            assert (package / folder.name / "__init__.py").exists(), (
                f"tests/{folder.name}/ mirrors no package"
            )
            assert f"`tests/{folder.name}/`" in README.read_text(encoding="utf-8") or folder.name in {
                "multivector",
                "sparse",
                "static",
            }, f"README does not name tests/{folder.name}/"
