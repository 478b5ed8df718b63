"""Sparse (SPLADE) models: parity with sentence-transformers' SparseEncoder (vectors both ways, SpladeLoss), the
inverted index, sparsity statistics, and a tiny training run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from tests.conftest import make_tokenizer

st = pytest.importorskip("sentence_transformers")

TEXTS = ["a cat runs in the park", "the dog", "a man plays the guitar .", "oil price falls", "a red car"]


def make_mlm(seed: int = 0):
    from transformers import BertConfig, BertForMaskedLM

    tokenizer = make_tokenizer()
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return BertForMaskedLM(config), tokenizer


@pytest.fixture
def mlm_dir(tmp_path: Path) -> Path:
    model, tokenizer = make_mlm()
    path = tmp_path / "mlm"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def st_splade(mlm_dir: Path, *, inference_free: bool = False):
    from sentence_transformers import SparseEncoder as STSparseEncoder
    from sentence_transformers.base.modules import Router
    from sentence_transformers.sparse_encoder.modules import (
        MLMTransformer,
        SparseStaticEmbedding,
        SpladePooling,
    )

    document = [MLMTransformer(str(mlm_dir)), SpladePooling("max")]
    if not inference_free:
        return STSparseEncoder(modules=document)
    torch.manual_seed(1)
    weight = torch.rand(len(document[0].tokenizer.get_vocab())) * 2
    query = SparseStaticEmbedding(tokenizer=document[0].tokenizer, weight=weight)
    router = Router.for_query_document(query_modules=[query], document_modules=document)
    return STSparseEncoder(modules=[router], similarity_fn_name="dot")


def dense(x) -> np.ndarray:
    return x.to_dense().numpy() if isinstance(x, torch.Tensor) else x.toarray()


@pytest.mark.parametrize("inference_free", [False, True])
def test_sentence_transformers_folders_load_with_equal_vectors_both_ways(mlm_dir, tmp_path, inference_free):
    from sentence_transformers import SparseEncoder as STSparseEncoder

    from embforge.kinds import ModelKind, folder_kind, load_any
    from embforge.sparse.model import SparseEncoder

    reference = st_splade(mlm_dir, inference_free=inference_free)
    reference.save(str(tmp_path / "st"))
    assert folder_kind(tmp_path / "st") is ModelKind.SPARSE
    ours = load_any(tmp_path / "st")
    assert isinstance(ours, SparseEncoder) and ours.inference_free == inference_free
    for mine, theirs in (
        (ours.encode_document(TEXTS), reference.encode_document(TEXTS)),
        (ours.encode_query(TEXTS), reference.encode_query(TEXTS)),
    ):
        assert np.abs(mine.toarray() - dense(theirs)).max() <= 1e-5
    if inference_free:  # the query table is a lookup: vectors hold the query's own tokens only
        assert set(ours.encode_query("a cat").indices) == set(
            ours.tokenizer("a cat", add_special_tokens=False)["input_ids"]
        )
    with torch.no_grad():  # a change that only a correct save carries back
        for p in ours.parameters():
            p.mul_(1.5)
    ours.save(tmp_path / "ours")
    back = STSparseEncoder(str(tmp_path / "ours"))
    assert np.abs(ours.encode_document(TEXTS).toarray() - dense(back.encode_document(TEXTS))).max() <= 1e-5
    assert np.abs(ours.encode_query(TEXTS).toarray() - dense(back.encode_query(TEXTS))).max() <= 1e-5


def test_plain_mlm_folder_loads_with_splade_defaults(mlm_dir):
    from embforge.sparse.model import SparseEncoder

    model = SparseEncoder.load(mlm_dir)
    assert (model.pooling, model.activation, model.dim, model.inference_free) == ("max", "relu", 62, False)
    vectors = model.encode(TEXTS)
    assert isinstance(vectors, sp.csr_matrix) and vectors.shape == (5, 62)
    assert (vectors.data > 0).all()  # only active dimensions stored
    assert SparseEncoder.load(mlm_dir, inference_free=True).inference_free


def test_splade_loss_equals_sentence_transformers(mlm_dir):
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss
    from sentence_transformers.sparse_encoder.losses import SpladeLoss as STSpladeLoss

    from embforge.losses import get_loss
    from embforge.sparse.model import SparseEncoder

    reference = st_splade(mlm_dir).eval()
    columns = [TEXTS[:3], TEXTS[2:], ["a blue house", "the sky", "music"]]
    st_loss = STSpladeLoss(
        reference,
        SparseMultipleNegativesRankingLoss(reference, scale=0.5),
        document_regularizer_weight=0.03,
        query_regularizer_weight=0.05,
    )
    features = [reference.preprocess(col) for col in columns]
    expected = sum(st_loss(features, None).values())

    ours = SparseEncoder.load(mlm_dir).eval()
    loss = get_loss("splade", scale=0.5, query_weight=0.05, document_weight=0.03)
    value = loss([ours(ours.tokenize_ids(col)) for col in columns], None)
    assert float(value) == pytest.approx(float(expected), rel=1e-5)
    assert set(loss.terms) == {"ranking", "query_flops", "document_flops"}


def test_splade_loss_warms_the_regularisers_up_quadratically():
    from embforge.losses.splade import SpladeLoss

    loss = SpladeLoss(query_weight=1.0, document_weight=1.0, warmup_steps=4)
    q, d = torch.rand(3, 10), torch.rand(3, 10)
    values = [float(loss([q, d])) for _ in range(6)]
    ranking = float(loss.terms["ranking"])
    regularisers = float(loss.terms["query_flops"] + loss.terms["document_flops"])
    assert values == pytest.approx([ranking + f * regularisers for f in (0, 1 / 16, 4 / 16, 9 / 16, 1, 1)])


def test_inverted_index_top10_equals_a_dense_product(mlm_dir):
    from embforge.sparse.index import SparseIndex
    from embforge.sparse.model import SparseEncoder

    model = SparseEncoder.load(mlm_dir)
    rng = np.random.default_rng(0)
    from tests.conftest import WORDS

    docs = [" ".join(rng.choice(WORDS, size=rng.integers(2, 12))) for _ in range(60)]
    queries = [" ".join(rng.choice(WORDS, size=3)) for _ in range(9)]
    doc_vectors, query_vectors = model.encode_document(docs), model.encode_query(queries)
    index = SparseIndex(model.dim)
    index.add([f"d{i}" for i in range(30)], doc_vectors[:30])
    index.add([f"d{i}" for i in range(30, 60)], doc_vectors[30:])
    scores, positions = index.search(query_vectors, k=10)
    full = query_vectors.toarray() @ doc_vectors.toarray().T
    expected = np.argsort(-full, axis=1, kind="stable")[:, :10]
    assert np.allclose(scores, np.take_along_axis(full, expected, axis=1), atol=1e-4)
    assert (positions == expected).mean() > 0.98  # ties aside, the same documents in the same order
    assert np.allclose(np.take_along_axis(full, positions, axis=1), scores, atol=1e-4)


def test_sparsity_stats_count_active_dimensions():
    from embforge.sparse.stats import sparsity_stats

    stats = sparsity_stats(sp.csr_matrix(np.array([[0, 1.0, 2.0, 0], [3.0, 0, 0, 0], [0, 0, 0, 0]])))
    assert stats["active_dims_mean"] == 1.0 and stats["active_dims_max"] == 2.0
    assert stats["sparsity"] == pytest.approx(0.75)
