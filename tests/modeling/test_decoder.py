"""Decoder (LLM) embedders: the packed causal forward equals Hugging Face's padded forward (values and gradients),
padding side and batch composition do not change embeddings, EOS is appended, last-token pooling reads the last
real token, save/load and ONNX export keep all of it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embforge.encoder import Encoder
from embforge.modeling import decoder_packing
from embforge.modeling.decoder import eos_to_append, instruct_prompt, is_decoder_backbone
from embforge.modeling.decoder_packing import packed_decoder_hidden, supports_decoder_packing
from embforge.modeling.packed_batch import pack
from embforge.modeling.packing import supports_packing
from embforge.modeling.padding import pad_ids
from embforge.modeling.pooling import pool
from tests.decoder_models import make_decoder_encoder, make_decoder_tokenizer

TEXTS = [
    "a man plays the guitar",
    "the cat",
    "a woman is reading a book in the park and the dog runs",
    "dog",
    "the stock market rises . oil price falls",
    "a child kicks the ball",
]


def reference(encoder: Encoder, ids: list[list[int]]) -> torch.Tensor:
    """Hugging Face's own padded forward (right padding, its default positions) + pooling + normalisation."""
    batch, mask = pad_ids(ids, encoder.pad_token_id)
    hidden = encoder.backbone(input_ids=batch, attention_mask=mask).last_hidden_state
    emb = pool(hidden, mask, encoder.pooling).float()
    return F.normalize(emb, dim=-1) if encoder.normalize else emb


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("kind", "overrides"),
    [
        ("qwen3", {}),
        ("llama", {}),
        ("qwen2", {"attention_bias": True}),
        ("mistral", {"sliding_window": 4}),  # a window shorter than most texts: the banded mask matters
    ],
)
@pytest.mark.parametrize("pooling", ["lasttoken", "mean"])
@pytest.mark.parametrize("max_tokens", [16, 4096])  # several attention blocks / one block
def test_packed_decoder_values_and_gradients_equal_the_padded_forward(kind, overrides, pooling, max_tokens):
    encoder = make_decoder_encoder(kind, **overrides)
    encoder.pooling = pooling
    encoder.train()
    ids = encoder.tokenize_ids(TEXTS)
    weight = torch.randn(len(ids), encoder.dim, generator=torch.Generator().manual_seed(1))

    packed = encoder.embed_ids(ids, max_tokens=max_tokens)
    (packed * weight).sum().backward()
    packed_grads = grads(encoder)
    encoder.zero_grad()
    padded = reference(encoder, ids)
    (padded * weight).sum().backward()
    padded_grads = grads(encoder)

    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    assert packed_grads.keys() == padded_grads.keys() and len(packed_grads) > 10
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_embed_ids_takes_the_decoder_path_and_bert_packing_does_not_claim_decoders(monkeypatch):
    encoder = make_decoder_encoder("qwen3")
    assert supports_decoder_packing(encoder.backbone) and not supports_packing(encoder.backbone)
    assert is_decoder_backbone(encoder.backbone)
    calls = []
    original = decoder_packing.packed_decoder_hidden

    def spy(*args, **kwargs):
        calls.append(kwargs.get("last_tokens_only"))
        return original(*args, **kwargs)

    monkeypatch.setattr("embforge.encoder.packed_decoder_hidden", spy)
    encoder.embed_ids(encoder.tokenize_ids(TEXTS[:3]))
    assert calls == [True]  # last-token pooling: only the last rows are normed and returned


