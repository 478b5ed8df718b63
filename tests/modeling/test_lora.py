"""LoRA adapters (peft): what trains, merged == unmerged, save/load round trips, the padding-free paths never skip
adapters, and a killed LoRA run resumes to the same adapter weights."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from embforge.cross_encoder import CrossEncoder
from embforge.data.tables import read_table
from embforge.encoder import Encoder
from embforge.losses import get_loss
from embforge.modeling import packing
from embforge.modeling.decoder import base_model
from embforge.modeling.lora import (
    LoraConfig,
    apply_lora,
    has_adapter,
    merge_lora,
    trainable_parameters,
    uses_adapters,
)
from embforge.modeling.padding import pad_ids
from embforge.modeling.pooling import pool
from tests.conftest import make_cross_encoder
from tests.decoder_models import make_decoder_encoder

pytest.importorskip("peft")

TEXTS = ["a man plays the guitar", "the cat", "a woman is reading a book in the park", "dog runs"]
PAIRS = [("a man plays the guitar", "a man is playing guitar"), ("the cat", "the stock market rises")]


def nonzero_adapters(model: nn.Module, seed: int = 1) -> None:
    """peft starts B at zero (the adapted model equals the base); give every B random values."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)


def adapter_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if "lora_" in k}


def test_only_the_adapters_train_and_their_count_is_r_times_in_plus_out(tiny_encoder):
    base_total = sum(p.numel() for p in tiny_encoder.parameters())
    linears = [
        m
        for name, m in tiny_encoder.backbone.named_modules()
        if isinstance(m, nn.Linear) and "pooler" not in name
    ]
    apply_lora(tiny_encoder, r=4)
    trainable, total = trainable_parameters(tiny_encoder)
    expected = sum(4 * (m.in_features + m.out_features) for m in linears)
    assert (
        trainable == expected == 3584
    )  # 2 layers x (q, k, v, o: 4 x 64 x 4 + two 32<->64 layers: 2 x 96 x 4)
    assert total == base_total + expected
    assert all("lora_" in n for n, p in tiny_encoder.named_parameters() if p.requires_grad)
    assert uses_adapters(tiny_encoder.backbone)


def test_targets_can_be_named_and_validated(tiny_encoder):
    apply_lora(tiny_encoder, r=2, targets="query,value")
    names = {
        n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in tiny_encoder.named_parameters() if p.requires_grad
    }
    assert names == {"query", "value"}
    with pytest.raises(ValueError, match="already has adapters"):
        apply_lora(tiny_encoder, r=2)
    with pytest.raises(ValueError, match="lora r must be >= 0"):
        LoraConfig(r=-1)


def test_lora_config_reads_train_config_fields():
    class Fields:
        lora_r, lora_alpha, lora_dropout, lora_targets, merge_lora = 16, None, 0.1, "q_proj,v_proj", True

    config = LoraConfig.from_fields(Fields())
    assert (config.r, config.alpha, config.dropout, config.targets, config.merge, config.enabled) == (
        16,
        None,
        0.1,
        "q_proj,v_proj",
        True,
        True,
    )
    assert not LoraConfig.from_fields(object()).enabled


def test_merged_and_unmerged_models_encode_the_same(tiny_encoder):
    base = tiny_encoder.encode(TEXTS)
    apply_lora(tiny_encoder, r=4)
    nonzero_adapters(tiny_encoder)
    adapted = tiny_encoder.encode(TEXTS)
    assert np.abs(adapted - base).max() > 1e-2  # the adapters change the embeddings
    merge_lora(tiny_encoder)
    assert not uses_adapters(tiny_encoder.backbone)
    assert type(tiny_encoder.backbone).__name__ == "BertModel"
    np.testing.assert_allclose(tiny_encoder.encode(TEXTS), adapted, atol=1e-5, rtol=0)


