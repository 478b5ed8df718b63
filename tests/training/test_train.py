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

from embforge.cli import main
from embforge.data.tables import DataError, read_table
from embforge.encoder import Encoder
from embforge.losses import get_loss
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.tasks import Task, prepare
from tests.conftest import assert_same_weights


def weights(path):
    return Encoder.load(path).state_dict()


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


def test_a_teacher_score_loss_on_an_unscored_file_points_to_embforge_score(tmp_path):
    triplets = tmp_path / "triplets.csv"
    triplets.write_text("anchor,positive,negative\na cat,a dog,a car\n")
    for name in ("margin_mse", "kl_distill"):
        with pytest.raises(
            DataError, match=rf"triplets\.csv:1: .*{name}.*`embforge score --teacher MODEL --data "
        ):
            Task("t", read_table(triplets), get_loss(name)).validate()


def test_train_takes_the_no_header_its_error_advises(tmp_path, tiny_model_dir, capsys):
    """A first row that looks like a header (words above sentences) but is data: train says --no-header, and
    takes it."""
    path = tmp_path / "pairs.csv"
    path.write_text("hello,goodbye\n" + "".join(f"a man plays {i},a man is playing {i}\n" for i in range(8)))
    args = ["train", "--model", str(tiny_model_dir), "--train", str(path), "--loss", "infonce", "--quiet"]
    args += ["--max-steps", "1", "--batch-size", "4", "--save-every", "0"]
    assert main([*args, "--output", str(tmp_path / "a")]) == 2
    assert "pass --no-header if the first row is data" in capsys.readouterr().err
    assert main([*args, "--output", str(tmp_path / "b"), "--no-header"]) == 0


def test_simcse_feeds_one_column_twice(tmp_path, tiny_encoder):
    texts = tmp_path / "t.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["a cat", "a dog", "the sun", "a car"]))
    task = Task("simcse", read_table(texts), get_loss("simcse"))
    prepared = prepare(task, tiny_encoder)
    rows = (0, 1, 2, 3)
    ids = prepared.column_ids(rows)
    assert len(ids) == 2 and ids[0] == ids[1]
    tiny_encoder.train()
    first, second = tiny_encoder(prepared.inputs(rows), dropout_seed=7).split(4)
    assert not torch.allclose(first, second)  # dropout makes the two views of each text differ
    assert prepared.loss_fn(torch.cat([first, second]), None).item() > 0
    tiny_encoder.eval()
    first, second = tiny_encoder(prepared.inputs(rows)).split(4)
    torch.testing.assert_close(first, second)  # ... and only dropout


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
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
    model = Encoder.load(tiny_model_dir)
    seen: list[torch.dtype] = []  # the dtype of a linear layer's output inside the training forward
    hook = model.backbone.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda _module, _inputs, output: seen.append(output.dtype)
    )
    summary = train(model, [Task("sts", read_table(sts_csv), get_loss("cosent"))], config)
    hook.remove()
    assert summary["steps"] == 3
    assert seen and set(seen) == {torch.bfloat16 if amp == "bf16" else torch.float16}  # autocast was on
    records = [json.loads(line) for line in (tmp_path / amp / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["loss"]) for r in records if "loss" in r)


def _step_gradients(tmp_path, model_dir, data, name, **settings):
    """Train one step without dropout; return every parameter's gradient of that step."""
    model = Encoder.load(model_dir)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    captured = {}

    def on_step(_step):
        captured.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    config = TrainConfig(
        output=str(tmp_path / name), max_steps=1, quiet=True, save_every=0, amp="no", **settings
    )
    train(model, [Task("sts", read_table(data), get_loss("mse"))], config, on_step=on_step)
    return captured


def test_gradient_accumulation_equals_one_large_batch(tmp_path, tiny_model_dir, sts_csv):
    """Batch 32 in one micro-step or 2 x 16 accumulated: the same gradients (a mean loss, no dropout)."""
    whole = _step_gradients(tmp_path, tiny_model_dir, sts_csv, "whole", batch_size=32, max_grad_norm=0)
    halves = _step_gradients(
        tmp_path, tiny_model_dir, sts_csv, "halves", batch_size=16, grad_accum=2, max_grad_norm=0
    )
    assert whole.keys() == halves.keys() and len(whole) > 10
    for name, grad in whole.items():
        torch.testing.assert_close(halves[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_clipping_scales_the_gradient_to_the_max_norm(tmp_path, tiny_model_dir, sts_csv):
    free = _step_gradients(tmp_path, tiny_model_dir, sts_csv, "free", batch_size=32, max_grad_norm=0)
    clipped = _step_gradients(tmp_path, tiny_model_dir, sts_csv, "clip", batch_size=32, max_grad_norm=1e-3)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in free.values()]))
    assert norm > 1e-3
    for name, grad in free.items():
        torch.testing.assert_close(clipped[name], grad * (1e-3 / (norm + 1e-6)), atol=1e-9, rtol=1e-4)


def test_learning_rate_follows_linear_warmup_then_linear_decay(tmp_path, tiny_model_dir, sts_csv):
    config = TrainConfig(
        output=str(tmp_path / "lr"),
        max_steps=10,
        warmup_ratio=0.3,
        lr=1e-3,
        batch_size=8,
        log_every=1,
        quiet=True,
        save_every=0,
        amp="no",
    )
    train(Encoder.load(tiny_model_dir), [Task("sts", read_table(sts_csv), get_loss("cosent"))], config)
    records = [json.loads(line) for line in (tmp_path / "lr" / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in records if "lr" in r]
    # the lr logged after step s is the one the next step uses: warm-up over 3 steps, then linear to 0 at step 10
    expected = [1e-3 * (s + 1) / 3 if s < 3 else 1e-3 * (10 - s) / 7 for s in range(1, 11)]
    np.testing.assert_allclose(lrs, expected, rtol=1e-6)
