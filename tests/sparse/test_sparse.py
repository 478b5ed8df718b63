"""Sparse (SPLADE) models: parity with sentence-transformers' SparseEncoder (vectors both ways, SpladeLoss), the
inverted index, sparsity statistics, and a tiny training run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from tests.conftest import make_tokenizer, tiny_bert_config

st = pytest.importorskip("sentence_transformers")

TEXTS = ["a cat runs in the park", "the dog", "a man plays the guitar .", "oil price falls", "a red car"]


def make_mlm(seed: int = 0):
    from transformers import BertForMaskedLM

    tokenizer = make_tokenizer()
    torch.manual_seed(seed)
    config = tiny_bert_config(len(tokenizer))
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


@pytest.mark.parametrize("route", [False, True])
def test_a_module_path_outside_the_folder_is_refused(mlm_dir, tmp_path, route):
    """modules.json (and a Router's routes) may not send the loader to files elsewhere on the machine."""
    from embforge.sparse.folder import ST_MLM, ST_ROUTER
    from embforge.sparse.model import SparseEncoder

    folder = tmp_path / "downloaded"
    folder.mkdir()
    module = {
        "idx": 0,
        "name": "0",
        "path": "" if route else "../mlm",
        "type": ST_ROUTER if route else ST_MLM,
    }
    (folder / "modules.json").write_text(json.dumps([module]))
    if route:
        config = {"types": {"../mlm": ST_MLM}, "structure": {"query": [], "document": ["../mlm"]}}
        (folder / "router_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"'\.\./mlm' points outside the model folder"):
        SparseEncoder.load(folder)


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
    assert (positions == expected).all()  # the same documents in the same order
    assert np.allclose(np.take_along_axis(full, positions, axis=1), scores, atol=1e-4)


def test_sparsity_stats_count_active_dimensions():
    from embforge.sparse.stats import sparsity_stats

    stats = sparsity_stats(sp.csr_matrix(np.array([[0, 1.0, 2.0, 0], [3.0, 0, 0, 0], [0, 0, 0, 0]])))
    assert stats["active_dims_mean"] == 1.0 and stats["active_dims_max"] == 2.0
    assert stats["sparsity"] == pytest.approx(0.75)


def _pairs_file(tmp_path: Path) -> Path:
    import json

    from tests.conftest import STS_ROWS

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"anchor": a, "positive": b}) + "\n" for a, b, _ in STS_ROWS))
    return path


def _terms(model, loss, pairs: Path) -> dict[str, float]:
    from embforge.data.tables import read_table

    data = read_table(pairs)
    model.eval()
    loss.eval()
    with torch.no_grad():
        ids = [model.tokenize_ids(data.columns[c], is_query=i == 0) for i, c in enumerate(data.text_columns)]
        loss([model(x) for x in ids], None)
    return {k: float(v) for k, v in loss.terms.items()}


@pytest.mark.parametrize("inference_free", [False, True])
def test_a_tiny_splade_run_lowers_the_flops_term_and_the_ranking_loss(mlm_dir, tmp_path, inference_free):
    from embforge.cli import main
    from embforge.losses.splade import SpladeLoss
    from embforge.sparse.model import SparseEncoder

    start = SparseEncoder.load(mlm_dir, inference_free=inference_free)
    start.save(tmp_path / "start")
    pairs = _pairs_file(tmp_path)
    weights = {"query_weight": 0.0 if inference_free else 0.1, "document_weight": 0.1}
    options = [f"--loss-option={k}={v}" for k, v in weights.items()] + ["--loss-option=warmup_steps=5"]
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--model",
            str(tmp_path / "start"),
            "--model-type",
            "sparse",
            "--loss",
            "splade",
            *options,
            "--train",
            str(pairs),
            "--epochs",
            "12",
            "--batch-size",
            "4",
            "--lr",
            "2e-3",
            "--output",
            str(out),
            "--save-every",
            "0",
            "--quiet",
        ]
    )
    assert code == 0
    trained = SparseEncoder.load(out)
    assert trained.inference_free == inference_free
    before = _terms(SparseEncoder.load(tmp_path / "start"), SpladeLoss(**weights), pairs)
    after = _terms(trained, SpladeLoss(**weights), pairs)
    assert after["ranking"] < before["ranking"]
    assert after["document_flops"] < before["document_flops"]
    if inference_free:  # the query table trained too
        assert not torch.equal(trained.query_weights, start.query_weights)


