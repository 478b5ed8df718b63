"""Hierarchical token pooling (embforge.multivector.pooling): its definition, parity with pylate and
sentence-transformers, the pooled index and encode, the CLI's --pool-factor, and pooling-aware training losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist

from embforge.data.retrieval import RetrievalData
from embforge.data.tables import read_table
from embforge.losses.late import (
    MaxSimInfoNCELoss,
    MaxSimKLDistillLoss,
    MaxSimMarginMSELoss,
    get_multivector_loss,
)
from embforge.multivector import MultiVectorEncoder
from embforge.multivector.evaluate import evaluate_multivector, multivector_run
from embforge.multivector.pooling import pool_documents, pool_padded, token_groups
from embforge.multivector.search import ExactMaxSimIndex, PooledIndex, create_multivector_index
from embforge.training.step import cached_step
from embforge.training.tasks import Task, prepare

ROOT = Path(__file__).resolve().parents[2]
PYLATE = ROOT / ".bench-venvs" / "pylate" / "bin" / "python"
QUERIES = ["a cat plays", "the dog runs in the park", "oil price falls"]
DOCS = [
    "a cat plays the piano in the hall every evening after dinner",
    "a dog runs, kicks a ball and chases the ball again!",
    "the stock market rises as oil prices fall",
    "oil price falls",
]


def documents(seed: int = 0) -> list[np.ndarray]:
    """Unit token vectors grouped around a few directions, as real token vectors are; lengths 1 to 120."""
    rng = np.random.default_rng(seed)
    out = []
    for tokens in (1, 2, 3, 5, 9, 31, 64, 120):
        centres = rng.standard_normal((6, 16))
        vectors = centres[rng.integers(0, 6, tokens)] + 0.3 * rng.standard_normal((tokens, 16))
        out.append((vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32))
    return out


def reference_pool(document: np.ndarray, factor: float) -> np.ndarray:
    """The definition, written again with SciPy's own cosine distance: [CLS] kept, Ward clusters of the rest
    cut at max(n // factor, 1), each cluster's mean in label order."""
    first, rest = document[:1], document[1:]
    clusters = max(int(len(rest) // factor), 1)
    if clusters >= len(rest):
        return document
    labels = fcluster(linkage(pdist(rest, "cosine"), method="ward"), t=clusters, criterion="maxclust")
    return np.vstack([first, *(rest[labels == label].mean(axis=0) for label in np.unique(labels))])


@pytest.mark.parametrize("factor", [1.5, 2, 3, 4])
def test_pooled_vectors_follow_the_definition(factor: float) -> None:
    docs = documents()
    pooled = pool_documents(docs, factor)
    for doc, ours in zip(docs, pooled):
        expected = reference_pool(doc, factor)
        assert ours.shape == expected.shape and ours.dtype == np.float32
        np.testing.assert_allclose(ours, expected, atol=1e-6)
    assert [len(m) for m in pooled[-3:]] == [
        1 + int(30 // factor),
        1 + int(63 // factor),
        1 + int(119 // factor),
    ]


def test_factor_one_and_short_documents_are_unchanged_bit_for_bit() -> None:
    docs = documents()
    assert all(a is b for a, b in zip(pool_documents(docs, 1), docs))
    short = pool_documents(docs[:3], 4)  # [CLS] + 0, 1 or 2 tokens: max(n // 4, 1) = 1 cluster
    assert [m is d for m, d in zip(short, docs)] == [True, True, False]  # 1 cluster of 1 token: unchanged
    assert len(short[2]) == 2  # the two tokens pool into one
    padded = torch.from_numpy(np.stack([docs[4], docs[4]]))
    assert pool_padded(padded, 1) is padded


def test_pooled_vectors_equal_sentence_transformers_bit_for_bit() -> None:
    pooling = pytest.importorskip("sentence_transformers.multi_vector_encoder.modules.token_pooling")
    docs = documents(1)
    for factor in (1.5, 2, 4):
        theirs = pooling.HierarchicalTokenPooling(factor, normalize_embeddings=False).pool(
            [torch.from_numpy(d) for d in docs]
        )
        for ours, other in zip(pool_documents(docs, factor), theirs):
            assert np.array_equal(ours, other.numpy())
        normalised = pooling.HierarchicalTokenPooling(factor).pool([torch.from_numpy(d) for d in docs])
        for ours, other in zip(pool_documents(docs, factor, normalize=True), normalised):
            np.testing.assert_allclose(ours, other.numpy(), atol=1e-7)


@pytest.mark.skipif(not PYLATE.exists(), reason="pylate's venv (.bench-venvs/pylate) is not installed")
def test_pooled_vectors_equal_pylates(tmp_path: Path) -> None:
    docs = documents(2)
    np.savez(tmp_path / "docs.npz", **{f"d{i}": d for i, d in enumerate(docs)})
    for factor in (2, 4):
        out = tmp_path / f"pylate-{factor}.npz"
        peer = ROOT / "tests" / "multivector" / "pylate_pooling_peer.py"
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        subprocess.run(
            [str(PYLATE), str(peer), str(tmp_path / "docs.npz"), str(factor), str(out)], check=True, env=env
        )
        theirs = np.load(out)
        for i, ours in enumerate(pool_documents(docs, factor)):
            np.testing.assert_array_equal(ours, theirs[f"d{i}"])


def masked_batch(seed: int = 3) -> torch.Tensor:
    """(4, 40, 16) zero-padded matrices with masked (zero) rows inside, as the model's forward gives them."""
    docs = documents(seed)[3:7]  # 5, 9, 31 and 64 tokens: cut at 40
    out = torch.zeros(4, 40, 16)
    for row, doc in enumerate(docs):
        kept = torch.from_numpy(doc[:30])
        places = torch.arange(len(kept)) + torch.arange(len(kept)) // 4  # every fifth row masked
        out[row, places] = kept
    return out


def test_padded_pooling_equals_the_index_time_pooling_and_passes_gradients() -> None:
    matrices = masked_batch().requires_grad_()
    pooled = pool_padded(matrices, 3)
    kept = [m[(m != 0).any(-1)].detach().numpy() for m in matrices]
    expected = pool_documents(kept, 3)
    assert pooled.shape[1] == max(len(e) for e in expected) < matrices.shape[1]
    for row, want in zip(pooled, expected):
        np.testing.assert_array_equal(row[: len(want)].detach().numpy(), want)
        assert not row[len(want) :].any()
    with torch.autocast(
        "cpu", dtype=torch.bfloat16
    ):  # a mixed-precision training step clusters in float32 too
        assert torch.equal(pool_padded(matrices, 3), pooled)
    pooled.sum().backward()
    # d(sum of the means)/d(member) = 1 / the size of its cluster; masked rows get nothing
    for matrix, grad, vectors in zip(matrices, matrices.grad, kept):
        groups = token_groups(vectors, 3)
        sizes = np.bincount(groups)[groups].astype(np.float32)
        on = (matrix != 0).any(-1)
        np.testing.assert_allclose(grad[on].numpy(), np.repeat(1 / sizes[:, None], 16, axis=1), rtol=1e-6)
        assert not grad[~on].any()


@pytest.mark.parametrize("loss_class", [MaxSimInfoNCELoss, MaxSimMarginMSELoss, MaxSimKLDistillLoss])
def test_pooling_aware_losses(loss_class: type) -> None:
    torch.manual_seed(4)
    q = torch.nn.functional.normalize(torch.randn(4, 6, 16), dim=-1)
    p, n = masked_batch(3), masked_batch(5)
    teacher = torch.tensor([[3.0, 1.0]] * 4)
    plain = loss_class()([q, p, n], teacher)
    assert torch.equal(loss_class(pool_factor=1)([q, p, n], teacher), plain)
    p.requires_grad_()
    pooled = loss_class(pool_factor=4)([q, p, n], teacher)
    expected = loss_class()([q, pool_padded(p, 4), pool_padded(n, 4)], teacher)
    assert torch.equal(pooled, expected) and not torch.equal(pooled, plain)
    pooled.backward()
    assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    assert get_multivector_loss(loss_class.name, pool_factor=4).pool_factor == 4.0
    with pytest.raises(ValueError, match="pool_factor must be a finite number >= 1"):
        get_multivector_loss(loss_class.name, pool_factor=0.5)


@pytest.fixture
def colbert(tiny_model_dir: Path) -> MultiVectorEncoder:
    torch.manual_seed(0)
    model = MultiVectorEncoder.load(tiny_model_dir, dim=16)
    model.settings.query_length, model.settings.document_length = 8, 24
    return model


def _pairs(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.jsonl"
    rows = [{"anchor": q, "positive": d} for q, d in zip(QUERIES, DOCS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_pooling_aware_training_reaches_the_model_and_the_cached_step_agrees(
    colbert: MultiVectorEncoder, tmp_path: Path
) -> None:
    task = prepare(Task("pairs", read_table(_pairs(tmp_path)), MaxSimInfoNCELoss(pool_factor=2)), colbert)
    rows = list(range(3))
    colbert.train()

    def grads(cached: bool) -> tuple[float, list[torch.Tensor]]:
        colbert.zero_grad()
        if cached:
            loss = cached_step(
                colbert,
                task,
                rows,
                mini_batch_size=2,
                max_tokens=64,
                dropout_seed=7,
                backward=lambda x: x.backward(),
            )
        else:
            loss = task.loss_fn(colbert(task.inputs(rows), max_tokens=64, dropout_seed=7), task.labels(rows))
            loss.backward()
        return float(loss.detach()), [p.grad.clone() for p in colbert.parameters() if p.grad is not None]

    plain_loss, plain = grads(False)
    cached_loss, cached = grads(True)
    assert colbert.projection.linear.weight.grad.abs().sum() > 0
    assert abs(plain_loss - cached_loss) < 1e-5
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(plain, cached))


def test_encode_and_the_pooled_index(colbert: MultiVectorEncoder) -> None:
    docs = colbert.encode(DOCS)
    pooled = colbert.encode(DOCS, pool_factor=2)
    for ours, want in zip(pooled, pool_documents(docs, 2)):
        np.testing.assert_array_equal(ours, want)
    assert sum(map(len, pooled)) < sum(map(len, docs))
    with pytest.raises(ValueError, match="queries are not pooled"):
        colbert.encode(QUERIES, is_query=True, pool_factor=2)
    queries = colbert.encode(QUERIES, is_query=True)
    ids = [f"d{i}" for i in range(len(DOCS))]
    index = create_multivector_index("exact", pool_factor=2)
    assert isinstance(index, PooledIndex)
    index.add(ids, docs)
    reference = ExactMaxSimIndex()
    reference.add(ids, pooled)
    ours, theirs = index.search(queries, 3), reference.search(queries, 3)
    np.testing.assert_array_equal(ours[0], theirs[0])
    assert ours[1] == theirs[1] and index.vectors == sum(map(len, pooled))
    assert isinstance(create_multivector_index("exact", pool_factor=1), ExactMaxSimIndex)
    data = RetrievalData(ids, DOCS, ["q0"], QUERIES[:1], {"q0": {"d0": 1}})
    with pytest.raises(ValueError, match=r"index options \(pool_factor\) apply to a full search"):
        multivector_run(colbert, data, candidates={"q0": {"d0": 0.0}}, index_options={"pool_factor": 2})
    with pytest.raises(ValueError, match="takes no options besides pool_factor"):
        create_multivector_index("exact", nbits=2)


def test_cli_eval_pools_a_colbert_models_documents(
    colbert: MultiVectorEncoder, tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    from embforge.cli import main

    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    corpus = "".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(DOCS))
    (beir / "corpus.jsonl").write_text(corpus)
    queries = "".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(QUERIES))
    (beir / "queries.jsonl").write_text(queries)
    qrels = "".join(f"q{i}\td{i}\t1\n" for i in range(len(QUERIES)))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    colbert.save(tmp_path / "colbert")
    train = [
        "train",
        "--model-type",
        "multivector",
        "--model",
        str(tiny_model_dir),
        "--train",
        str(_pairs(tmp_path)),
    ]
    pooled_training = ["--loss-option", "pool_factor=2", "--max-steps", "1", "--batch-size", "3", "--quiet"]
    assert main([*train, *pooled_training, "--output", str(tmp_path / "trained")]) == 0
    assert main([*train, "--loss-option", "pool_factor=0", "--output", str(tmp_path / "no")]) == 2
    assert "pool_factor must be a finite number >= 1" in capsys.readouterr().err
    flags = ["eval", "retrieval", "--data", str(beir), "--split", "test", "--metrics", "ndcg@10,mrr@10"]
    capsys.readouterr()
    assert main([*flags, "--model", str(tmp_path / "colbert"), "--pool-factor", "4"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    data = RetrievalData(
        doc_ids=[f"d{i}" for i in range(len(DOCS))],
        doc_texts=DOCS,
        query_ids=[f"q{i}" for i in range(len(QUERIES))],
        query_texts=QUERIES,
        qrels={f"q{i}": {f"d{i}": 1} for i in range(len(QUERIES))},
    )
    loaded = MultiVectorEncoder.load(tmp_path / "colbert")
    pooled = evaluate_multivector(
        loaded, data, metrics=["ndcg@10", "mrr@10"], index_options={"pool_factor": 4}
    )
    assert printed["ndcg@10"] == pytest.approx(pooled["ndcg@10"]) and printed["mrr@10"] == pytest.approx(
        pooled["mrr@10"]
    )
    assert main([*flags, "--model", str(tiny_model_dir), "--pool-factor", "2"]) == 2
    assert "--pool-factor pools a multi-vector model's token vectors" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse refuses it
        main([*flags, "--model", str(tmp_path / "colbert"), "--pool-factor", "0.5"])
    assert "--pool-factor: must be a finite number >= 1, got 0.5" in capsys.readouterr().err


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_the_server_pools_the_documents_it_indexes(colbert: MultiVectorEncoder) -> None:
    """``embforge serve --index-option pool_factor=2`` pools each document added with ``/index/documents``, as
    ``eval retrieval --pool-factor`` and the pooled index do (it was dropped before: the server kept every token
    vector); an option the in-memory index does not take is refused, naming it."""
    from fastapi.testclient import TestClient

    from embforge.serve.app import create_app

    ids = [f"d{i}" for i in range(len(DOCS))]
    reference = create_multivector_index("exact", pool_factor=2)
    reference.add(ids, colbert.encode(DOCS))
    scores, found = reference.search(colbert.encode(QUERIES, is_query=True), 3)
    app = create_app({"colbert": colbert}, index_options={"pool_factor": 2})
    with TestClient(app) as client:
        documents = [{"id": i, "text": t} for i, t in zip(ids, DOCS)]
        assert client.post("/index/documents", json={"documents": documents}).status_code == 200
        results = client.post("/search", json={"query": QUERIES, "top_k": 3}).json()["results"]
        kept = app.state.store.index.index.vectors  # the token vectors the index holds: pooled ones
    assert [[hit["id"] for hit in result["hits"]] for result in results] == found
    got = np.array([[hit["score"] for hit in result["hits"]] for result in results])
    np.testing.assert_allclose(got, scores, atol=1e-4)
    assert kept == reference.vectors
    with pytest.raises(ValueError, match="nbits"):
        create_app({"colbert": colbert}, index_options={"nbits": 2})
