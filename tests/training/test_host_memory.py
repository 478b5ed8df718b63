"""Resident memory stays flat in the number of training steps (issue: the general recipe grew 1.3 -> 5.9 GB).

Batches of every length make glibc's heaps keep ever more freed pages resident; the loop hands them back
(:mod:`embforge.training.host_memory`). The model here is small but not tiny (width 128, 512 positions) so that the
step's tensors are large enough for the allocator's fragmentation to show: without the trim the process grew
~100 MB between steps 15 and 60 on this run; with it, a few MB.
"""

from __future__ import annotations

import random
import sys

import pytest
import torch

from embforge.training.host_memory import resident_bytes
from tests.conftest import WORDS, make_tokenizer

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or resident_bytes() is None, reason="reads /proc/self/statm"
)


def _varied_pairs(n: int) -> dict[str, list]:
    """STS-style rows whose texts run from 2 to ~400 tokens (a heavy tail, like real corpora)."""
    rng = random.Random(0)

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(int(rng.paretovariate(1.2) * 8) % 400 + 2))

    return {
        "sentence1": [text() for _ in range(n)],
        "sentence2": [text() for _ in range(n)],
        "score": [rng.random() for _ in range(n)],
    }


def test_resident_memory_is_flat_in_the_number_of_steps(tmp_path, monkeypatch) -> None:
    from transformers import BertConfig, BertModel

    from embforge.data.tables import Dataset
    from embforge.encoder import Encoder
    from embforge.losses import get_loss
    from embforge.training import host_memory
    from embforge.training.config import TrainConfig
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    # a small slack so that this small model's growth is trimmed; the default suits a real model's steps
    monkeypatch.setattr(host_memory, "DEFAULT_SLACK", 16 << 20)
    tokenizer = make_tokenizer()
    tokenizer.model_max_length = 512
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=512,
    )
    model = Encoder(BertModel(config), tokenizer, pooling="mean", max_seq_length=512)
    rows = _varied_pairs(2000)
    data = Dataset("varied.csv", rows, list(range(len(rows["score"]))))
    resident: dict[int, int] = {}

    def on_step(step: int) -> None:
        resident[step] = resident_bytes() or 0

    run = TrainConfig(
        output=str(tmp_path / "out"),
        batch_size=32,
        max_steps=60,
        quiet=True,
        amp="no",
        device="cpu",
        save_every=0,
    )
    train(model, [Task("sts", data, get_loss("cosent"))], run, on_step=on_step)
    growth = (resident[60] - resident[15]) / 2**20
    assert growth < 32, f"resident memory grew {growth:.0f} MB between steps 15 and 60"
