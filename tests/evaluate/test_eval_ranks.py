"""Evaluation across ranks: under two gloo processes each rank encodes a share of the texts, and every rank
returns exactly (==) the metrics of one process."""

from __future__ import annotations

import json
import pickle

import numpy as np

from embforge.evaluate.ranks import evaluate_across_ranks, shares_encoding
from embforge.retrieval.sharded import ShardedEncoder
from tests.distributed_helpers import spawn
from tests.evaluate.ranks_helpers import evaluate_everything, ranks_worker, texts, train_with_eval


def test_two_ranks_give_the_one_process_metrics_exactly(tmp_path, tiny_model_dir):
    spawn(ranks_worker, str(tiny_model_dir), str(tmp_path), world=2)
    one = evaluate_everything(str(tiny_model_dir))
    ranks = []
    for rank in (0, 1):
        with open(tmp_path / f"rank-{rank}.pkl", "rb") as handle:
            ranks.append(pickle.load(handle))
    for name in ("sts", "retrieval", "pairs", "classification"):
        for rank, two in enumerate(ranks):
            assert two[name] == one[name], (name, rank)
    assert one["sts"]["spearman"] != 0 and 0 < one["retrieval"]["ndcg@10"] < 100
    # the work was split: each rank encoded a share, together every text one process encoded
    shares = [two["encoded"] for two in ranks]
    assert all(0 < share < one["encoded"] for share in shares), (shares, one["encoded"])
    assert sum(shares) == one["encoded"]


def test_one_process_runs_the_evaluator_on_the_model_itself(tiny_encoder):
    seen = []
    assert evaluate_across_ranks(lambda m: seen.append(m) or {"x": 1.0}, tiny_encoder) == {"x": 1.0}
    assert seen == [tiny_encoder]  # no process group: not wrapped


def test_what_shares_its_encoding(tiny_encoder, tiny_cross_encoder):
    assert shares_encoding(tiny_encoder)
    assert shares_encoding(ShardedEncoder(tiny_encoder))
    assert not shares_encoding(tiny_cross_encoder)  # pair scores: whole on every rank


def _evals(folder) -> list[tuple[int, dict]]:
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [(line["step"], line["eval"]) for line in lines if "eval" in line]


def test_training_evaluates_on_every_rank(tmp_path, tiny_model_dir):
    rng = np.random.default_rng(5)
    rows = [
        {"sentence1": a, "sentence2": b, "score": float(s)}
        for a, b, s in zip(texts(128, 6), texts(128, 7), rng.uniform(0, 5, 128))
    ]
    source = tmp_path / "sts.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spawn(train_with_eval, str(tiny_model_dir), str(source), str(tmp_path / "two"), world=2)
    train_with_eval(str(tiny_model_dir), str(source), str(tmp_path / "one"))
    two, one = _evals(tmp_path / "two"), _evals(tmp_path / "one")
    assert [step for step, _ in two] == [step for step, _ in one] == [2, 4]
    for (_, a), (_, b) in zip(two, one):  # the weights agree to ~1e-5 (test_distributed), so do the figures
        assert a.keys() == b.keys()
        assert all(abs(a[k] - b[k]) < 1e-2 for k in a), (a, b)
