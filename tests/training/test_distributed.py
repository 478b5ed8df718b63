"""torchrun data parallelism: 2 gloo processes on loopback end with the weights of one process at the same batch.

One process group runs every 2-process training below (process start-up is the slow part); each test then runs
the same training in this process and compares the final weights.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from typing import Any

import numpy as np
import pytest
import torch

from embforge.encoder import Encoder
from embforge.training.distributed import spans_for
from tests.conftest import WORDS, make_bert, make_cross_encoder, make_tokenizer
from tests.distributed_helpers import (
    gather_check,
    resume_decision,
    run_training,
    run_trainings,
    spawn,
    step_gradients,
    torchrun,
    torchrun_command,
)

BASE = {
    "max_steps": 5,
    "batch_size": 64,
    "amp": "no",
    "lr": 1e-3,
    "seed": 3,
    "save_every": 0,
    "device": "cpu",
}


def texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 12)))) for _ in range(n)]


def write_jsonl(path, columns: dict[str, list]) -> str:
    rows = [dict(zip(columns, values)) for values in zip(*columns.values())]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def save_model(path, *, dropout: bool) -> str:
    tokenizer = make_tokenizer()
    backbone = make_bert(len(tokenizer))
    if not dropout:
        backbone.config.hidden_dropout_prob = 0.0
        backbone.config.attention_probs_dropout_prob = 0.0
    Encoder(backbone, tokenizer, pooling="mean", max_seq_length=64).save(path)
    return str(path)


def save_cross_encoder(path) -> str:
    make_cross_encoder().save(path)
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The specs, and the folder where the 2-process runs wrote their models."""
    root = tmp_path_factory.mktemp("distributed")
    model = save_model(root / "model", dropout=True)
    still = save_model(root / "model-no-dropout", dropout=False)
    triplets = write_jsonl(
        root / "triplets.jsonl",
        {"anchor": texts(200, 1), "positive": texts(200, 2), "negative": texts(200, 3)},
    )
    pairs = write_jsonl(root / "pairs.jsonl", {"anchor": texts(160, 4), "positive": texts(160, 5)})
    scores = np.random.default_rng(6).uniform(0, 5, 150).round(2).tolist()
    sts = write_jsonl(
        root / "sts.jsonl", {"sentence1": texts(150, 7), "sentence2": texts(150, 8), "score": scores}
    )
    hard = [("triplets", triplets, "infonce", {})]
    symmetric = [("triplets", triplets, "infonce", {"symmetric": True})]
    two = [("sts", sts, "cosent", {}), ("pairs", pairs, "infonce", {"matryoshka_dims": [32, 16]})]
    specs = {
        "hard-negatives, dropout off": {"model": still, "tasks": hard, "config": BASE},
        "hard-negatives symmetric, dropout on": {"model": model, "tasks": symmetric, "config": BASE},
        "two tasks (cosent + matryoshka infonce)": {"model": model, "tasks": two, "config": BASE},
        "cached, hard-negatives symmetric": {
            "model": model,
            "tasks": symmetric,
            "config": {**BASE, "mini_batch_size": 40},
        },
        "cached, two tasks": {"model": model, "tasks": two, "config": {**BASE, "mini_batch_size": 40}},
        "two tasks, batch 32 x 2 accumulated": {
            "model": model,
            "tasks": two,
            "config": {**BASE, "batch_size": 32, "grad_accum": 2},
        },
        "two tasks, killed after step 3 and resumed": {
            "model": model,
            "tasks": two,
            "config": {**BASE, "save_every": 1},
            "stop_after": 3,
        },
        "cross-encoder, listwise over the batch's positives": {
            "model": save_cross_encoder(root / "cross"),
            "cross": True,
            "tasks": [("qa", pairs, "listwise", {})],
            "config": {**BASE, "batch_size": 12},
        },
        "gradients of one step, cosent": {"model": model, "tasks": two[:1], "rows": 64},
        "gradients of one step, hard negatives symmetric": {"model": model, "tasks": symmetric, "rows": 63},
        "local losses (gather_negatives off)": {
            "model": model,
            "tasks": symmetric,
            "config": {**BASE, "gather_negatives": False},
        },
    }
    named = [{"name": f"run{i}", **spec} for i, spec in enumerate(specs.values())]
    spawn(run_trainings, named, str(root / "two-processes"), world=2)
    return {name: (spec, root / "two-processes" / spec["name"]) for name, spec in zip(specs, named)}


def load(spec, folder):
    if spec.get("cross"):
        from embforge.cross_encoder import CrossEncoder

        return CrossEncoder.load(folder)
    return Encoder.load(folder)


