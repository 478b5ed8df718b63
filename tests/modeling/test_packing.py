"""The padding-free BERT forward equals the padded Hugging Face forward: values, gradients, order, heads."""

from __future__ import annotations

import pytest
import torch

from embforge.modeling.packed_batch import pack
from embforge.modeling.packing import (
    packed_hidden,
    pool_packed,
    supports_packed_classifier,
    supports_packing,
)
from embforge.modeling.padding import pad_ids
from embforge.modeling.pooling import pool
from tests.conftest import make_cross_encoder
from tests.losses.test_cross_losses import PAIRS

TEXTS = [
    "the cat sat on the mat",
    "dog",
    "a man is playing a guitar on the stage tonight",
    "a woman eats",
    "dog",
    "stock market rises as oil price falls",
]


def without_dropout(module: torch.nn.Module) -> None:
    for sub in module.modules():
        if isinstance(sub, torch.nn.Dropout):
            sub.p = 0.0
    for layer in getattr(getattr(module, "encoder", None), "layer", []):
        layer.attention.self.dropout.p = 0.0


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", ["mean", "cls", "max", "lasttoken"])
@pytest.mark.parametrize("max_tokens", [8, 30, 4096])
def test_packed_forward_and_gradients_equal_the_padded_forward(tiny_encoder, mode, max_tokens):
    backbone = tiny_encoder.backbone
    assert supports_packing(backbone)
    backbone.train()
    without_dropout(backbone)
    ids = tiny_encoder.tokenize_ids(TEXTS)
    input_ids, mask = pad_ids(ids, tiny_encoder.pad_token_id)
    weights = torch.randn(len(TEXTS), backbone.config.hidden_size)

    padded = pool(backbone(input_ids=input_ids, attention_mask=mask).last_hidden_state, mask, mode)
    (padded * weights).sum().backward()
    expected = grads(backbone)
    backbone.zero_grad()

    batch = pack(ids, max_tokens=max_tokens)
    packed = pool_packed(packed_hidden(backbone, batch), batch, mode)[batch.inverse]
    (packed * weights).sum().backward()
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    got = grads(backbone)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)


def test_encoder_embed_ids_uses_the_packed_path_with_identical_results(tiny_encoder, monkeypatch):
    import embforge.encoder as encoder_module

    tiny_encoder.eval()
    ids = tiny_encoder.tokenize_ids(TEXTS)
    packed = tiny_encoder.embed_ids(ids, max_tokens=16)
    monkeypatch.setattr(encoder_module, "supports_packing", lambda backbone: False)
    padded = tiny_encoder.embed_ids(ids, max_tokens=16)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    single = torch.cat([tiny_encoder.embed_ids([seq]) for seq in ids])
    torch.testing.assert_close(packed, single, atol=1e-5, rtol=1e-5)


def test_cls_pooling_encoder_takes_the_first_token_path_with_identical_results(tiny_encoder, monkeypatch):
    import embforge.encoder as encoder_module

    tiny_encoder.pooling = "cls"
    tiny_encoder.eval()
    ids = tiny_encoder.tokenize_ids(TEXTS)
    packed = tiny_encoder.embed_ids(ids, max_tokens=16)
    monkeypatch.setattr(encoder_module, "supports_packing", lambda backbone: False)
    torch.testing.assert_close(packed, tiny_encoder.embed_ids(ids, max_tokens=16), atol=1e-5, rtol=1e-5)


def test_packed_cross_encoder_logits_equal_the_padded_model():
    ce = make_cross_encoder()
    assert supports_packed_classifier(ce.model)
    ce.eval()
    items = ce.tokenize_ids([a for a, _ in PAIRS], [b for _, b in PAIRS])
    packed = ce.score_ids(items, max_tokens=24)
    expected = torch.cat([ce(*ce.pad([item])) for item in items])
    torch.testing.assert_close(packed, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("max_tokens", [8, 30, 4096])
def test_first_tokens_only_gives_the_cls_states_and_their_gradients(tiny_encoder, max_tokens):
    backbone = tiny_encoder.backbone
    backbone.train()
    without_dropout(backbone)
    batch = pack(tiny_encoder.tokenize_ids(TEXTS), max_tokens=max_tokens)
    weights = torch.randn(len(TEXTS), backbone.config.hidden_size)
    full = pool_packed(packed_hidden(backbone, batch), batch, "cls")
    (full * weights).sum().backward()
    expected = grads(backbone)
    backbone.zero_grad()
    first = packed_hidden(backbone, batch, first_tokens_only=True)
    (first * weights).sum().backward()
    torch.testing.assert_close(first, full, atol=1e-5, rtol=1e-5)
    got = grads(backbone)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)


