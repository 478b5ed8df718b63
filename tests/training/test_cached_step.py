"""The cached (GradCache) micro-step equals the plain one with dropout on; batch cutting never changes training."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from embforge.data.tables import Dataset, read_table
from embforge.encoder import Encoder
from embforge.losses import get_loss
from embforge.losses.cross import get_cross_loss
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.step import cached_step
from embforge.training.tasks import Task, prepare
from tests.conftest import WORDS, make_cross_encoder


def texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 12)))) for _ in range(n)]


def dataset(columns: dict[str, list[str]], scores: list[float] | None = None) -> Dataset:
    data = dict(columns) if scores is None else {**columns, "score": [float(s) for s in scores]}
    return Dataset("memory.csv", data, list(range(1, len(next(iter(columns.values()))) + 1)))


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def plain_and_cached(model, task: Task, rows, mini_batch_size: int, seed: int = 11):
    prepared = prepare(task, model)
    model.train()
    model.zero_grad()
    loss = prepared.loss_fn(model(prepared.inputs(rows), dropout_seed=seed), prepared.labels(rows))
    loss.backward()
    plain = (loss.detach(), grads(model))
    model.zero_grad()
    loss = cached_step(
        model,
        prepared,
        rows,
        mini_batch_size=mini_batch_size,
        max_tokens=64,  # other attention blocks than the plain step's default: must not matter either
        dropout_seed=seed,
        backward=lambda value: value.backward(),
    )
    return plain, (loss, grads(model))


def assert_same(plain, cached) -> None:
    torch.testing.assert_close(cached[0], plain[0], atol=1e-5, rtol=1e-5)
    assert plain[1].keys() == cached[1].keys() and len(plain[1]) > 10
    for name, grad in plain[1].items():
        torch.testing.assert_close(cached[1][name], grad, atol=1e-5, rtol=1e-4, msg=name)


N = 12
BI_TASKS = {
    "infonce+hard negatives, symmetric": lambda: Task(
        "t",
        dataset({"anchor": texts(N, 1), "positive": texts(N, 2), "negative": texts(N, 3)}),
        get_loss("infonce", symmetric=True),
    ),
    "simcse": lambda: Task("t", dataset({"text": texts(N, 4)}), get_loss("simcse")),
    "cosent": lambda: Task(
        "t",
        dataset({"sentence1": texts(N, 5), "sentence2": texts(N, 6)}, list(np.linspace(0, 5, N))),
        get_loss("cosent"),
    ),
    "matryoshka(infonce)": lambda: Task(
        "t",
        dataset({"anchor": texts(N, 7), "positive": texts(N, 8)}),
        get_loss("infonce", matryoshka_dims=[32, 16, 8]),
    ),
}


@pytest.mark.parametrize("name", list(BI_TASKS))
def test_cached_step_equals_the_plain_step_with_dropout_on(tiny_encoder, name):
    task = BI_TASKS[name]()
    rows = tuple(range(N))
    plain, cached = plain_and_cached(tiny_encoder, task, rows, mini_batch_size=5)
    assert_same(plain, cached)


def test_cached_listwise_cross_encoder_step_equals_the_plain_step():
    ce = make_cross_encoder()
    task = Task("qa", dataset({"anchor": texts(6, 9), "positive": texts(6, 10)}), get_cross_loss("listwise"))
    plain, cached = plain_and_cached(ce, task, tuple(range(6)), mini_batch_size=7)  # 36 pairs, 6 mini-batches
    assert_same(plain, cached)


def test_dropout_is_on_in_these_comparisons(tiny_encoder):
    """Guard: the equalities above would be trivial if dropout did nothing."""
    ids = tiny_encoder.tokenize_ids(texts(4, 12))
    tiny_encoder.train()
    assert not torch.allclose(tiny_encoder(ids, dropout_seed=1), tiny_encoder(ids, dropout_seed=2))
    torch.testing.assert_close(tiny_encoder(ids, dropout_seed=1), tiny_encoder(ids, dropout_seed=1))


def test_gradient_checkpointing_gives_the_same_gradients(tiny_encoder):
    task = BI_TASKS["infonce+hard negatives, symmetric"]()
    rows = tuple(range(N))
    prepared = prepare(task, tiny_encoder)
    tiny_encoder.train()
    results = []
    for enabled in (False, True):
        tiny_encoder.gradient_checkpointing(enabled)
        tiny_encoder.zero_grad()
        loss = prepared.loss_fn(tiny_encoder(prepared.inputs(rows), dropout_seed=3), None)
        loss.backward()
        results.append((loss.detach(), grads(tiny_encoder)))
    assert_same(*results)


def test_padded_path_gradient_checkpointing_gives_the_same_gradients():
    from transformers import DistilBertConfig, DistilBertModel

    from tests.conftest import make_tokenizer

    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    backbone = DistilBertModel(
        DistilBertConfig(
            vocab_size=len(tokenizer),
            dim=32,
            n_layers=2,
            n_heads=2,
            hidden_dim=64,
            dropout=0.0,
            attention_dropout=0.0,
        )
    )
    model = Encoder(backbone, tokenizer, pooling="mean", max_seq_length=64)
    task = BI_TASKS["cosent"]()
    prepared = prepare(task, model)
    rows = tuple(range(N))
    model.train()
    results = []
    for enabled in (False, True):
        model.gradient_checkpointing(enabled)
        model.zero_grad()
        loss = prepared.loss_fn(model(prepared.inputs(rows)), prepared.labels(rows))
        loss.backward()
        results.append((loss.detach(), grads(model)))
    assert_same(*results)


def _write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(tmp_path, name, model_dir, tasks_spec, **config) -> Encoder:
    model = Encoder.load(model_dir)
    tasks = [Task(n, read_table(path), get_loss(loss)) for n, path, loss in tasks_spec]
    train(model, tasks, TrainConfig(output=str(tmp_path / name), quiet=True, save_every=0, seed=3, **config))
    return model


def _max_diff(a: Encoder, b: Encoder) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


@pytest.fixture
def two_tasks(tmp_path, sts_csv):
    pairs = tmp_path / "pairs.jsonl"
    _write_jsonl(pairs, [{"anchor": a, "positive": p} for a, p in zip(texts(40, 13), texts(40, 14))])
    return [("sts", sts_csv, "cosent"), ("pairs", pairs, "infonce")]


def test_chunk_tokens_is_a_pure_performance_knob(tmp_path, tiny_model_dir, sts_csv):
    """Issue: on STS-B ``--chunk-tokens 64`` changed the first loss and 16 % of the weights after one step."""
    spec = [("sts", sts_csv, "cosent")]
    small = _run(tmp_path, "small", tiny_model_dir, spec, max_steps=2, chunk_tokens=24, amp="no", lr=1e-3)
    large = _run(tmp_path, "large", tiny_model_dir, spec, max_steps=2, chunk_tokens=4096, amp="no", lr=1e-3)
    assert _max_diff(small, large) <= 1e-5
    untrained = Encoder.load(tiny_model_dir)
    assert _max_diff(small, untrained) > 1e-4  # it did train


def test_a_cached_two_task_run_ends_with_the_same_weights(tmp_path, tiny_model_dir, two_tasks):
    settings = {"max_steps": 4, "batch_size": 8, "amp": "no", "lr": 1e-3}
    plain = _run(tmp_path, "plain", tiny_model_dir, two_tasks, **settings)
    cached = _run(tmp_path, "cached", tiny_model_dir, two_tasks, mini_batch_size=3, **settings)
    assert _max_diff(plain, cached) <= 1e-5
