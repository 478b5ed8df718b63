"""Encoder: pooling, prompts, truncation, and sentence-transformers compatibility both ways."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embforge.encoder import Encoder
from embforge.modeling.pooling import pool
from tests.conftest import minilm_path, requires_minilm

TEXTS = [
    "a man plays the guitar",
    "a cat",
    "the stock market rises and oil price falls",
    "a child reads a book .",
]


def test_pooling_modes_by_hand():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]], [[5.0, 0.0], [7.0, -2.0], [1.0, 1.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.allclose(pool(hidden, mask, "mean"), torch.tensor([[2.0, 3.0], [13 / 3, -1 / 3]]))
    assert torch.equal(pool(hidden, mask, "cls"), torch.tensor([[1.0, 2.0], [5.0, 0.0]]))
    assert torch.equal(pool(hidden, mask, "max"), torch.tensor([[3.0, 4.0], [7.0, 1.0]]))
    assert torch.equal(pool(hidden, mask, "lasttoken"), torch.tensor([[3.0, 4.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="unknown pooling"):
        pool(hidden, mask, "median")


def test_encode_matches_single_padded_forward(tiny_encoder):
    """Length-sorted batching gives the same vectors as one forward over the whole padded batch."""
    tiny_encoder.eval()
    batch = tiny_encoder.tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = tiny_encoder(batch["input_ids"], batch["attention_mask"]).numpy()
    out = tiny_encoder.encode(TEXTS, batch_size=2)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    chunked = tiny_encoder.embed_ids(tiny_encoder.tokenize_ids(TEXTS), max_tokens=8).detach().numpy()
    np.testing.assert_allclose(chunked, ref, atol=1e-5)


def test_encode_normalize_dim_and_prompts(tiny_encoder):
    full = tiny_encoder.encode(TEXTS, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(full, axis=1), 1.0, atol=1e-5)
    cut = tiny_encoder.encode(TEXTS, normalize=True, dim=8)
    assert cut.shape == (4, 8)
    raw = tiny_encoder.encode(TEXTS, normalize=False)
    expected = raw[:, :8] / np.linalg.norm(raw[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, atol=1e-5)
    assert tiny_encoder.encode("a cat").shape == (tiny_encoder.dim,)
    tiny_encoder.prompts = {"query": "the "}
    np.testing.assert_allclose(
        tiny_encoder.encode(["cat"], prompt_name="query"), tiny_encoder.encode(["the cat"]), atol=1e-6
    )
    with pytest.raises(KeyError, match="unknown prompt name"):
        tiny_encoder.encode(["cat"], prompt_name="passage")
    with pytest.raises(ValueError, match="dim must be"):
        tiny_encoder.encode(["cat"], dim=1000)


@pytest.mark.parametrize("pooling", ["mean", "cls", "max", "lasttoken"])
def test_save_load_roundtrip_and_sentence_transformers_loads_it(tmp_path, tiny_encoder, pooling):
    st = pytest.importorskip("sentence_transformers")
    tiny_encoder.pooling = pooling
    tiny_encoder.normalize = pooling == "mean"
    tiny_encoder.prompts = {"query": "query: "}
    tiny_encoder.save(tmp_path / "m")
    ours = tiny_encoder.encode(TEXTS)
    again = Encoder.load(tmp_path / "m")
    assert (again.pooling, again.normalize, again.max_seq_length) == (pooling, pooling == "mean", 64)
    assert again.prompts == {"query": "query: "}
    np.testing.assert_allclose(again.encode(TEXTS), ours, atol=1e-6)
    peer = st.SentenceTransformer(str(tmp_path / "m"), device="cpu")
    assert np.abs(peer.encode(TEXTS) - ours).max() <= 1e-5


def test_plain_hf_folder_loads_with_mean_pooling(tmp_path, tiny_encoder):
    tiny_encoder.backbone.save_pretrained(tmp_path / "hf")
    tiny_encoder.tokenizer.save_pretrained(tmp_path / "hf")
    model = Encoder.load(tmp_path / "hf")
    assert (model.pooling, model.normalize) == ("mean", False)
    np.testing.assert_allclose(model.encode(TEXTS), tiny_encoder.encode(TEXTS), atol=1e-6)
    assert Encoder.load(tmp_path / "hf", pooling="cls", normalize=True).normalize is True


def test_unknown_model_and_module_errors(tmp_path, tiny_model_dir):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Encoder.load(tmp_path / "nope")
    modules = (tiny_model_dir / "modules.json").read_text()
    (tiny_model_dir / "modules.json").write_text(modules.replace("models.Pooling", "models.LSTM"))
    with pytest.raises(ValueError, match="not supported"):
        Encoder.load(tiny_model_dir)


@pytest.mark.integration
@requires_minilm
def test_minilm_embeddings_equal_sentence_transformers(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    path = minilm_path()
    ours = Encoder.load("all-MiniLM-L6-v2")
    peer = st.SentenceTransformer(str(path), device="cpu")
    assert (ours.pooling, ours.normalize, ours.max_seq_length) == ("mean", True, 256)
    assert np.abs(ours.encode(TEXTS) - peer.encode(TEXTS)).max() <= 1e-5
    # and a folder embforge writes loads in sentence-transformers with equal embeddings
    ours.save(tmp_path / "saved")
    reloaded = st.SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert np.abs(reloaded.encode(TEXTS) - ours.encode(TEXTS)).max() <= 1e-5


def test_encode_of_no_texts_is_an_empty_matrix(tiny_encoder):
    """A sharded job can hand a process no rows: encode([]) is a (0, dim) array, not a tokenizer crash."""
    out = tiny_encoder.encode([])
    assert out.shape == (0, tiny_encoder.dim) and out.dtype == np.float32
