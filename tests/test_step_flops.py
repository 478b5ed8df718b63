"""The training FLOP count behind the MFU figures (benchmarks/gpu/gpu_common.py ``step_flops``, also used by
benchmarks/bench_train.py): 6 × non-embedding parameters × real tokens + 12 × layers × hidden × Σ len²."""

from __future__ import annotations

import sys
from pathlib import Path

GPU = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"


def test_step_flops_of_a_tiny_bert():
    from transformers import BertConfig, BertModel

    sys.path.insert(0, str(GPU))
    try:
        from gpu_common import dense_params, step_flops
    finally:
        sys.path.remove(str(GPU))
    hidden, inner = 4, 8
    config = BertConfig(
        vocab_size=10,
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=inner,
        max_position_embeddings=16,
    )
    model = BertModel(config)  # with a pooler, which the count leaves out
    # one layer: Q, K, V, O (4 × (h² + h)), two LayerNorms (2 × 2h), FFN in and out (h·i + i + i·h + h);
    # plus the embeddings' LayerNorm (2h); the embedding tables are not counted
    layer = (
        4 * (hidden * hidden + hidden) + 2 * 2 * hidden + (hidden * inner + inner) + (inner * hidden + hidden)
    )
    n = layer + 2 * hidden
    assert dense_params(model) == n == 180
    lengths = [3, 5]
    expected = 6 * n * 8 + 12 * 1 * hidden * (9 + 25)
    assert step_flops(model, lengths) == expected == 10272