def test_packed_cross_encoder_gradients_equal_the_padded_model():
    ce = make_cross_encoder()
    ce.train()
    without_dropout(ce.model)
    ce.model.dropout.p = 0.0
    items = ce.tokenize_ids([a for a, _ in PAIRS], [b for _, b in PAIRS])
    weights = torch.randn(len(items), ce.num_labels)
    (torch.cat([ce(*ce.pad([item])) for item in items]) * weights).sum().backward()
    expected = grads(ce.model)
    ce.model.zero_grad()
    (ce.score_ids(items, max_tokens=24) * weights).sum().backward()
    got = grads(ce.model)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)


def test_pack_plans_length_sorted_blocks_by_length_bucket_within_the_budget():
    ids = [[1] * n for n in (3, 7, 7, 2, 5, 6, 4)]
    batch = pack(ids, max_tokens=14)
    assert batch.lengths.tolist() == [7, 7, 6, 5, 4, 3, 2]
    # four equal steps of log-length from 7 down to 2 (7, 7, 6 | 5, 4 | 3 | 2); the budget of 14 padded tokens
    # splits the first group into 7, 7 | 6
    groups = [(g.first, g.texts, g.width) for g in batch.groups]
    assert groups == [(0, 2, 7), (2, 1, 6), (3, 2, 5), (5, 1, 3), (6, 1, 2)]
    assert [g.key_mask is None for g in batch.groups] == [
        True,
        True,
        False,
        True,
        True,
    ]  # only 5, 4 is padded
    assert batch.groups[2].key_mask.sum().item() == 9
    assert batch.offsets.tolist() == [0, 7, 14, 20, 25, 29, 32]
    assert batch.inverse.tolist() == [5, 0, 1, 6, 3, 2, 4]
    assert batch.padded_rows == 14 + 6 + 10 + 3 + 2
    with pytest.raises(ValueError, match="empty"):
        pack([[1], []], max_tokens=8)


def test_other_architectures_are_not_packed():
    from transformers import DistilBertConfig, DistilBertModel

    model = DistilBertModel(DistilBertConfig(vocab_size=50, dim=32, n_layers=1, n_heads=2, hidden_dim=64))
    assert not supports_packing(model)


def test_keyed_dropout_keeps_one_minus_p_and_depends_only_on_the_key():
    from embforge.modeling.dropout import AttentionSites, HiddenSites, layer_keys, text_keys

    def hidden(keys, lengths, layer=0, site=0):
        lengths = torch.tensor(lengths)
        text = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        position = torch.cat([torch.arange(n) for n in lengths.tolist()])
        sites = HiddenSites(position, 64, sites=(1, 2))
        return sites.keeps(layer_keys(keys, layer)[text], 0.1, torch.float32)[site]

    keys = text_keys(5, range(40))
    lengths = [100 + i for i in range(40)]
    everything = hidden(keys, lengths)
    kept = everything != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.003
    torch.testing.assert_close(everything[kept], torch.full_like(everything[kept], 1 / 0.9))
    # text 3's masks do not depend on the other texts of the forward, nor on the texts' order
    alone = hidden(keys[3:4], lengths[3:4])
    start = sum(lengths[:3])
    assert torch.equal(alone, everything[start : start + lengths[3]])
    swapped = hidden(keys[[4, 3]], [lengths[4], lengths[3]], site=1)
    assert torch.equal(swapped[lengths[4] :], hidden(keys[3:4], lengths[3:4], site=1))
    # another layer, another micro-step seed, another place in the batch or another site: other masks
    assert not torch.equal(alone, hidden(keys[3:4], lengths[3:4], layer=1))
    assert not torch.equal(alone, hidden(text_keys(6, [3]), lengths[3:4]))
    assert not torch.equal(alone, hidden(keys[4:5], lengths[3:4]))
    assert not torch.equal(alone, hidden(keys[3:4], lengths[3:4], site=1))
    # attention: a text's mask is the same whatever block (and block width) it is in; P(drop) = p
    blocks = AttentionSites([(0, 3, 104, 104), (3, 2, 103, 103)], 2, torch.device("cpu"))
    drops = blocks.drops(layer_keys(keys, 0), 0.1)
    assert [d.shape for d in drops] == [(3, 2, 104, 104), (2, 2, 103, 103)]
    assert abs(torch.cat([d.flatten() for d in drops]).float().mean().item() - 0.1) < 0.003
    moved = AttentionSites([(3, 1, 103, 103)], 2, torch.device("cpu")).drops(layer_keys(keys, 0), 0.1)[0]
    assert torch.equal(moved[0], drops[1][0])
    wider = AttentionSites([(3, 1, 110, 110)], 2, torch.device("cpu")).drops(layer_keys(keys, 0), 0.1)[0]
    assert torch.equal(wider[0, :, :103, :103], drops[1][0])
