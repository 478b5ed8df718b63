"""Matryoshka evaluation: run any evaluator on embeddings truncated to several dimensions.

The model is encoded once per distinct text list (a cache shared by all dimensions); each dimension sees a
view of the model whose ``encode`` returns the first ``d`` dimensions (re-normalised when normalising), so any
evaluator that calls ``model.encode`` works unchanged. Results come as a table with the fraction of the
full-size score each dimension retains, and as a PNG plot (score vs dimension).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from embforge._optional import require
from embforge.modeling.encoding import l2_normalize

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from embforge.kinds import ModelKind
    from embforge.protocols import Embedder, EncodeOptions


class MatryoshkaResult(TypedDict):
    """What :func:`evaluate_matryoshka` returns (dimensions are the keys of the inner maps)."""

    metric: str
    dims: list[int]
    scores: dict[int, float]
    retained: dict[int, float]
    all: dict[int, dict[str, float]]


class TruncatedModel:
    """A view of ``model`` whose :meth:`encode` keeps the first ``dim`` dimensions; the rest of the
    :class:`~embforge.protocols.Embedder` contract is the model's."""

    def __init__(self, model: Embedder, dim: int, cache: dict[str, np.ndarray] | None = None) -> None:
        if not 0 < dim <= model.dim:
            raise ValueError(
                f"Matryoshka dimension {dim} must be between 1 and the model's dimension {model.dim}"
            )
        self.model = model
        self.dim = dim
        self.cache = {} if cache is None else cache

    @property
    def kind(self) -> ModelKind:
        return self.model.kind

    @property
    def normalize(self) -> bool:
        return self.model.normalize

    @property
    def prompts(self) -> dict[str, str]:
        return self.model.prompts

    def prompt_text(self, prompt: str | None = None, prompt_name: str | None = None) -> str:
        return self.model.prompt_text(prompt, prompt_name)

    def tokenize_ids(
        self, texts: Sequence[str], *, prefix: str = "", is_query: bool = False
    ) -> list[list[int]]:
        return self.model.tokenize_ids(texts, prefix=prefix, is_query=is_query)

    def encode(self, texts: str | Sequence[str], **options: Unpack[EncodeOptions]) -> np.ndarray:
        """The model's (cached, full-size) embeddings cut to the first ``min(dim, self.dim)`` dimensions."""
        single = isinstance(texts, str)
        batch = [texts] if isinstance(texts, str) else list(texts)
        dim = options.pop("dim", None) or self.dim
        normalize = options.get("normalize")
        options["normalize"] = False  # the cache holds the raw embeddings; each view normalises its own cut
        key = hashlib.sha1(
            repr((batch, options.get("prompt"), options.get("prompt_name"))).encode()
        ).hexdigest()
        if key not in self.cache:
            self.cache[key] = self.model.encode(batch, **options)
        out = self.cache[key][:, : min(self.dim, dim)]
        if self.model.normalize if normalize is None else normalize:
            out = l2_normalize(out)
        return out[0] if single else out


def evaluate_matryoshka(
    model: Embedder,
    evaluator: Callable[[Embedder], Mapping[str, float]],
    dims: Sequence[int],
    *,
    metric: str,
) -> MatryoshkaResult:
    """Run ``evaluator`` at each of ``dims`` (and the full size) on truncated embeddings.

    Args:
        model: An encoder (``encode``, ``dim``, ``normalize``).
        evaluator: ``model -> metrics``, e.g. ``lambda m: evaluate_sts(m, data)``.
        dims: Dimensions to evaluate; the model's full dimension is added if missing.
        metric: The headline metric of the evaluator (``spearman``, ``ndcg@10``, ``accuracy`` ...).

    Returns:
        ``{"metric", "dims", "scores": {dim: value}, "retained": {dim: value / full}, "all": {dim: metrics}}``.
    """
    dims = sorted({int(d) for d in dims} | {int(model.dim)})
    cache: dict[str, np.ndarray] = {}
    every = {d: dict(evaluator(TruncatedModel(model, d, cache))) for d in dims}
    missing = [d for d, m in every.items() if metric not in m]
    if missing:
        raise KeyError(f"the evaluator returned no {metric!r}; it returned {sorted(every[missing[0]])}")
    scores = {d: float(every[d][metric]) for d in dims}
    full = scores[int(model.dim)]
    return {
        "metric": metric,
        "dims": dims,
        "scores": scores,
        "retained": {d: (s / full if full else float("nan")) for d, s in scores.items()},
        "all": every,
    }


def format_table(results: Mapping[str, MatryoshkaResult]) -> str:
    """A Markdown table: one row per dimension, per run (``label -> evaluate_matryoshka result``) the score and
    the retained fraction of that run's full-size score."""
    labels = list(results)
    dims = sorted({d for r in results.values() for d in r["dims"]})
    head = "| dim | " + " | ".join(f"{k} {results[k]['metric']} | {k} retained" for k in labels) + " |"
    rule = "|---:|" + "---:|---:|" * len(labels)
    rows = []
    for d in dims:
        cells = []
        for k in labels:
            score, kept = results[k]["scores"].get(d), results[k]["retained"].get(d)
            cells += ["–", "–"] if score is None or kept is None else [f"{score:.2f}", f"{100 * kept:.1f}%"]
        rows.append(f"| {d} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule, *rows])


def plot_matryoshka(results: Mapping[str, MatryoshkaResult], path: str | Path, *, title: str = "") -> Path:
    """Save a PNG of score vs dimension, one line per run, with a log-2 dimension axis."""
    matplotlib = require("matplotlib")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot")
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for label, result in results.items():
        dims = result["dims"]
        ax.plot(dims, [result["scores"][d] for d in dims], marker="o", label=label)
    ax.set_xscale("log", base=2)
    all_dims = sorted({d for r in results.values() for d in r["dims"]})
    ax.set_xticks(all_dims)
    ax.set_xticklabels([str(d) for d in all_dims])
    ax.set_xlabel("embedding dimensions kept")
    ax.set_ylabel(" / ".join(sorted({str(r["metric"]) for r in results.values()})))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