def test_adapted_bert_takes_the_padded_path_with_the_adapters(tiny_encoder, monkeypatch):
    apply_lora(tiny_encoder, r=4)
    nonzero_adapters(tiny_encoder)
    # peft's in-place injection keeps the BertModel class: supports_packing's adapter guard keeps packing away
    assert not packing.supports_packing(base_model(tiny_encoder.backbone))
    monkeypatch.setattr(tiny_encoder, "backbone", base_model(tiny_encoder.backbone))

    def refuse(*args, **kwargs):
        raise AssertionError("packing.py would bypass the LoRA layers")

    monkeypatch.setattr("embforge.encoder.packed_hidden", refuse)
    ids = tiny_encoder.tokenize_ids(TEXTS)
    with torch.no_grad():
        emb = tiny_encoder.eval().embed_ids(ids)
        batch, mask = pad_ids(ids, tiny_encoder.pad_token_id)
        hidden = tiny_encoder.backbone(input_ids=batch, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(emb, pool(hidden, mask, "mean"), atol=1e-6, rtol=0)


def test_save_and_load_round_trip_with_adapter_and_merged(tmp_path, tiny_encoder):
    apply_lora(tiny_encoder, r=4, alpha=4)
    nonzero_adapters(tiny_encoder)
    expected = tiny_encoder.encode(TEXTS)
    tiny_encoder.save(tmp_path / "lora")
    assert has_adapter(tmp_path / "lora")
    note = json.loads((tmp_path / "lora" / "config_sentence_transformers.json").read_text())["lora"]
    assert (note["adapter"], note["r"], note["alpha"]) == ("adapter", 4, 4.0)
    loaded = Encoder.load(tmp_path / "lora")
    assert uses_adapters(loaded.backbone)
    assert (
        trainable_parameters(loaded)[0] == trainable_parameters(tiny_encoder)[0]
    )  # resumable: adapters train
    assert loaded.state_dict().keys() == tiny_encoder.state_dict().keys()
    for key, value in tiny_encoder.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, atol=0, rtol=0, msg=key)
    np.testing.assert_allclose(loaded.encode(TEXTS), expected, atol=1e-6)

    merge_lora(loaded).save(tmp_path / "merged")
    assert not has_adapter(tmp_path / "merged")
    assert "lora" not in json.loads((tmp_path / "merged" / "config_sentence_transformers.json").read_text())
    merged = Encoder.load(tmp_path / "merged")
    assert not uses_adapters(merged.backbone)
    np.testing.assert_allclose(merged.encode(TEXTS), expected, atol=1e-5)
    tiny_encoder.save(tmp_path / "merged")  # saving a merged model over an adapted folder drops its adapter
    merge_lora(tiny_encoder).save(tmp_path / "lora")
    assert not has_adapter(tmp_path / "lora")


def test_cross_encoder_lora_trains_the_head_and_round_trips(tmp_path):
    ce = make_cross_encoder()
    apply_lora(ce, r=4)
    trainable = [n for n, p in ce.named_parameters() if p.requires_grad]
    assert any("classifier" in n for n in trainable)  # the new head trains in full
    assert all("lora_" in n or "classifier" in n for n in trainable)
    nonzero_adapters(ce)
    with torch.no_grad():
        logits = ce.train(False).score_ids(ce.tokenize_ids([a for a, _ in PAIRS], [b for _, b in PAIRS]))
    scores = ce.predict(PAIRS, activation=False)
    np.testing.assert_allclose(logits[:, 0].numpy(), scores, atol=1e-6)
    ce.save(tmp_path / "ce")
    loaded = CrossEncoder.load(tmp_path / "ce")
    assert uses_adapters(loaded.model)
    np.testing.assert_allclose(loaded.predict(PAIRS, activation=False), scores, atol=1e-6)
    merge_lora(loaded).save(tmp_path / "ce-merged")
    merged = CrossEncoder.load(tmp_path / "ce-merged")
    np.testing.assert_allclose(merged.predict(PAIRS, activation=False), scores, atol=1e-5)


def test_decoder_packed_path_uses_the_adapters():
    encoder = make_decoder_encoder("qwen3").train()
    ids = encoder.tokenize_ids(TEXTS)
    base = encoder.embed_ids(ids).detach()
    apply_lora(encoder, r=4, targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    nonzero_adapters(encoder)
    packed = encoder.embed_ids(ids, max_tokens=16)
    batch, mask = pad_ids(ids, encoder.pad_token_id)
    hidden = encoder.backbone(input_ids=batch, attention_mask=mask).last_hidden_state
    padded = torch.nn.functional.normalize(pool(hidden, mask, "lasttoken"), dim=-1)
    assert (packed - base).abs().max() > 1e-2
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)


