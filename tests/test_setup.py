"""The set-up is reproducible: constraints.txt pins everything make install installs, within pyproject's ranges."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _installed_requirements() -> list[Requirement]:
    """What ``pip install -e '.[all,dev]'`` asks for (the ``all`` extra expanded)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = ["dev", *re.findall(r"[\w-]+", extras["all"][0].split("[", 1)[1])]
    return [Requirement(r) for r in [*project["dependencies"], *[r for e in wanted for r in extras[e]]]]


def test_constraints_pin_every_dependency_within_its_range():
    pins = _pins()
    assert canonicalize_name("embforge") not in pins
    for requirement in _installed_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not pinned in constraints.txt: run make lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {requirement.name}=={pins[name]}, outside pyproject's {requirement}"
        )


def test_linters_are_pinned_exactly_and_the_makefile_agrees_with_pyproject():
    pins = _pins()
    dev = {canonicalize_name(r.name): r for r in _installed_requirements()}
    for tool in ("ruff", "mypy"):
        assert str(dev[tool].specifier) == f"=={pins[tool]}"
    makefile = (ROOT / "Makefile").read_text()
    torch_range = next(r for r in _installed_requirements() if r.name == "torch").specifier
    assert set(re.findall(r"torch(>=[\d.]+)", makefile)) == {str(torch_range)}
    assert "-c $(LOCK)" in makefile and "ruff format --check embforge tests benchmarks" in makefile
    assert f"TORCH := {pins['torch']}" in makefile
