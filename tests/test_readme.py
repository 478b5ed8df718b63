"""The README tells the truth: its Python blocks run as written, its ``embforge`` command lines parse.

Python blocks run in a fresh interpreter from a scratch folder whose ``../shared/data`` is the data root, as a
newcomer runs them from the repository; a ``print(...)  # text`` line must print ``text``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from embforge.cli import build_parser
from tests.conftest import requires_data, requires_minilm, shared_data

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)


PYTHON = _blocks("python")


def _expected_prints(code: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^print\(.*\)\s+# (.+)$", code, re.M)]


def test_readme_has_python_blocks():
    assert len(PYTHON) >= 2


@requires_minilm
@requires_data
@pytest.mark.integration
@pytest.mark.parametrize("number", range(len(PYTHON)))
def test_readme_python_block_runs(number, tmp_path):
    code = PYTHON[number]
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(shared_data().resolve())
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("EMBFORGE_DATA", None)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"README block {number + 1} failed:\n{code}\n{done.stderr[-3000:]}"
    printed = [line.strip() for line in done.stdout.splitlines()]
    for expected in _expected_prints(code):
        assert expected in printed, f"README block {number + 1} promises {expected!r}, printed {printed}"


def _commands() -> list[str]:
    """``embforge ...`` lines of the bash blocks: continuations joined, comments and pipes cut, ``[optional]``
    parts dropped, the first of ``a|b|c`` alternatives kept; synopses with ``...`` left out."""
    commands = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s#.*$", "", line)
            while re.search(r"\[[^\[\]]*\]", line):
                line = re.sub(r"\s*\[[^\[\]]*\]", "", line)
            line = line.split(" | ")[0].strip()
            line = re.sub(r"(\S+?)(\|\S+)+", r"\1", line)
            if line.startswith("embforge ") and "..." not in line:
                commands.append(" ".join(line.split()))
    return commands


COMMANDS = _commands()


def test_readme_has_commands():
    assert len(COMMANDS) >= 20


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