def test_killed_lora_run_resumes_to_the_same_adapter_weights(tmp_path, tiny_model_dir, sts_csv):
    from embforge.training.loop import TrainConfig, train
    from embforge.training.tasks import Task

    data = read_table(sts_csv)

    def run(out, crash_at=None, resume=False):
        config = TrainConfig(
            output=str(out), epochs=2, batch_size=8, save_every=3, lr=1e-3, resume=resume, quiet=True
        )
        torch.manual_seed(0)  # the adapters' initial A matrices
        model = apply_lora(Encoder.load(tiny_model_dir), r=4, dropout=0.1)

        def on_step(step):
            if step == crash_at:
                raise KeyboardInterrupt

        train(model, [Task("sts", data, get_loss("cosent"))], config, on_step=on_step)

    run(tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "crash", crash_at=5)  # mid-epoch 2 (4 steps an epoch); last checkpoint at step 3
    assert has_adapter(tmp_path / "crash" / "checkpoints" / "checkpoint-3" / "model")
    run(tmp_path / "crash", resume=True)
    full, resumed = (adapter_weights(Encoder.load(tmp_path / name)) for name in ("full", "crash"))
    assert full.keys() == resumed.keys() and len(full) == 24  # 2 layers x 6 linears x (A, B); no pooler
    for key in full:
        assert torch.equal(full[key], resumed[key]), key
    start = adapter_weights(apply_lora(Encoder.load(tiny_model_dir), r=4))
    assert any(not torch.equal(full[k], start[k]) for k in full if "lora_B" in k)  # it trained


def test_cli_train_with_lora_flags_saves_a_merged_model(tmp_path, tiny_model_dir, sts_csv):
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "embforge",
        "train",
        "--model",
        str(tiny_model_dir),
        "--train",
        str(sts_csv),
    ]
    command += ["--output", str(out), "--max-steps", "3", "--lora-r", "4", "--merge-lora", "--quiet"]
    command += ["--keep-training-state"]  # checkpoints (with the adapter) stay for --resume
    subprocess.run(command, check=True, capture_output=True, text=True)
    assert not has_adapter(out) and has_adapter(out / "checkpoints" / "checkpoint-3" / "model")


def test_decoder_lora_dropout_replays_under_a_seed_and_under_gradient_checkpointing():
    encoder = make_decoder_encoder("qwen3").train()
    apply_lora(encoder, r=4, dropout=0.3)
    nonzero_adapters(encoder)
    ids = encoder.tokenize_ids(TEXTS)
    weight = torch.randn(len(ids), encoder.dim, generator=torch.Generator().manual_seed(2))

    def step(checkpointing: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        encoder.zero_grad()
        encoder.checkpointing = checkpointing
        emb = encoder(ids, dropout_seed=7)
        (emb * weight).sum().backward()
        return emb.detach(), {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}

    plain, plain_grads = step(False)
    assert not torch.allclose(plain, encoder(ids, dropout_seed=8))  # the seed picks the masks
    again, checkpointed_grads = step(True)
    torch.testing.assert_close(
        again, plain, atol=0, rtol=0
    )  # a cached step's second pass sees the same masks
    assert plain_grads.keys() == checkpointed_grads.keys() and all("lora_" in n for n in plain_grads)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(checkpointed_grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_a_seed_fixes_the_initial_adapters_and_leaves_the_global_generator_alone(tiny_model_dir):
    first = adapter_weights(apply_lora(Encoder.load(tiny_model_dir), r=4, seed=3))
    state = torch.get_rng_state()
    second = adapter_weights(apply_lora(Encoder.load(tiny_model_dir), r=4, seed=3))
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(first[k], second[k]) for k in first)
    other = adapter_weights(apply_lora(Encoder.load(tiny_model_dir), r=4, seed=4))
    assert any(not torch.equal(first[k], other[k]) for k in first if "lora_A" in k)


def test_onnx_export_of_a_lora_folder_uses_the_merged_weights(tmp_path, tiny_encoder):
    pytest.importorskip("onnxruntime")
    from embforge.onnx.export import export_onnx
    from embforge.onnx.runtime import OnnxEncoder

    apply_lora(tiny_encoder, r=4)
    nonzero_adapters(tiny_encoder)
    expected = tiny_encoder.encode(TEXTS)
    tiny_encoder.save(tmp_path / "lora")
    report = export_onnx(tmp_path / "lora", tmp_path / "onnx", parity_texts=TEXTS)
    assert report["parity"]["fp32_min_cosine"] > 0.9999
    np.testing.assert_allclose(OnnxEncoder.load(tmp_path / "onnx").encode(TEXTS), expected, atol=1e-4)
