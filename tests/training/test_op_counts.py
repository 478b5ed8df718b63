"""Operations per training step and per encode do not grow with the batch (each is a kernel launch on a GPU).

Deterministic counts of ``aten::`` operator calls under ``torch.profiler``, on tiny 2-layer models: one training
step = the operations between the end of step 1 and the end of step 2 of ``train()``. Before the batched dropout masks and the one-buffer
attention, a bi-encoder step at batch 512 dispatched 13x the operations of a step at batch 64.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest
import torch

from embforge import Task, TrainConfig, get_loss, read_table, train
from embforge.encoder import CPU_ENCODE_TOKENS, ENCODE_TOKENS, Encoder
from embforge.losses.cross import get_cross_loss
from embforge.profiling import op_count, step_ops
from tests.conftest import WORDS, make_bert, make_cross_encoder, make_tokenizer
from tests.decoder_models import make_decoder_encoder

SLACK = 1.25  # batch 512 may cost at most this many times the operations of batch 64


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40)))


def _pairs(folder: Path, rows: int = 1100) -> Path:
    """Pairs of texts of 2-40 words (lengths spread over several attention groups) with scores and labels."""
    rng = random.Random(0)
    path = folder / "pairs.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence1", "sentence2", "score"])
        for _ in range(rows):
            writer.writerow([_sentence(rng), _sentence(rng), rng.randint(0, 1)])
    return path


def _no_dropout(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "attention_dropout"):  # decoder attention (a float, not a module)
            module.attention_dropout = 0.0


def _bi_encoder(dropout: bool) -> torch.nn.Module:
    tokenizer = make_tokenizer()
    model = Encoder(make_bert(len(tokenizer)), tokenizer, pooling="mean", max_seq_length=64)
    if not dropout:
        _no_dropout(model)
    return model


def _cross_encoder(dropout: bool) -> torch.nn.Module:
    model = make_cross_encoder()
    if not dropout:
        _no_dropout(model)
    return model


def _step_ops(make_model, loss, data, tmp_path: Path, *, batch: int, mini_batch: int = 0) -> int:
    """Operations of the second training step of a fresh model."""
    config = TrainConfig(
        output=str(tmp_path / f"run-{batch}-{mini_batch}"),
        max_steps=2,
        batch_size=batch,
        mini_batch_size=mini_batch,
        save_every=0,
        log_every=1000,
        quiet=True,
        amp="no",
        device="cpu",
    )
    model = make_model()
    return step_ops(lambda on_step: train(model, [Task("pairs", data, loss)], config, on_step=on_step))


@pytest.mark.parametrize("dropout", [True, False], ids=["dropout", "no-dropout"])
@pytest.mark.parametrize("kind", ["bi-encoder", "cross-encoder", "decoder"])
def test_step_ops_do_not_grow_with_the_batch(tmp_path, kind, dropout):
    data = read_table(_pairs(tmp_path))
    make, loss = {
        "bi-encoder": (lambda: _bi_encoder(dropout), get_loss("cosent")),
        "cross-encoder": (lambda: _cross_encoder(dropout), get_cross_loss("bce")),
        "decoder": (
            lambda: make_decoder_encoder(attention_dropout=0.1 if dropout else 0.0),
            get_loss("cosent"),
        ),
    }[kind]
    small = _step_ops(make, loss, data, tmp_path, batch=64)
    large = _step_ops(make, loss, data, tmp_path, batch=512)
    assert large <= SLACK * small, f"{kind}: {large} ops at batch 512 vs {small} at batch 64"


def test_cached_step_work_per_mini_batch_is_constant(tmp_path):
    data = read_table(_pairs(tmp_path))
    plain = _step_ops(lambda: _bi_encoder(True), get_loss("cosent"), data, tmp_path, batch=64)
    cached = _step_ops(
        lambda: _bi_encoder(True), get_loss("cosent"), data, tmp_path, batch=512, mini_batch=128
    )
    # 512 pairs in mini-batches of 64 pairs (128 texts, what a plain batch-64 step embeds): 8 mini-batches, each
    # embedded twice (GradCache); the loss and the optimiser step once
    assert cached <= SLACK * 8 * plain, f"cached batch 512: {cached} ops vs plain batch 64: {plain}"


def test_encode_ops_do_not_grow_with_the_number_of_texts():
    """Counted with an accelerator's token budget (a CPU's default chunks are cache-sized, so they are more)."""
    model = _bi_encoder(True)
    model.encode_tokens = ENCODE_TOKENS
    rng = random.Random(1)
    texts = [_sentence(rng) for _ in range(512)]
    small = op_count(lambda: model.encode(texts[:64], show_progress=False))
    large = op_count(lambda: model.encode(texts, show_progress=False))
    assert large <= SLACK * small, f"encode: {large} ops for 512 texts vs {small} for 64"


def test_encode_budget_by_device():
    model = _bi_encoder(False)
    assert model.encode_budget(32) == CPU_ENCODE_TOKENS
    model.encode_tokens = 4096
    assert model.encode_budget(32) == 4096
    assert [len(r) for r in model.batch_plan([1000, 1000, 1000, 1000, 1000], 32)] == [4, 1]