# parameters whose gradient is zero in exact arithmetic: attention key biases (a softmax ignores a shift of its
# row) and, under a listwise loss, the classifier's bias; AdamW turns their rounding noise into full-size steps
NOISE_ONLY = ("attention.self.key.bias", "classifier.bias")


def max_diff(a: Any, b: Any, *, skip: tuple[str, ...] = ()) -> float:
    pairs = zip(a.named_parameters(), b.named_parameters())
    return max((p - q).abs().max().item() for (name, p), (_, q) in pairs if not name.endswith(skip))


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The one-process run of a spec (plain step, no interruption), computed once per distinct training."""
    done: dict[str, Encoder] = {}

    def run(spec) -> Encoder:
        config = {k: v for k, v in spec["config"].items() if k not in ("mini_batch_size", "gather_negatives")}
        single = {**spec, "config": {**config, "save_every": 0}}
        single.pop("stop_after", None)
        single.pop("name", None)
        key = json.dumps(single, sort_keys=True)
        if key not in done:
            folder = tmp_path_factory.mktemp("one-process")
            run_training(single, str(folder))
            done[key] = load(spec, folder)
        return done[key]

    return run


EQUAL = [
    "hard-negatives, dropout off",
    "hard-negatives symmetric, dropout on",
    "two tasks (cosent + matryoshka infonce)",
    "cached, hard-negatives symmetric",  # 2 processes, cached step == 1 process, plain step
    "cached, two tasks",
    "two tasks, batch 32 x 2 accumulated",
    "cross-encoder, listwise over the batch's positives",
]


@pytest.mark.parametrize("name", EQUAL)
def test_two_processes_end_with_the_weights_of_one(runs, one_process, name):
    spec, folder = runs[name]
    one = one_process(spec)
    skip = NOISE_ONLY if spec.get("cross") else ()
    assert max_diff(load(spec, folder), one, skip=skip) <= 1e-5
    assert max_diff(one, load(spec, spec["model"])) > 1e-3  # it did train


@pytest.mark.parametrize("loss", ["cosent", "hard negatives symmetric"])
def test_a_step_has_the_gradients_of_one_process(runs, tmp_path, loss):
    """The summed gradient itself (the weights could not tell: AdamW does not see a gradient's scale)."""
    spec, folder = runs[f"gradients of one step, {loss}"]
    step_gradients(spec, str(tmp_path))
    for mode in ("plain", "cached"):
        two, one = torch.load(folder / f"{mode}.pt"), torch.load(tmp_path / f"{mode}.pt")
        assert two.keys() == one.keys() and len(one) > 10
        for name, grad in one.items():
            torch.testing.assert_close(two[name], grad, atol=1e-6, rtol=1e-4, msg=f"{mode} {name}")


def test_a_killed_and_resumed_run_equals_an_uninterrupted_one(runs):
    _, resumed = runs["two tasks, killed after step 3 and resumed"]
    _, uninterrupted = runs["two tasks (cosent + matryoshka infonce)"]
    assert max_diff(Encoder.load(resumed), Encoder.load(uninterrupted)) <= 1e-5
    records = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["from"] for r in records if r.get("event") == "resume"] == [
        "checkpoint-3"
    ]  # rank 0 logs it once


def test_without_gather_each_rank_has_its_own_loss(runs, one_process):
    """Local in-batch negatives (32 rows per rank, not 64): a different training from one process."""
    spec, folder = runs["local losses (gather_negatives off)"]
    assert max_diff(Encoder.load(folder), one_process(spec)) > 1e-4


def test_spans_cover_every_item_once():
    for n in range(0, 9):
        for world in (1, 2, 3, 4):
            spans = spans_for(n, world)
            assert [i for s, e in spans for i in range(s, e)] == list(range(n))
            assert max(e - s for s, e in spans) - min(e - s for s, e in spans) <= 1


def test_gather_keeps_the_local_slice_of_the_gradient():
    """2 ranks, 1 row: the second rank holds a placeholder row, which gets no place and a zero gradient."""
    spawn(gather_check, 1, world=2)


def test_every_rank_resumes_from_the_checkpoint_rank_0_names(tmp_path):
    """The race behind a rare ``gloo::EnforceNotMet ... Received data size doesn't match expected size``: after
    a stop, rank 1 read ``latest`` while rank 0 was still saving the newest checkpoint, so the ranks resumed from
    different steps and exchanged different batches. Rank 0 now decides and tells the others."""
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "checkpoint-2").mkdir(parents=True)
    (checkpoints / "latest").write_text("checkpoint-2\n")
    (checkpoints / "run.json").write_text('{"run_id": "r"}\n')
    spawn(resume_decision, str(checkpoints), str(tmp_path), world=2)
    answers = [(tmp_path / f"rank-{r}.txt").read_text() for r in (0, 1)]
    assert answers == ["checkpoint-3", "checkpoint-3"]