def _beir(tmp_path: Path) -> Path:
    import json

    from tests.conftest import STS_ROWS

    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    docs = [b for _, b, _ in STS_ROWS]
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs))
    )
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": a}) + "\n" for i, (a, _, _) in enumerate(STS_ROWS))
    )
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(STS_ROWS)))
    )
    return root


def test_sparse_train_evaluate_save_load_in_sentence_transformers_and_serve(mlm_dir, tmp_path, capsys):
    import json

    from fastapi.testclient import TestClient
    from sentence_transformers import SparseEncoder as STSparseEncoder

    from embforge.cli import main
    from embforge.kinds import load_any
    from embforge.serve.app import create_app

    out = tmp_path / "run"
    train = ["train", "--model", str(mlm_dir), "--model-type", "sparse", "--loss", "splade"]
    train += [
        "--train",
        str(_pairs_file(tmp_path)),
        "--max-steps",
        "2",
        "--batch-size",
        "4",
        "--output",
        str(out),
    ]
    assert main([*train, "--save-every", "0", "--quiet"]) == 0
    capsys.readouterr()
    assert (
        main(["eval", "retrieval", "--model", str(out), "--data", str(_beir(tmp_path)), "--split", "test"])
        == 0
    )
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= metrics["ndcg@10"] <= 100 and 0 < metrics["document_active_dims"] <= 62
    model = load_any(out)
    peer = STSparseEncoder(str(out))
    assert np.abs(model.encode_document(TEXTS).toarray() - dense(peer.encode_document(TEXTS))).max() <= 1e-5
    card = (out / "README.md").read_text()
    assert "sparse encoder (SPLADE)" in card and "SparseEncoder.load" in card

    with TestClient(create_app({"splade": model})) as client:  # as the runner passes it: a one-model mapping
        assert client.get("/v1/models").json()["data"][0] == {
            "id": "splade",
            "object": "model",
            "owned_by": "embforge",
            "backend": "torch",
            "precision": "fp32",
            "kind": "sparse",
            "dim": 62,
        }
        body = client.post("/v1/embeddings", json={"input": TEXTS[:2], "input_type": "query"}).json()
        expected = model.encode_query(TEXTS[:2])
        for item, row in zip(body["data"], expected):
            assert item["embedding"]["indices"] == sorted(row.indices.tolist())
            assert np.allclose(item["embedding"]["values"], row.toarray()[0, item["embedding"]["indices"]])
        docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)]
        assert client.post("/index/documents", json={"documents": docs}).json()["total"] == 5
        hits = client.post("/search", json={"query": TEXTS[1], "top_k": 3}).json()["results"][0]["hits"]
        scores = (model.encode_query([TEXTS[1]]) @ model.encode_document(TEXTS).T).toarray()[0]
        assert [h["id"] for h in hits] == [f"d{i}" for i in np.argsort(-scores, kind="stable")[:3]]
        assert client.post("/v1/embeddings", json={"input": [" "]}).status_code == 422


def test_sparse_models_are_refused_clearly_by_export_and_merge_as_sparse(mlm_dir, tmp_path):
    from embforge.merge import Merger
    from embforge.onnx.export import export_onnx
    from embforge.sparse.model import SparseEncoder

    SparseEncoder.load(mlm_dir).save(tmp_path / "splade")
    with pytest.raises(ValueError, match="sparse \\(SPLADE\\) model: embforge has no ONNX export"):
        export_onnx(tmp_path / "splade", tmp_path / "onnx")
    assert isinstance(Merger([tmp_path / "splade", tmp_path / "splade"]).merge(), SparseEncoder)  # #52


