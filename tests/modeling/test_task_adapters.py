"""Task adapters: named LoRA adapters on one frozen backbone, saved in one folder, chosen by ``encode(task=...)``;
the base and each adapter give PEFT's own vectors (the saved folder loaded with peft directly)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from embforge.encoder import Encoder
from embforge.modeling.adapters import active_task, add_task_adapter, using_task
from embforge.modeling.lora import LoraConfig, merge_lora, trainable_parameters

peft = pytest.importorskip("peft")

TEXTS = ["a man plays the guitar", "the cat", "a woman is reading a book in the park", "dog runs", "a"]


def nonzero(model: nn.Module, task: str, seed: int) -> None:
    """peft starts B at zero (the adapter equals the base); give the task's B matrices random values."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if f"lora_B.{task}." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


@pytest.fixture
def adapters_dir(tmp_path, tiny_encoder):
    """A folder with two task adapters (different ranks and targets) on the tiny model (saved plain beside it)."""
    tiny_encoder.save(tmp_path / "plain")
    add_task_adapter(tiny_encoder, "retrieval", r=4, seed=1)
    nonzero(tiny_encoder, "retrieval", 1)
    add_task_adapter(tiny_encoder, "similarity", r=8, targets="query,value", seed=2)
    nonzero(tiny_encoder, "similarity", 2)
    tiny_encoder.save(tmp_path / "tasks")
    return tmp_path / "tasks"