def test_torchrun_train_from_the_command_line(runs, tmp_path):
    """``torchrun --nproc-per-node 2 -m embforge train ...``: rank 0 alone reports, and the model is one process's."""
    from embforge.cli import main

    spec, _ = runs["hard-negatives symmetric, dropout on"]
    args = ["train", "--model", spec["model"], "--train", spec["tasks"][0][1], "--loss", "infonce"]
    args += ["--loss-option", "symmetric=true", "--batch-size", "64", "--max-steps", "2", "--amp", "no"]
    args += ["--lr", "1e-3", "--seed", "3", "--save-every", "0", "--device", "cpu", "--quiet"]
    done = torchrun(*args, "--output", str(tmp_path / "two"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 1 and json.loads(reports[0])["steps"] == 2
    assert main([*args, "--output", str(tmp_path / "one")]) == 0
    assert max_diff(Encoder.load(tmp_path / "two"), Encoder.load(tmp_path / "one")) <= 1e-5


def test_torchrun_pipeline_with_mining(runs, tmp_path):
    """A TOML pipeline stage that mines its negatives (sharded) and trains: the same mined rows and final model
    as one process; rank 0 alone writes the stage's files."""
    from embforge.cli import main

    spec, _ = runs["two tasks (cosent + matryoshka infonce)"]
    pairs = spec["tasks"][1][1]
    (tmp_path / "pipe.toml").write_text(
        f'model = "{spec["model"]}"\n[defaults]\nbatch_size = 32\nlr = 1e-3\namp = "no"\ndevice = "cpu"\n'
        f'seed = 3\nsave_every = 0\n[[stages]]\nname = "mined"\nsteps = 2\n  [[stages.tasks]]\n  name = "pairs"\n'
        f'  data = "{pairs}"\n  loss = "infonce"\n  mine = {{ method = "dense", num_negatives = 1 }}\n'
    )
    done = torchrun("train", "pipe.toml", "--output", "two", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len([line for line in done.stdout.splitlines() if line.startswith("{")]) == 1
    assert main(["train", str(tmp_path / "pipe.toml"), "--output", str(tmp_path / "one"), "--quiet"]) == 0
    mined = "stage-1-mined/refresh/pairs/negatives-0.jsonl"
    assert (tmp_path / "two" / mined).read_text() == (tmp_path / "one" / mined).read_text()
    two, one = Encoder.load(tmp_path / "two" / "final"), Encoder.load(tmp_path / "one" / "final")
    assert max_diff(two, one) <= 1e-5


@pytest.mark.slow
def test_torchrun_run_killed_by_sigkill_resumes_to_the_uninterrupted_weights(tmp_path):
    """A real kill: SIGKILL to the whole torchrun process tree (launcher and both ranks) as soon as a checkpoint
    exists, wherever the ranks are (maybe mid-way through writing the next checkpoint); ``--resume`` under torchrun
    then ends with the weights of an uninterrupted one-process run."""
    psutil = pytest.importorskip("psutil")
    from embforge.cli import main

    model = save_model(tmp_path / "model", dropout=True)
    triplets = write_jsonl(
        tmp_path / "triplets.jsonl",
        {"anchor": texts(200, 1), "positive": texts(200, 2), "negative": texts(200, 3)},
    )
    args = ["train", "--model", model, "--train", triplets, "--loss", "infonce"]
    args += ["--loss-option", "symmetric=true", "--batch-size", "64", "--max-steps", "30", "--amp", "no"]
    args += ["--lr", "1e-3", "--seed", "3", "--save-every", "2", "--device", "cpu", "--quiet"]
    output = tmp_path / "two"
    command, env = torchrun_command(*args, "--output", str(output))
    launcher = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    latest, deadline = output / "checkpoints" / "latest", time.monotonic() + 300
    while not latest.exists() and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    # the launcher and its workers (which torchrun may start in sessions of their own): kill the whole tree at once
    tree = [launcher.pid] + [child.pid for child in psutil.Process(launcher.pid).children(recursive=True)]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == -signal.SIGKILL, stderr.decode()[-3000:]
    assert not (output / "model.safetensors").exists()  # killed before the end: no final model
    killed_at = latest.read_text().strip()

    done = torchrun(*args, "--output", str(output), "--resume", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    resumed_from = [r["from"] for r in records if r.get("event") == "resume"]
    assert resumed_from == [killed_at]
    assert main([*args, "--output", str(tmp_path / "one")]) == 0
    assert max_diff(Encoder.load(output), Encoder.load(tmp_path / "one")) <= 1e-5
