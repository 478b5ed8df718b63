"""A dev mix: several evaluators named in one string, each reduced to its headline metric, plus their mean.

Spec: comma-separated ``KIND:SOURCE`` items.

==============  ================================================  ===================
kind            source                                            headline metric
==============  ================================================  ===================
``sts``         a scored-pairs file, or ``stsb-dev`` (built-in)    ``spearman``
``retrieval``   a BEIR/SciFact folder (``FOLDER@split``, default   ``ndcg@10``
                ``dev``), or ``scifact-dev`` (built-in)
==============  ================================================  ===================

Example:
    >>> mix = parse_mix("sts:stsb-dev,retrieval:scifact-dev")  # doctest: +SKIP
    >>> evaluate_mix(model, mix)  # doctest: +SKIP
    {'sts:stsb-dev': 84.1, 'retrieval:scifact-dev': 61.0, 'mean': 72.55}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from embforge.data.builtin import DATASETS, load_builtin
from embforge.data.folders import load_retrieval_folder
from embforge.data.retrieval import RetrievalData
from embforge.data.tables import Dataset, read_table
from embforge.evaluate.retrieval import evaluate_retrieval
from embforge.evaluate.sts import evaluate_sts

if TYPE_CHECKING:
    from embforge.protocols import Embedder

KINDS = {"sts": "spearman", "retrieval": "ndcg@10"}


@dataclass
class MixPart:
    """One evaluator of a dev mix: its label (``kind:source``), headline metric and ``model -> metrics``."""

    label: str
    metric: str
    evaluate: Callable[[Embedder], dict[str, float]]


def _builtin(source: str) -> tuple[str, str] | None:
    for sep in (":", "-"):
        name, _, split = source.rpartition(sep)
        if name in DATASETS and split:
            return name, split
    return None


def parse_mix(spec: str, *, batch_size: int = 64) -> list[MixPart]:
    """Parse ``"sts:PATH,retrieval:scifact-dev"`` into evaluators (data loaded now, models evaluated later)."""
    parts: list[MixPart] = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        kind, sep, source = item.partition(":")
        if not sep or kind not in KINDS or not source:
            raise ValueError(
                f"dev mix item {item!r} must look like KIND:SOURCE with KIND one of {', '.join(KINDS)}"
            )
        builtin = None if Path(source.split("@")[0]).exists() else _builtin(source)
        if kind == "sts":
            data = load_builtin(*builtin) if builtin else read_table(source)
            if not isinstance(data, Dataset):
                raise ValueError(
                    f"dev mix item {item!r}: {source} is a retrieval set; write retrieval:{source}"
                )
            parts.append(MixPart(item, "spearman", partial(evaluate_sts, data=data, batch_size=batch_size)))
        else:
            if builtin:
                rdata = load_builtin(*builtin)
                if not isinstance(rdata, RetrievalData):
                    raise ValueError(
                        f"dev mix item {item!r}: {source} is a table of pairs; write sts:{source}"
                    )
            else:
                folder, _, split = source.partition("@")
                rdata = load_retrieval_folder(folder, split or "dev")
            run = partial(evaluate_retrieval, data=rdata, metrics=["ndcg@10"], batch_size=batch_size)
            parts.append(MixPart(item, "ndcg@10", run))
    if not parts:
        raise ValueError("the dev mix is empty; e.g. 'sts:stsb-dev,retrieval:scifact-dev'")
    return parts


def evaluate_mix(model: Embedder, parts: list[MixPart]) -> dict[str, float]:
    """Each part's headline metric (0-100) under its label, and their unweighted ``mean``."""
    scores = {part.label: float(part.evaluate(model)[part.metric]) for part in parts}
    scores["mean"] = sum(scores.values()) / len(parts)
    return scores
