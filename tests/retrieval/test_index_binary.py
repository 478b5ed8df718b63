"""The binary index: sign-bit candidates (the server's ubinary codes) re-scored with float vectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embforge.quantization import quantize
from embforge.retrieval.index.binary import BinaryIndex, hamming, sign_codes
from embforge.retrieval.index.registry import create_index, load_index
from tests.conftest import minilm_path, requires_data, requires_minilm


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_codes_are_the_served_ubinary_codes_and_hamming_counts_differing_bits():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 19)).astype(np.float32)
    np.testing.assert_array_equal(sign_codes(x), quantize(x, "ubinary"))
    bits = x > 0
    expected = (bits[:5, None, :] != bits[None, :, :]).sum(-1)
    np.testing.assert_array_equal(hamming(sign_codes(x[:5]), sign_codes(x)), expected)


def test_scores_are_exact_and_a_pool_covering_everything_is_exact_search(tmp_path: Path):
    rng = np.random.default_rng(1)
    vectors, queries = unit(rng.normal(size=(300, 32))), unit(rng.normal(size=(7, 32)))
    ids = [f"d{i}" for i in range(300)]
    exact = create_index("exact", 32)
    exact.add(ids, vectors)
    index = create_index("binary", 32, rescore=2)
    index.add(ids[:100], vectors[:100])
    index.add(ids[100:], vectors[100:])  # a second add grows the code buffer
    scores, hits = index.search(queries, 5)
    position = {key: i for i, key in enumerate(ids)}
    for q, row in enumerate(hits):
        np.testing.assert_allclose(scores[q], [vectors[position[h]] @ queries[q] for h in row], atol=1e-5)
        assert list(scores[q]) == sorted(scores[q], reverse=True)
    wide = BinaryIndex(32, rescore=60)  # 60 * 5 = every vector is a candidate
    wide.add(ids, vectors)
    assert wide.search(queries, 5)[1] == exact.search(queries, 5)[1]
    index.save(tmp_path / "idx")
    loaded = load_index(tmp_path / "idx")
    assert isinstance(loaded, BinaryIndex) and loaded.rescore == 2
    assert loaded.search(queries, 5)[1] == hits
    with pytest.raises(ValueError, match="known: rescore"):
        create_index("binary", 32, nprobe=3)


@pytest.mark.integration
@pytest.mark.slow
@requires_minilm
@requires_data
def test_binary_with_rescoring_keeps_95_percent_of_float_recall_on_a_scifact_subset():
    from embforge.data.builtin.scifact import load_scifact
    from embforge.encoder import Encoder

    data = load_scifact("dev")
    queries = data.query_ids[:60]
    relevant = {d for q in queries for d in data.qrels[q]}
    keep = [i for i, d in enumerate(data.doc_ids) if d in relevant or i < 1000]
    model = Encoder.load(minilm_path(), max_seq_length=64)  # abstracts cut to 64 tokens: a short test
    docs = model.encode([data.doc_texts[i] for i in keep], batch_size=32)
    claims = model.encode([data.query_texts[data.query_ids.index(q)] for q in queries])
    ids = [data.doc_ids[i] for i in keep]

    def recall(kind: str, **options) -> float:
        index = create_index(kind, docs.shape[1], **options)
        index.add(ids, docs)
        hits = index.search(claims, 10)[1]
        return float(
            np.mean([len(set(h) & set(data.qrels[q])) / len(data.qrels[q]) for q, h in zip(queries, hits)])
        )

    exact, binary = recall("exact"), recall("binary", rescore=4)  # 40 candidates of ~1,070 documents
    assert exact > 0.5
    assert binary >= 0.95 * exact, (binary, exact)


def test_the_server_searches_a_binary_store_and_returns_the_codes_it_indexes(tiny_encoder, tmp_path: Path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from embforge.serve.app import create_app
    from embforge.serve.store import DocumentStore

    texts = [
        "a man plays the guitar",
        "the stock market rises",
        "a child kicks the ball",
        "the woman sings a song",
    ]
    store = DocumentStore.open(tmp_path / "index", dim=tiny_encoder.dim, kind="binary")
    with TestClient(create_app(tiny_encoder, store=store)) as client:
        docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]
        assert client.post("/index/documents", json={"documents": docs}).status_code == 200
        body = client.post("/search", json={"query": texts, "top_k": 1}).json()
        assert [r["hits"][0]["id"] for r in body["results"]] == ["d0", "d1", "d2", "d3"]
        assert body["results"][0]["hits"][0]["score"] == pytest.approx(1.0, abs=1e-5)  # float rescoring
        codes = client.post("/v1/embeddings", json={"input": texts, "encoding_format": "ubinary"}).json()
        served = np.array([d["embedding"] for d in codes["data"]], dtype=np.uint8)
        np.testing.assert_array_equal(served, sign_codes(tiny_encoder.encode(texts)))