def test_last_tokens_only_returns_each_texts_last_state():
    encoder = make_decoder_encoder("qwen3").eval()
    batch = pack(encoder.tokenize_ids(TEXTS), max_tokens=32)
    with torch.no_grad():
        full = packed_decoder_hidden(encoder.backbone, batch)
        last = packed_decoder_hidden(encoder.backbone, batch, last_tokens_only=True)
    torch.testing.assert_close(last, full[batch.offsets + batch.lengths - 1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_embeddings_do_not_depend_on_padding_side_or_batch_composition(kind):
    left = make_decoder_encoder(kind, padding_side="left")
    right = make_decoder_encoder(kind, padding_side="right")
    assert left.padding_side == "left" and right.padding_side == "right"
    in_batch = left.encode(TEXTS, batch_size=len(TEXTS))
    np.testing.assert_allclose(right.encode(TEXTS, batch_size=len(TEXTS)), in_batch, atol=1e-5, rtol=0)
    one_by_one = np.stack([left.encode(t) for t in TEXTS])
    np.testing.assert_allclose(one_by_one, in_batch, atol=1e-5, rtol=0)
    np.testing.assert_allclose(left.encode(TEXTS[::-1], batch_size=2)[::-1], in_batch, atol=1e-5, rtol=0)


def test_left_padded_batch_really_is_left_padded_and_pools_the_last_real_token():
    encoder = make_decoder_encoder("qwen3", padding_side="left").eval()
    ids = encoder.tokenize_ids(TEXTS[:3])
    batch, mask = pad_ids(ids, encoder.pad_token_id, side=encoder.padding_side)
    assert mask[1, 0] == 0 and mask[1, -1] == 1  # short text: padding first
    with torch.no_grad():
        emb = encoder.embed_ids(ids)  # packed path, no padding at all
        hidden = encoder.backbone(
            input_ids=batch, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
        ).last_hidden_state
    torch.testing.assert_close(emb, F.normalize(hidden[:, -1], dim=-1), atol=1e-5, rtol=0)


def test_lasttoken_pooling_picks_the_last_real_token_for_either_padding_side():
    hidden = torch.arange(2 * 5 * 1, dtype=torch.float32).view(2, 5, 1)
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert pool(hidden, right, "lasttoken").flatten().tolist() == [2.0, 9.0]
    assert pool(hidden, left, "lasttoken").flatten().tolist() == [4.0, 9.0]


def test_eos_is_appended_within_max_seq_length():
    encoder = make_decoder_encoder("qwen3")
    endoftext = encoder.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert encoder.append_token_id == endoftext  # Qwen convention: <|endoftext|>, not the chat eos <|im_end|>
    ids = encoder.tokenize_ids(TEXTS)
    assert all(seq[-1] == endoftext and endoftext not in seq[:-1] for seq in ids)
    assert [len(s) for s in ids] == [len(t.split()) + 1 for t in TEXTS]
    encoder.max_seq_length = 5
    assert all(len(s) <= 5 and s[-1] == endoftext for s in encoder.tokenize_ids(TEXTS))

    llama = make_decoder_encoder("llama")
    assert llama.tokenize_ids(["the cat"])[0] == [
        llama.tokenizer.bos_token_id,
        *llama.tokenizer.convert_tokens_to_ids(["the", "cat"]),
        llama.tokenizer.eos_token_id,
    ]


def test_a_tokenizer_that_appends_eos_itself_gets_no_second_one():
    assert eos_to_append(make_decoder_tokenizer("qwen", eos_in_template=True)) is None
    assert eos_to_append(make_decoder_tokenizer("qwen")) == 0


def test_query_prompt_follows_the_qwen3_embedding_convention():
    encoder = make_decoder_encoder("qwen3")
    prompt = instruct_prompt("given a question retrieve passages that answer it")
    assert prompt == "Instruct: given a question retrieve passages that answer it\nQuery:"
    assert encoder.prompt_text(prompt_name="query") == prompt
    query = encoder.encode("the cat", prompt_name="query")
    assert not np.allclose(query, encoder.encode("the cat"))
    np.testing.assert_allclose(query, encoder.encode("the cat", prompt=prompt), atol=1e-6)


def test_save_and_load_round_trip_and_plain_hf_folder_defaults_to_last_token(tmp_path):
    encoder = make_decoder_encoder("qwen3")
    expected = encoder.encode(TEXTS)
    encoder.save(tmp_path / "st")
    loaded = Encoder.load(tmp_path / "st")
    assert (loaded.pooling, loaded.normalize, loaded.padding_side) == ("lasttoken", True, "left")
    assert loaded.prompts == encoder.prompts and loaded.append_token_id == encoder.append_token_id
    np.testing.assert_allclose(loaded.encode(TEXTS), expected, atol=1e-6)

    encoder.backbone.save_pretrained(tmp_path / "hf")
    encoder.tokenizer.save_pretrained(tmp_path / "hf")
    plain = Encoder.load(tmp_path / "hf", normalize=True)
    assert plain.pooling == "lasttoken"
    np.testing.assert_allclose(plain.encode(TEXTS), expected, atol=1e-6)


def test_onnx_export_keeps_last_token_pooling_and_eos(tmp_path):
    pytest.importorskip("onnxruntime")
    from embforge.onnx.export import export_onnx
    from embforge.onnx.runtime import OnnxEncoder

    encoder = make_decoder_encoder("qwen3")
    encoder.save(tmp_path / "model")
    report = export_onnx(tmp_path / "model", tmp_path / "onnx", parity_texts=TEXTS)
    assert report["parity"]["fp32_min_cosine"] > 0.9999
    meta = json.loads((tmp_path / "onnx" / "embforge_onnx.json").read_text())
    assert meta["pooling"] == "lasttoken" and meta["append_token_id"] == encoder.append_token_id
    onnx = OnnxEncoder.load(tmp_path / "onnx")
    assert onnx.tokenize_ids(TEXTS) == encoder.tokenize_ids(TEXTS)
    np.testing.assert_allclose(onnx.encode(TEXTS, batch_size=4), encoder.encode(TEXTS), atol=1e-4)


def test_gradient_checkpointing_keeps_values_and_gradients():
    encoder = make_decoder_encoder("llama").train()
    ids = encoder.tokenize_ids(TEXTS)
    weight = torch.randn(len(ids), encoder.dim, generator=torch.Generator().manual_seed(3))
    calls = []
    mlp = encoder.backbone.layers[0].mlp
    forward = mlp.forward
    mlp.forward = lambda x: calls.append(1) or forward(x)  # (module hooks do not fire on recomputation)
    results = []
    for enabled in (False, True):
        encoder.zero_grad()
        encoder.gradient_checkpointing(enabled)
        emb = encoder.embed_ids(ids, max_tokens=16)
        (emb * weight).sum().backward()
        results.append((emb.detach(), grads(encoder)))
    assert len(calls) == 3  # once without checkpointing; forward + recomputation with it
    (plain, plain_grads), (checkpointed, checkpointed_grads) = results
    torch.testing.assert_close(checkpointed, plain, atol=0, rtol=0)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(checkpointed_grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
