"""Issue #16, a newcomer's first day: defaults that surprised, progress that never showed, --quiet that was not.

Each test here failed on the code before its fix.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from embforge import progress
from embforge.cli import main
from embforge.modeling import precision
from embforge.modeling.padding import token_chunks
from embforge.retrieval.corpus_cache import encode_corpus
from tests.conftest import requires_data, shared_data


@pytest.fixture
def instant_bars(monkeypatch):
    """Bars appear at once (they normally wait a second, so that quick calls print nothing)."""
    monkeypatch.setattr(progress, "BAR_DELAY", 0.0)


def _beir(tmp_path, split: str):
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    docs = ["a cat runs in the park", "the stock market rises", "a man plays the guitar", "a child reads"]
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(docs))
    )
    queries = ["cat park", "stock market", "guitar"]
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(queries))
    )
    (root / "qrels" / f"{split}.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq0\td0\t1\nq1\td1\t1\nq2\td2\t1\n"
    )
    return root


def test_eval_retrieval_default_split_is_one_the_data_set_has(tmp_path, tiny_model_dir, capsys):
    root = _beir(tmp_path, "dev")  # no qrels/test.tsv: the old default 'test' failed here
    assert main(["eval", "retrieval", "--model", str(tiny_model_dir), "--data", str(root)]) == 0
    captured = capsys.readouterr()
    assert "split 'dev'" in captured.err
    assert 0 <= json.loads(captured.out.strip().splitlines()[-1])["ndcg@10"] <= 100


@requires_data
def test_scifact_default_split_is_dev():
    from embforge.data.folders import default_eval_split

    assert default_eval_split(shared_data() / "scifact") == "dev"


def test_bf16_on_a_cpu_without_native_bf16_warns(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(RuntimeWarning, match="SLOWER than fp32"):
        assert precision.amp_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    assert precision.amp_dtype("auto", torch.device("cpu")) is None  # auto stays fp32 there, silently


def test_eval_pairs_prints_threshold_on_dev_as_a_flag(tmp_path, tiny_model_dir, capsys):
    rows = [("a cat runs", "a dog runs", 1), ("the stock market", "a man plays guitar", 0)] * 4
    data = tmp_path / "pairs.csv"
    data.write_text("sentence1,sentence2,label\n" + "".join(f"{a},{b},{y}\n" for a, b, y in rows))
    assert (
        main(["eval", "pairs", "--model", str(tiny_model_dir), "--data", str(data), "--dev", str(data)]) == 0
    )
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert '"threshold_on_dev": true' in line
    assert main(["eval", "pairs", "--model", str(tiny_model_dir), "--data", str(data)]) == 0
    assert '"threshold_on_dev": false' in capsys.readouterr().out


def test_eval_matryoshka_writes_its_plot_in_the_current_folder(
    tmp_path, tiny_model_dir, sts_csv, monkeypatch, capsys
):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    args = ["eval", "matryoshka", "--model", str(tiny_model_dir), "--data", str(sts_csv), "--dims", "8,16"]
    assert main([*args, "--columns", "0=sentence1,1=sentence2,2=score"]) == 0
    assert (work / "matryoshka-sts.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(sts_csv.parent.glob("*.png"))  # nothing written beside the data


def test_eval_sts_shows_a_bar_with_eta_even_in_a_log(tiny_model_dir, sts_csv, capfd, instant_bars):
    assert (
        main(["eval", "sts", "--model", str(tiny_model_dir), "--data", str(sts_csv), "--batch-size", "2"])
        == 0
    )
    err = capfd.readouterr().err  # stderr is a pipe here, not a terminal
    assert "encode" in err and "<" in err  # tqdm's "[elapsed<remaining]"


def test_quiet_is_really_quiet(tmp_path, tiny_model_dir, sts_csv, capfd, instant_bars, monkeypatch):
    # a phase of more than PHASE_DELAY seconds says what it does even when quiet; a loaded machine must not make
    # this tiny run's phases that long
    monkeypatch.setattr(progress, "PHASE_DELAY", 1e6)
    out = tmp_path / "run"
    args = ["train", "--model", str(tiny_model_dir), "--train", str(sts_csv), "--eval", str(sts_csv)]
    assert main([*args, "--output", str(out), "--batch-size", "8", "--quiet"]) == 0
    assert main(["eval", "sts", "--model", str(out), "--data", str(sts_csv), "--quiet"]) == 0
    err = capfd.readouterr().err
    assert err == "", err  # no training bar, no "Writing model shards", no encode bar


def test_corpus_bar_moves_per_batch(tiny_encoder, tmp_path, monkeypatch):
    updates: list[int] = []

    class Recorder:
        def update(self, n: int = 1) -> None:
            updates.append(n)

        def close(self) -> None:
            pass

    monkeypatch.setattr("embforge.retrieval.corpus_cache.progress_bar", lambda **kwargs: Recorder())
    # the padding-free encode fills each forward up to the model's token budget: 64 tokens here
    monkeypatch.setattr(tiny_encoder, "encode_tokens", 64)
    texts = [f"a cat number {'and a dog ' * (i % 5)}" for i in range(10)]
    emb = encode_corpus(tiny_encoder, texts, [str(i) for i in range(10)], tmp_path / "c", batch_size=1)
    lengths = sorted((len(ids) for ids in tiny_encoder.tokenize_ids(texts)), reverse=True)
    assert (
        sum(updates) == 10 and len(updates) == len(token_chunks(lengths, 64)) > 1
    )  # seen forward by forward
    np.testing.assert_allclose(emb, tiny_encoder.encode(texts, batch_size=3), atol=1e-5)
