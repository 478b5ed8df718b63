"""The training loop: it learns, logs, keeps the best model, and a killed run resumes to identical weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from embforge.data.tables import DataError, read_table
from embforge.encoder import Encoder
from embforge.losses import get_loss
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.tasks import Task, prepare


def weights(path):
    return Encoder.load(path).state_dict()


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_training_lowers_loss_logs_and_keeps_best(tmp_path, tiny_model_dir, sts_csv):
    data = read_table(sts_csv)
    model = Encoder.load(tiny_model_dir)
    loss = get_loss("cosent")
    before = _batch_loss(model, data, loss)
    calls = []

    def evaluator(m):
        calls.append(1)
        return {"spearman": float(len(calls))}

    config = TrainConfig(
        output=str(tmp_path / "out"), epochs=5, batch_size=8, lr=1e-3, eval_every=5, quiet=True
    )
    summary = train(model, [Task("sts", data, loss)], config, evaluator=evaluator)
    assert summary["steps"] == 20
    assert _batch_loss(model, data, loss) < before
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval" in r] == [5, 10, 15, 20]
    assert summary["best"] == {"step": 20, "metric": "spearman", "value": 4.0}
    assert_same_weights(weights(tmp_path / "out" / "best"), weights(tmp_path / "out"))


def _batch_loss(model, data, loss):
    model.eval()
    with torch.no_grad():
        ids = [model.tokenize_ids(col) for col in data.texts()]
        emb = [model.embed_ids(col) for col in ids]
        value = loss(emb, torch.as_tensor(data.labels())).item()
    model.train()
    return value


def test_resume_after_crash_gives_identical_weights(tmp_path, tiny_model_dir, sts_csv):
    data = read_table(sts_csv)

    def run(out, crash_at=None, resume=False):
        config = TrainConfig(output=str(out), epochs=3, batch_size=5, save_every=3, resume=resume, quiet=True)

        def on_step(step):
            if step == crash_at:
                raise KeyboardInterrupt

        train(Encoder.load(tiny_model_dir), [Task("sts", data, get_loss("cosent"))], config, on_step=on_step)

    run(tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "crash", crash_at=8)  # mid-epoch 2; last checkpoint at step 6
    assert (tmp_path / "crash" / "checkpoints" / "latest").read_text().strip() == "checkpoint-6"
    run(tmp_path / "crash", resume=True)
    assert_same_weights(weights(tmp_path / "full"), weights(tmp_path / "crash"))


def test_sigkilled_cli_run_resumes_to_identical_weights(tmp_path, tiny_model_dir, sts_csv):
    """A real ``kill -9`` of ``embforge train`` mid-epoch, then ``--resume``: same final weights."""
    base = [
        sys.executable,
        "-m",
        "embforge.cli",
        "train",
        "--model",
        str(tiny_model_dir),
        "--train",
        str(sts_csv),
    ]
    opts = ["--epochs", "12", "--batch-size", "5", "--save-every", "4", "--quiet"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [*base, *opts, "--output", str(tmp_path / "full")], check=True, env=env, capture_output=True
    )
    proc = subprocess.Popen(
        [*base, *opts, "--output", str(tmp_path / "killed")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latest = tmp_path / "killed" / "checkpoints" / "latest"
    deadline = time.time() + 120
    while not latest.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    step = int(latest.read_text().split("-")[1])
    assert step < 84, "the run finished before it could be killed"
    subprocess.run(
        [*base, *opts, "--output", str(tmp_path / "killed"), "--resume"],
        check=True,
        env=env,
        capture_output=True,
    )
    records = (tmp_path / "killed" / "metrics.jsonl").read_text()
    assert '"event": "resume"' in records
    assert_same_weights(weights(tmp_path / "full"), weights(tmp_path / "killed"))


def test_task_validation_names_file_and_column(tmp_path, tiny_encoder):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("anchor,positive\na cat,a dog\n")
    with pytest.raises(
        DataError, match=r"pairs\.csv:1: task 'p' \(loss 'cosent'\) needs a 'score' or 'label'"
    ):
        Task("p", read_table(pairs), get_loss("cosent")).validate()
    with pytest.raises(DataError, match="needs at least 3 text column"):
        Task("p", read_table(pairs), get_loss("triplet")).validate()


def test_simcse_feeds_one_column_twice(tmp_path, tiny_encoder):
    texts = tmp_path / "t.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["a cat", "a dog", "the sun", "a car"]))
    task = Task("simcse", read_table(texts), get_loss("simcse"))
    prepared = prepare(task, tiny_encoder)
    assert len(prepared.ids) == 2 and prepared.ids[0] == prepared.ids[1]
    rows = (0, 1, 2, 3)
    tiny_encoder.train()
    first, second = tiny_encoder(prepared.inputs(rows), dropout_seed=7).split(4)
    assert not torch.allclose(first, second)  # dropout makes the two views of each text differ
    assert prepared.loss_fn(torch.cat([first, second]), None).item() > 0
    tiny_encoder.eval()
    first, second = tiny_encoder(prepared.inputs(rows)).split(4)
    torch.testing.assert_close(first, second)  # ... and only dropout


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="amp must be"):
        TrainConfig(amp="fp8")


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_on_cpu_trains_with_finite_loss(tmp_path, tiny_model_dir, sts_csv, amp):
    config = TrainConfig(
        output=str(tmp_path / amp),
        max_steps=3,
        batch_size=8,
        amp=amp,
        group_by_length=True,
        grad_accum=2,
        quiet=True,
        save_every=0,
    )
    summary = train(
        Encoder.load(tiny_model_dir), [Task("sts", read_table(sts_csv), get_loss("cosent"))], config
    )
    assert summary["steps"] == 3
    losses = [
        json.loads(line)["loss"] for line in (tmp_path / amp / "metrics.jsonl").read_text().splitlines()
    ]
    assert all(np.isfinite(losses))
