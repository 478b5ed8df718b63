"""CrossEncoder: sentence-transformers round trips, length-sorted batching, rank(), training with train()."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from embforge.cross_encoder import CrossEncoder, is_cross_encoder_folder
from embforge.data.tables import Dataset
from embforge.losses.cross import get_cross_loss
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.tasks import Task, prepare
from tests.conftest import make_cross_encoder
from tests.losses.test_cross_losses import PAIRS


def test_saved_folder_loads_in_sentence_transformers_with_equal_scores(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    ours = make_cross_encoder()
    ours.save(tmp_path / "ce")
    assert is_cross_encoder_folder(tmp_path / "ce")
    theirs = st.CrossEncoder(str(tmp_path / "ce"), device="cpu")
    expected = ours.predict(PAIRS)
    assert np.ptp(expected) > 0.05  # the scores differ, so equality means something
    np.testing.assert_allclose(theirs.predict(PAIRS), expected, atol=1e-5)


def test_sentence_transformers_folder_loads_here_with_equal_scores(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    make_cross_encoder(num_labels=1, seed=3).save(tmp_path / "src")
    theirs = st.CrossEncoder(str(tmp_path / "src"), device="cpu")
    theirs.save(str(tmp_path / "st"))
    ours = CrossEncoder.load(tmp_path / "st")
    assert ours.activation == "sigmoid"
    np.testing.assert_allclose(ours.predict(PAIRS), theirs.predict(PAIRS), atol=1e-5)


def test_token_budget_chunks_give_the_same_scores_in_input_order():
    ce = make_cross_encoder()
    one_by_one = np.array([ce.predict(p) for p in PAIRS])
    np.testing.assert_allclose(ce.predict(PAIRS, max_tokens=40), one_by_one, atol=1e-5)
    np.testing.assert_allclose(ce.predict(PAIRS, max_tokens=None, batch_size=2), one_by_one, atol=1e-5)
    raw = ce.predict(PAIRS, activation=False)
    np.testing.assert_allclose(1 / (1 + np.exp(-raw)), one_by_one, atol=1e-6)


def test_rank_sorts_documents_by_score():
    ce = make_cross_encoder()
    docs = [b for _, b in PAIRS]
    scores = ce.predict([("a man plays the guitar", d) for d in docs])
    ranked = ce.rank("a man plays the guitar", docs, top_k=3)
    assert [r["corpus_id"] for r in ranked] == list(np.argsort(-scores)[:3])
    assert ranked[0]["score"] == pytest.approx(float(scores.max()), abs=1e-6)


def test_starting_from_a_bi_encoder_adds_a_new_head(tiny_model_dir):
    assert not is_cross_encoder_folder(tiny_model_dir)
    ce = CrossEncoder.load(tiny_model_dir, new_head=True)
    assert ce.num_labels == 1
    assert ce.predict(PAIRS).shape == (len(PAIRS),)
    two = CrossEncoder.load(tiny_model_dir, new_head=True, num_labels=2)
    assert two.predict(PAIRS).shape == (len(PAIRS), 2)


def _pairs_data(tmp_path) -> Dataset:
    rows = [(a, b, 1) for a, b in PAIRS[::2]] + [(a, b, 0) for a, b in PAIRS[1::2]]
    rows = rows * 4
    return Dataset(
        str(tmp_path / "pairs.csv"),
        {
            "sentence1": [r[0] for r in rows],
            "sentence2": [r[1] for r in rows],
            "label": [r[2] for r in rows],
        },
        list(range(1, len(rows) + 1)),
    )


@pytest.mark.parametrize("loss", ["bce", "cosent"])
def test_the_shared_training_loop_trains_a_cross_encoder(tmp_path, loss):
    ce = make_cross_encoder()
    data = _pairs_data(tmp_path)
    labels = np.array(data.columns["label"])
    pairs = list(zip(data.columns["sentence1"], data.columns["sentence2"]))
    before = ce.predict(pairs)
    gap_before = before[labels == 1].mean() - before[labels == 0].mean()
    config = TrainConfig(output=str(tmp_path / "out"), epochs=8, batch_size=8, lr=1e-3, quiet=True, amp="no")
    train(ce, [Task("pairs", data, get_cross_loss(loss))], config)
    after = ce.predict(pairs)
    assert after[labels == 1].mean() - after[labels == 0].mean() > gap_before + 0.1
    reloaded = CrossEncoder.load(tmp_path / "out")
    np.testing.assert_allclose(reloaded.predict(pairs), after, atol=1e-5)
    saved = json.loads((tmp_path / "out" / "config_sentence_transformers.json").read_text())
    assert saved["model_type"] == "CrossEncoder"


def test_resume_after_a_crash_gives_the_same_cross_encoder(tmp_path):
    task = Task("pairs", _pairs_data(tmp_path), get_cross_loss("bce"))

    def run(out, crash_at=None, resume=False):
        config = TrainConfig(
            output=str(out),
            epochs=2,
            batch_size=8,
            lr=1e-3,
            quiet=True,
            amp="no",
            save_every=2,
            resume=resume,
        )

        def on_step(step):
            if step == crash_at:
                raise KeyboardInterrupt

        model = make_cross_encoder(seed=9 if resume else 0)
        train(model, [task], config, on_step=on_step)
        return model

    full = run(tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "crash", crash_at=3)
    resumed = run(tmp_path / "crash", resume=True)
    np.testing.assert_allclose(resumed.predict(PAIRS), full.predict(PAIRS), atol=1e-5)


def test_listwise_with_in_batch_negatives_gets_gradients(tmp_path):
    ce = make_cross_encoder()
    data = Dataset(
        str(tmp_path / "qa.csv"),
        {"anchor": [a for a, _ in PAIRS], "positive": [b for _, b in PAIRS]},
        list(range(1, len(PAIRS) + 1)),
    )
    prepared = prepare(Task("qa", data, get_cross_loss("listwise")), ce)
    rows = (0, 1, 2)
    loss = prepared.loss_fn(ce(prepared.inputs(rows), max_tokens=512), prepared.labels(rows))
    loss.backward()
    assert loss.item() > 0
    assert ce.model.classifier.weight.grad is not None


def test_a_bi_encoder_loss_is_refused_with_advice(tmp_path):
    from embforge.losses import get_loss

    with pytest.raises(ValueError, match="bi-encoder loss"):
        prepare(Task("pairs", _pairs_data(tmp_path), get_loss("cosent")), make_cross_encoder())


def test_score_ids_keeps_gradients_and_order():
    ce = make_cross_encoder().eval()
    items = ce.tokenize_ids([a for a, _ in PAIRS], [b for _, b in PAIRS])
    logits = ce.score_ids(items, max_tokens=30)
    assert logits.requires_grad
    with torch.no_grad():
        single = torch.cat([ce.score_ids([it]) for it in items])
    torch.testing.assert_close(logits.detach(), single, atol=1e-5, rtol=0)


def test_cli_train_cross_then_eval_pairs_sts_and_rerank(tmp_path, tiny_model_dir, capsys):
    from embforge.cli import main

    rows = [(a, b, i % 2) for i, (a, b) in enumerate(PAIRS * 4)]
    train_file = tmp_path / "train.tsv"
    train_file.write_text("sentence1\tsentence2\tlabel\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in rows))
    scored = tmp_path / "sts.tsv"
    scored.write_text(
        "sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{i}\n" for i, (a, b) in enumerate(PAIRS))
    )
    out = tmp_path / "ce"
    code = main(
        [
            "train",
            "--model-type",
            "cross",
            "--model",
            str(tiny_model_dir),
            "--train",
            str(train_file),
            "--loss",
            "bce",
            "--output",
            str(out),
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--quiet",
        ]
    )
    assert code == 0 and is_cross_encoder_folder(out)
    capsys.readouterr()
    assert (
        main(["eval", "pairs", "--model", str(out), "--data", str(train_file), "--dev", str(train_file)]) == 0
    )
    pairs = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert pairs["threshold_on_dev"] == 1.0 and 0 <= pairs["accuracy"] <= 100
    assert main(["eval", "sts", "--model", str(out), "--data", str(scored)]) == 0
    sts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    expected = CrossEncoder.load(out).predict(PAIRS)
    from embforge.evaluate.similarity import correlations

    assert sts["spearman"] == pytest.approx(
        correlations(expected, np.arange(len(PAIRS)))["spearman"], abs=1e-4
    )
    assert main(["eval", "rerank", "--model", str(out), "--data", str(train_file)]) == 0
    rerank = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"mrr@10", "ndcg@10", "map", "queries"} <= set(rerank)
    two_stage = [
        "rerank",
        *("--bi-model", str(tiny_model_dir), "--cross-model", str(out), "--data", str(train_file)),
        *("--top-k", "3"),
    ]
    assert main(two_stage) == 0
    alone = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main([*two_stage, "--fusion", "0"]) == 0
    bi_only = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert bi_only["reranked_mrr@10"] == pytest.approx(alone["bi_mrr@10"])  # weight 0: the retriever's order
    with pytest.raises(SystemExit) as refused:  # a weight outside [0, 1] is refused when the flags are parsed
        main([*two_stage, "--fusion", "2"])
    assert refused.value.code == 2
    assert "--fusion: must be a number in [0, 1], got 2" in capsys.readouterr().err
