"""Sharded encoding under torchrun: every process encodes a share, and the result is one process's, exactly."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from tests.conftest import WORDS
from tests.distributed_helpers import encode_everything, sharded_encoding_worker, spawn, torchrun


def texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 30)))) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return texts(101)  # 13 batches of 8: the two processes get 7 and 6 batches


def test_sharded_encode_corpus_and_mining_equal_one_process(tmp_path, tiny_model_dir, corpus):
    spawn(sharded_encoding_worker, str(tiny_model_dir), corpus, str(tmp_path / "two"), world=2)
    one = encode_everything(str(tiny_model_dir), corpus, str(tmp_path / "one"))
    for rank in (0, 1):  # every process ends with every vector
        with open(tmp_path / "two" / f"rank-{rank}.pkl", "rb") as handle:
            two = pickle.load(handle)
        for name in ("encode", "corpus", "resumed"):
            assert np.array_equal(two[name], one[name]), (rank, name)
        assert two["mined"] == one["mined"]
    assert one["encode"].shape == (101, 32)
    assert not np.array_equal(one["encode"][:1], one["encode"][1:2])
    progress = json.loads((tmp_path / "two" / "work" / "resumed" / "progress.json").read_text())
    assert progress["done"] == [0, 1, 2]  # rank 0 recorded the resumed blocks


def test_torchrun_encode_writes_the_one_process_output(tmp_path, tiny_model_dir, corpus):
    from embforge.cli import main

    source = tmp_path / "texts.txt"
    source.write_text("".join(t + "\n" for t in corpus))

    def encode_args(output: str) -> list[str]:
        return ["encode", "--model", str(tiny_model_dir), "--input", str(source), "--output", output]

    done = torchrun(*encode_args(str(tmp_path / "two.npy")), "--batch-size", "8", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1 and json.loads(lines[0])["rows"] == 101  # rank 0 alone reports
    assert main([*encode_args(str(tmp_path / "one.npy")), "--batch-size", "8", "--quiet"]) == 0
    assert np.array_equal(np.load(tmp_path / "two.npy"), np.load(tmp_path / "one.npy"))
