"""Every loss explains itself as ``losses/distill.py`` does: a formula, a table of the text columns and labels it
reads, the paper it comes from and an example (run by ``tests/test_doctests.py``)."""

from __future__ import annotations

import inspect
import re

import pytest

from embforge.losses import LOSSES, MatryoshkaLoss
from embforge.losses.cross import CROSS_LOSSES
from embforge.losses.late import MULTIVECTOR_LOSSES

CLASSES = {
    **{f"dense {name}": cls for name, cls in LOSSES.items()},
    **{f"cross {name}": cls for name, cls in CROSS_LOSSES.items()},
    **{f"multivector {name}": cls for name, cls in MULTIVECTOR_LOSSES.items()},
    "matryoshka": MatryoshkaLoss,
}
COLUMNS_TABLE = re.compile(r"=+ +=+\n *text columns +labels\n *=+ +=+\n")


@pytest.mark.parametrize("cls", CLASSES.values(), ids=CLASSES.keys())
def test_loss_docstring_has_formula_columns_paper_and_example(cls):
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")  # its own docstring, not a base's
    assert ".. math::" in doc, f"{cls.__name__}: no formula"
    assert COLUMNS_TABLE.search(doc), f"{cls.__name__}: no 'text columns | labels' table"
    assert re.search(r"\nPaper: .+, (19|20)\d\d, ", doc), f"{cls.__name__}: no 'Paper: authors, year, title'"
    assert re.search(rf">>> .*\b{cls.__name__}\(", doc), f"{cls.__name__}: no example that builds the loss"


def test_every_registered_loss_is_checked():
    assert len(CLASSES) == len(LOSSES) + len(CROSS_LOSSES) + len(MULTIVECTOR_LOSSES) + 1
    assert len(set(CLASSES.values())) >= 25  # 15 dense, 7 cross, 3 multi-vector, Matryoshka
