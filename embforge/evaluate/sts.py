"""STS evaluation: correlation between embedding similarity and gold scores of sentence pairs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from embforge.data.tables import Dataset
from embforge.evaluate.ranks import across_ranks
from embforge.evaluate.similarity import correlations, pair_scores
from embforge.kinds import is_pair_scorer

if TYPE_CHECKING:
    from embforge.protocols import Embedder, PairScorer


@across_ranks
def evaluate_sts(model: Embedder | PairScorer, data: Dataset, *, batch_size: int = 64) -> dict[str, float]:
    """Spearman/Pearson (0-100) of cosine, dot and Euclidean similarity against ``score`` (or ``label``).

    ``model`` may also be a :class:`~embforge.cross_encoder.CrossEncoder`: its pair scores are correlated instead
    (keys ``spearman``, ``pearson``, ``n``).

    Keys: ``spearman`` and ``pearson`` (cosine, the headline numbers), plus ``spearman_dot``,
    ``pearson_dot``, ``spearman_euclidean``, ``pearson_euclidean`` and ``n``.
    """
    data.require(["sentence1", "sentence2"], purpose="STS evaluation")
    gold = data.labels()
    if gold is None:
        data.require(["score"], purpose="STS evaluation")
        raise AssertionError  # unreachable: require() raised
    texts1, texts2 = data.columns["sentence1"], data.columns["sentence2"]
    if is_pair_scorer(model):  # a cross-encoder: pair scores directly
        corr = correlations(model.predict(list(zip(texts1, texts2)), batch_size=batch_size), gold)
        return {"spearman": corr["spearman"], "pearson": corr["pearson"], "n": float(len(data))}
    # encode the unique texts once: pairs often share sentences
    unique = list(dict.fromkeys(texts1 + texts2))
    emb = model.encode(unique, batch_size=batch_size, normalize=False)
    position = {t: i for i, t in enumerate(unique)}
    a = emb[[position[t] for t in texts1]]
    b = emb[[position[t] for t in texts2]]
    result: dict[str, float] = {}
    for name, scores in pair_scores(a, b).items():
        corr = correlations(scores, gold)
        suffix = "" if name == "cosine" else f"_{name}"
        result[f"spearman{suffix}"] = corr["spearman"]
        result[f"pearson{suffix}"] = corr["pearson"]
    result["n"] = float(len(data))
    return result


def sts_evaluator(data: Dataset, *, batch_size: int = 64) -> Callable[[Embedder], dict[str, float]]:
    """An evaluator for the trainer: ``model -> metrics`` whose main metric is ``spearman``."""

    def run(model: Embedder) -> dict[str, float]:
        return evaluate_sts(model, data, batch_size=batch_size)

    return run
