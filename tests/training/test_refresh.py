"""ANCE-style negative refresh inside the training loop."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from embforge.data.retrieval import RetrievalData
from embforge.encoder import Encoder
from embforge.losses import get_loss
from embforge.retrieval.mining import MiningConfig
from embforge.training.checkpoints import read_progress
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.refresh import NegativeRefresher, RefreshConfig, RefreshHook, hard_ratio_at

WORDS = ["cat", "dog", "man", "woman", "guitar", "piano", "park", "road", "river", "sky", "sun", "rain"]


def _data() -> RetrievalData:
    docs = [" ".join(words) for words in itertools.islice(itertools.permutations(WORDS, 3), 0, 300, 10)][:30]
    assert len(set(docs)) == 30
    queries = [" ".join(docs[i].split()[:2]) + " " + WORDS[i] for i in range(12)]
    return RetrievalData(
        [f"d{i}" for i in range(30)],
        docs,
        [f"q{i}" for i in range(12)],
        queries,
        {f"q{i}": {f"d{i}": 1} for i in range(12)},
    )


def test_schedule_is_linear():
    config = RefreshConfig(every=2, hard_ratio_start=0.3, hard_ratio_end=0.9)
    assert [round(hard_ratio_at(config, s, 10), 3) for s in (0, 5, 10, 20)] == [0.3, 0.6, 0.9, 0.9]
    with pytest.raises(ValueError, match="hard_ratio_end must be between 0 and 1"):
        RefreshConfig(hard_ratio_end=2.0)


@pytest.mark.parametrize("background", [True, False])
def test_training_swaps_in_refreshed_negatives(tiny_encoder, tmp_path, background):
    data = _data()
    loss = get_loss("infonce")
    config = RefreshConfig(every=2, background=background, mining=MiningConfig(num_negatives=1, depth=10))
    refresher = NegativeRefresher(data, loss, config, total_steps=6, log_dir=tmp_path)
    tasks = refresher.build_tasks(tiny_encoder, 0)
    assert len(tasks[0].data) == 12 and tasks[0].data.text_columns == ["anchor", "positive", "negative_1"]
    seen_tasks = []

    def hook(step, model):
        if background and refresher._thread is not None:
            refresher.wait()  # make the test deterministic: the job ends before the next step
        fresh = refresher(step, model)
        if fresh is not None:
            seen_tasks.append(fresh)
        return fresh

    train_config = TrainConfig(
        output=str(tmp_path / "out"), max_steps=6, batch_size=4, quiet=True, save_every=0
    )
    summary = train(tiny_encoder, tasks, train_config, refresher=hook)
    assert summary["steps"] == 6
    records = [json.loads(line) for line in (tmp_path / "refresh.jsonl").read_text().splitlines()]
    assert [r["started_step"] for r in records] == [2, 4]
    assert all(r["rows"] == 12 for r in records)
    # seconds (not ms): never more than the whole run; mining in place stalls training for as long as it runs
    assert all(r["stall_seconds"] <= summary["seconds"] for r in records)
    if not background:
        assert all(r["stall_seconds"] > 0 for r in records)
    assert records[1]["hard_ratio"] > records[0]["hard_ratio"]
    assert len(seen_tasks) == 2
    # no refreshed negative is ever the row's own positive
    for fresh in seen_tasks:
        columns = fresh[0].data.columns
        assert all(n != p for n, p in zip(columns["negative_1"], columns["positive"]))


def test_cli_train_with_refresh(tiny_model_dir, tmp_path):
    from embforge.cli import main

    data = _data()
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in zip(data.doc_ids, data.doc_texts))
    )
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in zip(data.query_ids, data.query_texts))
    )
    (root / "qrels" / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\n"
        + "".join(f"{q}\t{d}\t1\n" for q, rel in data.qrels.items() for d in rel)
    )
    out = tmp_path / "out"
    argv = ["train", "--model", str(tiny_model_dir), "--retrieval-train", str(root), "--num-negatives", "1"]
    argv += ["--refresh-negatives-every", "2", "--batch-size", "4", "--output", str(out), "--quiet"]
    assert main([*argv, "--max-steps", "5", "--save-every", "5", "--keep-training-state"]) == 0
    records = [json.loads(line) for line in (out / "refresh.jsonl").read_text().splitlines()]
    assert records and all("stall_seconds" in r for r in records if r["event"] == "refresh")
    assert (out / "model.safetensors").exists()
    # --resume restores the negatives in use at the checkpoint (the background refresh timing decides which)
    active = read_progress(out / "checkpoints" / "checkpoint-5").get("refreshed_at")
    assert main([*argv, "--max-steps", "7", "--save-every", "5", "--resume"]) == 0
    records = [json.loads(line) for line in (out / "refresh.jsonl").read_text().splitlines()]
    resumed = [r for r in records if r["event"] == "resume"]
    assert [r["refreshed_at"] for r in resumed] == ([] if active is None else [active])


def _rows(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {c: [r[c] for r in rows] for c in rows[0]}


def test_resume_continues_with_the_negatives_of_the_last_checkpoint(tiny_model_dir, tmp_path):
    data = _data()

    def run(out, crash_at=None, resume=False):
        model = Encoder.load(tiny_model_dir)
        refresh = RefreshConfig(
            every=2,
            hard_ratio_start=0.3,
            hard_ratio_end=0.9,
            background=False,  # refreshes land at steps 2, 4, 6 exactly
            mining=MiningConfig(method="dense", num_negatives=1, relative_margin=0.05),
        )
        refresher = NegativeRefresher(
            data, get_loss("infonce"), refresh, total_steps=8, log_dir=out, name="r"
        )
        tasks = refresher.start(model, resume=resume)
        hook = RefreshHook(refresher, tasks)
        config = TrainConfig(
            output=str(out), max_steps=8, batch_size=4, save_every=4, resume=resume, quiet=True
        )

        def on_step(step):
            if step == crash_at:
                raise KeyboardInterrupt

        train(model, tasks, config, on_step=on_step, refresher=hook)
        return tasks[0].data.columns

    initial = run(tmp_path / "full")
    crash = tmp_path / "crash"
    with pytest.raises(KeyboardInterrupt):
        run(crash, crash_at=7)  # last checkpoint at step 4; the refresh of step 6 landed after it
    assert read_progress(crash / "checkpoints" / "checkpoint-4")["refreshed_at"] == 4
    at_4, at_6 = (
        _rows(crash / "refresh" / "r" / "negatives-4.jsonl"),
        _rows(crash / "refresh" / "r" / "negatives-6.jsonl"),
    )
    assert at_4["negative_1"] != initial["negative_1"] and at_4["negative_1"] != at_6["negative_1"]
    assert at_4["anchor"] == initial["anchor"] and at_4["positive"] == initial["positive"]
    assert run(crash, resume=True) == at_4
    records = [json.loads(line) for line in (crash / "refresh.jsonl").read_text().splitlines()]
    assert [(r["checkpoint"], r["refreshed_at"]) for r in records if r["event"] == "resume"] == [
        ("checkpoint-4", 4)
    ]
    # the resumed run trained on exactly what the uninterrupted one did
    full, resumed = Encoder.load(tmp_path / "full").state_dict(), Encoder.load(crash).state_dict()
    assert full.keys() == resumed.keys() and all(torch.equal(full[k], resumed[k]) for k in full)


def test_resume_without_a_refreshed_checkpoint_mines_from_the_start(tmp_path):
    refresher = NegativeRefresher(
        _data(), get_loss("infonce"), RefreshConfig(every=2), total_steps=4, log_dir=tmp_path
    )
    assert refresher.resume() is None  # no checkpoint yet
    with pytest.raises(ValueError, match="resume needs log_dir"):
        NegativeRefresher(_data(), get_loss("infonce"), RefreshConfig(), total_steps=4).resume()


def test_a_slow_refresh_is_waited_for_when_the_next_is_due(tiny_encoder, tmp_path, monkeypatch):
    """A trainer faster than the mining (a GPU) still gets every refresh, at the latest one interval later."""
    import threading
    import time

    data = _data()
    config = RefreshConfig(every=2, mining=MiningConfig(num_negatives=1, depth=10))
    refresher = NegativeRefresher(data, get_loss("infonce"), config, total_steps=8, log_dir=tmp_path)
    tasks = refresher.build_tasks(tiny_encoder, 0)
    build = refresher.build_tasks
    release = threading.Event()

    def slow_build(model, step):
        release.wait(timeout=30)  # mining never ends on its own before the next refresh is due
        release.clear()
        return build(model, step)

    monkeypatch.setattr(refresher, "build_tasks", slow_build)

    def hook(step, model):
        if step % 2 == 0 and refresher._thread is not None:
            threading.Timer(0.2, release.set).start()  # lets the job finish once the trainer waits
        return refresher(step, model)

    hook.close = refresher.close  # what retrieval_training's hook does: train() calls it at the end
    train_config = TrainConfig(output=str(tmp_path / "out"), max_steps=8, batch_size=4, quiet=True)
    started = time.perf_counter()
    train(tiny_encoder, tasks, train_config, refresher=hook)
    assert time.perf_counter() - started < 30
    records = [json.loads(line) for line in (tmp_path / "refresh.jsonl").read_text().splitlines()]
    applied = [r for r in records if r["event"] == "refresh"]
    assert [(r["started_step"], r["applied_step"]) for r in applied] == [(2, 4), (4, 6)]
    assert applied[0]["stall_seconds"] > 0.1  # the trainer waited, and says so
    assert records[-1] == {"event": "refresh_unused", "started_step": 6}  # still running at the end: joined
    assert "refresh_skipped" not in {r["event"] for r in records}
