"""The examples in embforge's docstrings run (examples that need a real model are marked ``+SKIP``)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import embforge


def _modules_with_examples() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(embforge.__path__, prefix="embforge."):
        spec = importlib.util.find_spec(info.name)
        source = spec.loader.get_source(info.name) if spec and spec.loader else None  # type: ignore[attr-defined]
        if source and ">>>" in source:
            names.append(info.name)
    return names


MODULES = _modules_with_examples()


def test_docstring_examples_are_collected():
    assert len(MODULES) >= 5  # a broken walk would make the test below vacuous


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    try:
        module = importlib.import_module(name)
    except ImportError as error:  # an optional extra that is not installed
        pytest.skip(f"{name}: {error}")
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples in {name} failed"
