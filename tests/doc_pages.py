"""What the documentation pages (README.md, docs/**/*.md) say, read for the tests that hold them to the code:
their code blocks, the ``embforge`` command lines of their bash blocks, the prose outside the blocks, and a
runner for a Python block as a newcomer runs it (a fresh interpreter in a scratch folder beside ``../shared``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """README.md, CONTRIBUTING.md and every page of the site."""
    return [README, CONTRIBUTING, *sorted(DOCS.rglob("*.md"))]


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def blocks(text: str, language: str) -> list[str]:
    """The bodies of the fenced blocks of ``language`` (```` ```python ````, ```` ```bash ````, ...)."""
    return re.findall(rf"^```{language}[^\n]*\n(.*?)^```", text, re.S | re.M)


def prose(text: str) -> str:
    """``text`` without its fenced blocks."""
    return re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.S | re.M)


def expected_prints(code: str) -> list[str]:
    """What a block promises to print: the comment of each ``print(...)  # text`` line."""
    return [m.group(1).strip() for m in re.finditer(r"^print\(.*\)\s+# (.+)$", code, re.M)]


def command_lines(text: str) -> list[str]:
    """The ``embforge ...`` lines of the bash blocks: continuations joined, comments and pipes cut,
    ``[optional]`` parts dropped, the first of ``a|b|c`` alternatives kept; ``torchrun ... -m embforge`` and
    ``python -m embforge`` lines as the ``embforge`` line they run; synopses with ``...`` left out."""
    commands = []
    for block in blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line)
            while re.search(r"\[[^\[\]]*\]", line):
                line = re.sub(r"\s*\[[^\[\]]*\]", "", line)
            line = line.split(" | ")[0].strip()
            line = re.sub(r"(\S+?)(\|\S+)+", r"\1", line)
            line = re.sub(r"^.*?(?:^|\s)-m embforge(?=\s|$)", "embforge", line)
            line = re.sub(r"^(\S+=\S+\s+)+", "", line)  # VAR=value prefixes
            if line.startswith("embforge ") and "..." not in line:
                commands.append(" ".join(line.split()))
    return commands


def run_python_block(code: str, scratch: Path, data_root: Path) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter from ``scratch/work``, with ``scratch/shared/data`` -> ``data_root``
    (so ``../shared/data`` means what it means beside a clone), offline."""
    (scratch / "shared").mkdir()
    (scratch / "shared" / "data").symlink_to(data_root.resolve())
    work = scratch / "work"
    work.mkdir()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("EMBFORGE_DATA", None)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=900
    )
