"""Loaders for the offline data sets under ``../shared/data`` (see :func:`embforge.data.paths.data_root`).

One small module per data set turns its original files into :class:`embforge.data.tables.Dataset` objects with
standard column names (or, for retrieval, a BEIR-style corpus/queries/qrels triple). :data:`DATASETS` is the one
registry of them: ``load_builtin("stsb", "test")`` (pipelines write ``data = "stsb:test"``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from embforge.data.retrieval import RetrievalData
    from embforge.data.tables import Dataset

# name -> (module under embforge.data.builtin, loader function); loaders are imported on first use
DATASETS: dict[str, tuple[str, str]] = {
    "scifact": ("scifact", "load_scifact"),
    "snli-triplets": ("snli_triplets", "load_snli_triplets"),
    "snli": ("snli", "load_snli"),
    "stsb": ("stsb", "load_stsb"),
    "banking77": ("banking77", "load_banking77"),
    "mrpc": ("mrpc", "load_mrpc"),
    "wikiqa": ("wikiqa", "load_wikiqa"),
    "wikiqa-passages": ("wikiqa_passages", "load_wikiqa_passages"),
}


def load_builtin(name: str, split: str) -> Dataset | RetrievalData:
    """The built-in data set ``name`` (a key of :data:`DATASETS`) at ``split``: a Dataset, or RetrievalData for
    retrieval sets (SciFact)."""
    if name not in DATASETS:
        raise KeyError(f"unknown built-in data set {name!r}; choose one of {', '.join(DATASETS)}")
    module, function = DATASETS[name]
    return getattr(importlib.import_module(f"embforge.data.builtin.{module}"), function)(split)
