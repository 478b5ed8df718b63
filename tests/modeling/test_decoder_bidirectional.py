"""Decoder backbones made bidirectional (embforge.modeling.decoder.set_bidirectional, ``embforge train
--bidirectional``): the mask really changes (a later token moves an earlier token's state only when bidirectional),
the padded forward equals a hand-masked reference, the packed forward equals the padded one (values and
gradients), the setting survives save/load, and a tiny Qwen3 trains in both modes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embforge.encoder import Encoder
from embforge.modeling.decoder import (
    BIDIRECTIONAL,
    backbone_hidden,
    is_bidirectional,
    set_bidirectional,
)
from embforge.modeling.padding import pad_ids
from tests.decoder_models import make_decoder_encoder

TEXTS = [
    "a man plays the guitar",
    "the cat",
    "a woman is reading a book in the park and the dog runs",
    "dog",
    "the stock market rises . oil price falls",
]


def ids_of(encoder: Encoder, texts: list[str]) -> list[list[int]]:
    return [encoder.tokenizer(t)["input_ids"] for t in texts]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_later_token_moves_an_earlier_state_only_when_bidirectional(side: str, bidirectional: bool) -> None:
    encoder = make_decoder_encoder("qwen3")
    set_bidirectional(encoder.backbone, bidirectional)
    a, b = ids_of(
        encoder, ["a man plays the guitar", "a man plays the piano"]
    )  # differ in the last word only
    batch, mask = pad_ids([a, b, a[:2]], encoder.pad_token_id, side=side)
    with torch.no_grad():
        hidden = backbone_hidden(encoder.backbone, batch, mask)
    first = 0 if side == "right" else batch.shape[1] - len(a)  # the first real token of rows 0 and 1
    change = (hidden[0, first : first + 4] - hidden[1, first : first + 4]).abs().max().item()
    if bidirectional:
        assert change > 1e-3  # "guitar" vs "piano" reaches the first four tokens
    else:
        assert change == 0.0  # causal: what comes later is never seen


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_padded_bidirectional_forward_equals_a_hand_masked_reference(implementation: str) -> None:
    encoder = make_decoder_encoder("qwen3")
    encoder.backbone.config._attn_implementation = implementation
    set_bidirectional(encoder.backbone)
    ids = ids_of(encoder, TEXTS)
    batch, mask = pad_ids(ids, encoder.pad_token_id, side="left")
    with torch.no_grad():
        hidden = backbone_hidden(encoder.backbone, batch, mask)
        for row, text in enumerate(ids):
            n = len(text)
            full = torch.zeros(1, 1, n, n)  # additive 4-D mask: every token sees every token, no padding
            alone = encoder.backbone(
                input_ids=torch.tensor([text]), attention_mask=full, position_ids=torch.arange(n)[None]
            ).last_hidden_state[0]
            torch.testing.assert_close(hidden[row, -n:], alone, atol=1e-5, rtol=1e-5)


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("kind", "overrides"), [("qwen3", {}), ("mistral", {"sliding_window": 4})])
@pytest.mark.parametrize("pooling", ["lasttoken", "mean"])
@pytest.mark.parametrize("max_tokens", [16, 4096])
def test_packed_bidirectional_equals_padded_values_and_gradients(
    kind, overrides, pooling, max_tokens
) -> None:
    encoder = make_decoder_encoder(kind, **overrides)
    encoder.pooling = pooling
    set_bidirectional(encoder.backbone)
    encoder.train()
    ids = encoder.tokenize_ids(TEXTS)
    target = torch.randn(len(ids), encoder.dim, generator=torch.Generator().manual_seed(0))

    packed = encoder.embed_ids(ids, max_tokens=max_tokens)
    (packed * target).sum().backward()
    packed_grads = grads(encoder)
    encoder.zero_grad()
    padded = encoder.padded_forward(*pad_ids(ids, encoder.pad_token_id, side=encoder.padding_side))
    (padded * target).sum().backward()
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    padded_grads = grads(encoder)
    assert packed_grads.keys() == padded_grads.keys() == {n for n, _ in encoder.named_parameters()}
    for name, grad in packed_grads.items():
        assert torch.isfinite(grad).all()
        torch.testing.assert_close(grad, padded_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    set_bidirectional(encoder.backbone, False)  # and the causal embeddings differ: the switch reaches packing
    assert (encoder.embed_ids(ids, max_tokens=max_tokens) - packed).abs().max() > 1e-3


def test_an_earlier_token_gets_gradient_from_a_later_one_only_when_bidirectional() -> None:
    encoder = make_decoder_encoder("qwen3")
    (ids,) = ids_of(encoder, ["a man plays the guitar"])
    for bidirectional in (False, True):
        set_bidirectional(encoder.backbone, bidirectional)
        embeds = encoder.backbone.embed_tokens(torch.tensor([ids])).detach().requires_grad_(True)
        hidden = encoder.backbone(
            inputs_embeds=embeds, is_causal=not bidirectional, **_mask(bidirectional, ids)
        )
        hidden.last_hidden_state[0, 0].sum().backward()  # the first token's state ...
        later = embeds.grad[0, 1:].abs().max().item()  # ... and the later tokens' inputs
        assert (later > 1e-4) if bidirectional else (later == 0.0)


def _mask(bidirectional: bool, ids: list[int]) -> dict[str, torch.Tensor]:
    n = len(ids)
    return {"attention_mask": torch.zeros(1, 1, n, n)} if bidirectional else {}


def test_save_and_load_keep_it(tmp_path) -> None:
    encoder = make_decoder_encoder("qwen3")
    encoder.pooling = "mean"
    set_bidirectional(encoder.backbone)
    encoder.save(tmp_path / "bidi")
    assert json.loads((tmp_path / "bidi" / "config.json").read_text())[BIDIRECTIONAL] is True
    loaded = Encoder.load(tmp_path / "bidi")
    assert is_bidirectional(loaded.backbone) and loaded.pooling == "mean"
    np.testing.assert_allclose(loaded.encode(TEXTS), encoder.encode(TEXTS), atol=1e-6)
    set_bidirectional(loaded.backbone, False)
    loaded.save(tmp_path / "causal")
    assert not is_bidirectional(Encoder.load(tmp_path / "causal").backbone)
    assert np.abs(Encoder.load(tmp_path / "causal").encode(TEXTS) - encoder.encode(TEXTS)).max() > 1e-3


def test_only_decoders_take_it(tiny_encoder: Encoder) -> None:
    with pytest.raises(ValueError, match="'bert' model attends both ways already"):
        set_bidirectional(tiny_encoder.backbone)
    assert not is_bidirectional(tiny_encoder.backbone)


def test_train_flag_reaches_the_loaded_model(tmp_path) -> None:
    from embforge.cli import build_parser
    from embforge.training.run import load_model
    from embforge.training.spec import RunSpec

    make_decoder_encoder("qwen3").save(tmp_path / "qwen")
    args = build_parser().parse_args(["train", "--model", str(tmp_path / "qwen"), "--bidirectional"])
    assert args.bidirectional is True
    assert is_bidirectional(load_model(RunSpec(model=str(tmp_path / "qwen"), bidirectional=True)).backbone)
    assert not is_bidirectional(load_model(RunSpec(model=str(tmp_path / "qwen"))).backbone)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_tiny_qwen3_trains_in_both_modes(bidirectional: bool) -> None:
    """InfoNCE on ten fixed (text, paraphrase) pairs: the loss falls in either mode."""
    encoder = make_decoder_encoder("qwen3", seed=1)
    encoder.pooling = "mean"
    set_bidirectional(encoder.backbone, bidirectional)
    words = ["cat", "dog", "man", "woman", "car", "tree", "river", "sky", "book", "song"]
    anchors = encoder.tokenize_ids([f"a {w} plays" for w in words])
    positives = encoder.tokenize_ids([f"the {w} is playing" for w in words])
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=3e-3)
    torch.manual_seed(0)
    losses = []
    for _ in range(30):
        a, p = encoder.embed_ids(anchors), encoder.embed_ids(positives)
        loss = F.cross_entropy(20 * a @ p.T, torch.arange(len(words)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_onnx_export_of_a_bidirectional_decoder(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    from embforge.onnx.export import export_onnx
    from embforge.onnx.runtime import OnnxEncoder

    encoder = make_decoder_encoder("qwen3")
    encoder.pooling = "mean"
    set_bidirectional(encoder.backbone)
    encoder.save(tmp_path / "model")
    report = export_onnx(tmp_path / "model", tmp_path / "onnx", parity_texts=TEXTS)
    assert report["parity"]["fp32_min_cosine"] > 0.9999
    onnx = OnnxEncoder.load(tmp_path / "onnx")
    np.testing.assert_allclose(onnx.encode(TEXTS, batch_size=4), encoder.encode(TEXTS), atol=1e-4)
