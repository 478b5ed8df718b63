"""What the evaluation-across-ranks test runs: the same evaluators in one process and in each of N ranks."""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np

from tests.conftest import WORDS


def texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 25)))) for _ in range(n)]


def evaluate_everything(model_dir: str) -> dict[str, Any]:
    """STS, retrieval, pair classification and classification metrics of the model in ``model_dir`` on random
    data (fixed seeds), plus how many texts this process encoded itself (``encoded``)."""
    from embforge.data.retrieval import RetrievalData
    from embforge.data.tables import Dataset
    from embforge.encoder import Encoder
    from embforge.evaluate.classification import evaluate_classification
    from embforge.evaluate.pairs import evaluate_pairs
    from embforge.evaluate.retrieval import evaluate_retrieval
    from embforge.evaluate.sts import evaluate_sts

    rng = np.random.default_rng(0)
    model = Encoder.load(model_dir)
    encoded = [0]
    plain = model.encode

    def counting(batch: Any, **options: Any) -> np.ndarray:
        encoded[0] += 1 if isinstance(batch, str) else len(batch)
        return plain(batch, **options)

    model.encode = counting  # type: ignore[method-assign]  # counts what this process encodes
    n = 90
    first, second = texts(n, 1), texts(n, 2)
    rows = list(range(n))
    sts = Dataset("sts", {"sentence1": first, "sentence2": second, "score": list(rng.uniform(0, 5, n))}, rows)
    pairs = Dataset(
        "pairs", {"sentence1": first, "sentence2": second, "label": list(rng.integers(0, 2, n))}, rows
    )
    train = Dataset("train", {"text": first, "label": list(rng.integers(0, 3, n))}, rows)
    test = Dataset("test", {"text": second, "label": list(rng.integers(0, 3, n))}, rows)
    docs, queries = texts(120, 3), texts(15, 4)
    qrels = {f"q{i}": {f"d{j}": 1 for j in rng.choice(120, size=3, replace=False)} for i in range(15)}
    retrieval = RetrievalData(
        [f"d{i}" for i in range(120)], docs, [f"q{i}" for i in range(15)], queries, qrels
    )
    result: dict[str, Any] = {
        "sts": evaluate_sts(model, sts, batch_size=8),
        "retrieval": evaluate_retrieval(model, retrieval, batch_size=8),
        "pairs": evaluate_pairs(model, pairs, batch_size=8),
        "classification": evaluate_classification(model, train, test, batch_size=8),
    }
    result["encoded"] = encoded[0]
    return result


def ranks_worker(model_dir: str, out: str) -> None:
    """:func:`evaluate_everything` under a process group; each rank pickles its result to ``out/rank-<r>.pkl``."""
    from embforge.parallel import rank

    result = evaluate_everything(model_dir)
    with open(os.path.join(out, f"rank-{rank()}.pkl"), "wb") as handle:
        pickle.dump(result, handle)


def train_with_eval(model_dir: str, train_file: str, out: str) -> None:
    """Four steps of CoSENT on ``train_file`` evaluated on its first 60 rows every 2 steps (STS), into ``out``;
    under a process group every rank evaluates (a collective) and rank 0 writes ``metrics.jsonl``."""
    from embforge.data.tables import read_table
    from embforge.encoder import Encoder
    from embforge.evaluate.sts import sts_evaluator
    from embforge.losses import get_loss
    from embforge.training.config import TrainConfig
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    data = read_table(train_file)
    config = TrainConfig(
        output=out, max_steps=4, batch_size=32, amp="no", lr=1e-3, seed=3, save_every=0, device="cpu",
        quiet=True, eval_every=2,
    )  # fmt: skip
    evaluator = sts_evaluator(data.subset(list(range(60))), batch_size=8)
    train(Encoder.load(model_dir), [Task("sts", data, get_loss("cosent"))], config, evaluator=evaluator)