def test_encode_cli_refuses_a_sparse_model_clearly(mlm_dir, tmp_path, capsys):
    from embforge.cli import main
    from embforge.sparse.model import SparseEncoder

    SparseEncoder.load(mlm_dir).save(tmp_path / "splade")
    texts = tmp_path / "texts.txt"
    texts.write_text("a cat\n")
    assert (
        main(["encode", "--model", str(tmp_path / "splade"), "--input", str(texts), "--output", "x.npy"]) == 2
    )
    assert "is a sparse model; embforge encode writes one dense vector" in capsys.readouterr().err


@pytest.mark.parametrize("inference_free", [False, True])
def test_cached_step_equals_the_plain_step_for_splade(inference_free):
    from embforge.losses import get_loss
    from embforge.sparse.model import SparseEncoder
    from embforge.training.tasks import Task
    from tests.training.test_cached_step import assert_same, dataset, plain_and_cached, texts

    mlm, tokenizer = make_mlm()
    mlm.config.hidden_dropout_prob = mlm.config.attention_probs_dropout_prob = (
        0.0  # the padded path seeds per chunk
    )
    for module in mlm.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    weights = torch.rand(len(tokenizer)) if inference_free else None
    model = SparseEncoder(mlm, tokenizer, max_seq_length=32, query_weights=weights)
    data = dataset({"anchor": texts(10, 1), "positive": texts(10, 2), "negative": texts(10, 3)})
    task = Task("t", data, get_loss("splade", query_weight=0.1, document_weight=0.05))
    plain, cached = plain_and_cached(model, task, list(range(10)), mini_batch_size=4)
    assert_same(plain, cached)
    assert ("query_weights" in plain[1]) == inference_free  # queries went through the table


def test_retrieval_training_of_a_sparse_model_mines_with_bm25_or_says_so(mlm_dir, tmp_path, capsys):
    from embforge.cli import main

    beir = _beir(tmp_path)
    (beir / "qrels" / "train.tsv").write_text((beir / "qrels" / "test.tsv").read_text())
    args = ["train", "--model", str(mlm_dir), "--model-type", "sparse", "--retrieval-train", str(beir)]
    args += [
        "--retrieval-eval-split",
        "test",
        "--max-steps",
        "2",
        "--batch-size",
        "4",
        "--save-every",
        "0",
        "--quiet",
    ]
    assert main([*args, "--output", str(tmp_path / "dense-mined")]) == 2
    assert (
        "a sparse model does not mine its own negatives yet: use --mine-method bm25"
        in capsys.readouterr().err
    )
    assert main([*args, "--mine-method", "bm25", "--output", str(tmp_path / "bm25-mined")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["final"]["document_active_dims"] > 0


def test_a_sparse_model_is_served_beside_dense_ones_and_refuses_an_index_folder(mlm_dir, tiny_encoder):
    """One app serves every kind: a sparse model beside a dense one answers in its own shape; an --index folder
    (one dense vector per document) is refused for it by name."""
    from fastapi.testclient import TestClient

    from embforge.serve.app import create_app
    from embforge.serve.store import DocumentStore
    from embforge.sparse.model import SparseEncoder

    splade = SparseEncoder.load(mlm_dir)
    with TestClient(create_app({"dense": tiny_encoder, "splade": splade})) as client:
        body = client.post("/v1/embeddings", json={"input": "a cat", "model": "splade"}).json()
        assert body["data"][0]["embedding"]["dim"] == splade.dim
    with pytest.raises(ValueError, match="serve it without --index"):
        create_app({"splade": splade}, store=DocumentStore(4))