def peft_reference(folder, task: str | None) -> np.ndarray:
    """Mean-pooled vectors of ``TEXTS`` from the folder's base weights and its adapters loaded by peft itself."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    base = AutoModel.from_pretrained(folder)
    model = peft.PeftModel.from_pretrained(
        base, str(folder / "adapters" / "retrieval"), adapter_name="retrieval"
    )
    model.load_adapter(str(folder / "adapters" / "similarity"), adapter_name="similarity")
    model.eval()
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        if task is None:
            with model.disable_adapter():
                hidden = model(**batch).last_hidden_state
        else:
            model.set_adapter(task)
            hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return ((hidden * mask).sum(1) / mask.sum(1)).numpy()


def test_the_folder_is_peft_layout_and_lists_the_tasks(adapters_dir):
    for task in ("retrieval", "similarity"):
        assert (adapters_dir / "adapters" / task / "adapter_config.json").is_file()
        assert (adapters_dir / "adapters" / task / "adapter_model.safetensors").is_file()
    assert not (adapters_dir / "adapter").exists()
    config = json.loads((adapters_dir / "config_sentence_transformers.json").read_text())
    assert config["tasks"] == {"retrieval": "adapters/retrieval", "similarity": "adapters/similarity"}
    assert (
        json.loads((adapters_dir / "adapters" / "similarity" / "adapter_config.json").read_text())["r"] == 8
    )


@pytest.mark.parametrize("task", [None, "retrieval", "similarity"])
def test_the_base_and_each_adapter_equal_peft(adapters_dir, task):
    model = Encoder.load(adapters_dir)
    assert model.tasks == ["retrieval", "similarity"]
    ours = model.encode(TEXTS, task=task, batch_size=2)
    np.testing.assert_allclose(ours, peft_reference(adapters_dir, task), atol=1e-6, rtol=0)


def test_the_tasks_differ_and_the_base_is_the_untouched_backbone(adapters_dir, tmp_path):
    model = Encoder.load(adapters_dir)
    vectors = {task: model.encode(TEXTS, task=task) for task in (None, "retrieval", "similarity")}
    assert np.abs(vectors["retrieval"] - vectors[None]).max() > 1e-2
    assert np.abs(vectors["similarity"] - vectors["retrieval"]).max() > 1e-2
    plain = Encoder.load(tmp_path / "plain")
    np.testing.assert_allclose(
        plain.encode(TEXTS), vectors[None], atol=1e-6, rtol=0
    )  # task=None after loading: the base
    assert active_task(model.backbone) is None  # encode(task=...) left the adapters off


def test_save_load_round_trip(adapters_dir, tmp_path):
    model = Encoder.load(adapters_dir)
    model.save(tmp_path / "again")
    again = Encoder.load(tmp_path / "again")
    assert again.tasks == model.tasks
    for task in (None, "retrieval", "similarity"):
        assert np.array_equal(again.encode(TEXTS, task=task), model.encode(TEXTS, task=task)), task


def test_an_unknown_task_is_a_clear_error(adapters_dir, tmp_path):
    with pytest.raises(
        ValueError, match=r"unknown task 'classification': this model's tasks are retrieval, "
    ):
        Encoder.load(adapters_dir).encode(TEXTS, task="classification")
    with pytest.raises(ValueError, match="this model has no task adapters"):
        Encoder.load(tmp_path / "plain").encode(TEXTS, task="retrieval")


def test_a_new_adapter_trains_alone_and_encode_without_task_uses_it(adapters_dir):
    model = Encoder.load(adapters_dir)
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    add_task_adapter(model, "classification", r=2, seed=3)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".classification." in name for name in trainable)
    assert trainable_parameters(model)[0] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    nonzero(model, "classification", 3)
    assert active_task(model.backbone) == "classification"  # the trainer's forward and evaluation use it
    assert np.array_equal(model.encode(TEXTS), model.encode(TEXTS, task="classification"))
    before = [p.requires_grad for p in model.parameters()]
    model.encode(TEXTS, task="retrieval")  # another task for a moment, then as it was
    assert [p.requires_grad for p in model.parameters()] == before
    assert active_task(model.backbone) == "classification"
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in frozen.items())  # the others untouched


def test_using_task_switches_back_on_error(adapters_dir):
    model = Encoder.load(adapters_dir)
    with pytest.raises(RuntimeError), using_task(model, "retrieval"):
        assert active_task(model.backbone) == "retrieval"
        raise RuntimeError
    assert active_task(model.backbone) is None


def test_refusals(adapters_dir, tmp_path, tiny_cross_encoder):
    with pytest.raises(ValueError, match="task adapters"):
        merge_lora(Encoder.load(adapters_dir))
    with pytest.raises(ValueError, match="not 'default'"):
        add_task_adapter(Encoder.load(tmp_path / "plain"), "default", r=2)
    with pytest.raises(ValueError, match="adapter name 'a b'"):
        LoraConfig(r=2, adapter_name="a b")
    with pytest.raises(ValueError, match="drop --merge-lora"):
        LoraConfig(r=2, adapter_name="retrieval", merge=True)
    with pytest.raises(ValueError, match="dense bi-encoders"):
        add_task_adapter(tiny_cross_encoder, "retrieval", r=2)  # type: ignore[arg-type]


def test_train_adds_one_task_at_a_time(tmp_path, tiny_model_dir, capsys):
    from safetensors.torch import load_file

    from embforge.cli import main

    rng = np.random.default_rng(0)
    rows = [
        {"sentence1": TEXTS[i % 5], "sentence2": TEXTS[(i * 3 + 1) % 5], "score": float(rng.uniform(0, 5))}
        for i in range(40)
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def train(model, name: str, output) -> None:
        args = ["train", "--model", str(model), "--train", str(data), "--loss", "cosent", "--lora-r", "4"]
        args += ["--adapter-name", name, "--max-steps", "3", "--batch-size", "8", "--lr", "1e-2", "--quiet"]
        assert main([*args, "--output", str(output), "--device", "cpu", "--save-every", "0"]) == 0

    train(tiny_model_dir, "similarity", tmp_path / "one")
    train(tmp_path / "one", "retrieval", tmp_path / "two")
    model = Encoder.load(tmp_path / "two")
    assert model.tasks == ["similarity", "retrieval"]
    weights = "adapters/similarity/adapter_model.safetensors"
    first, second = load_file(tmp_path / "one" / weights), load_file(tmp_path / "two" / weights)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)  # frozen
    base = Encoder.load(tiny_model_dir).encode(TEXTS)
    np.testing.assert_allclose(model.encode(TEXTS), base, atol=1e-6, rtol=0)  # the backbone stayed frozen
    for task in model.tasks:
        assert np.abs(model.encode(TEXTS, task=task) - base).max() > 1e-4, task
    capsys.readouterr()
    assert main(["train", "--model", str(tiny_model_dir), "--train", str(data), "--adapter-name", "x"]) != 0
    assert "--adapter-name x needs --lora-r" in capsys.readouterr().err
