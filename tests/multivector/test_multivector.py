"""Multi-vector (ColBERT) models: token matrices, masks, MaxSim, losses, training (plain, cached), save/load, eval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embforge.data.retrieval import RetrievalData
from embforge.data.tables import read_table
from embforge.kinds import ModelKind, folder_kind, kind_of
from embforge.losses.late import MaxSimInfoNCELoss, MaxSimKLDistillLoss, MaxSimMarginMSELoss
from embforge.modeling.padding import pad_ids
from embforge.multivector import MultiVectorEncoder, maxsim, maxsim_pairwise
from embforge.multivector.evaluate import evaluate_multivector, multivector_run, recall_against
from embforge.multivector.scoring import maxsim_topk
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.step import cached_step
from embforge.training.tasks import Task, prepare

QUERIES = ["a cat plays", "the dog runs in the park", "oil price falls"]
DOCS = ["a cat plays the piano.", "a dog runs, kicks a ball!", "the stock market rises", "oil price falls"]


@pytest.fixture
def colbert(tiny_model_dir: Path) -> MultiVectorEncoder:
    torch.manual_seed(0)
    model = MultiVectorEncoder.load(tiny_model_dir, dim=16)
    model.settings.query_length, model.settings.document_length = 8, 24
    return model


def reference_maxsim(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """MaxSim written as loops, the definition."""
    out = torch.zeros(len(q), len(d))
    for a in range(len(q)):
        for b in range(len(d)):
            out[a, b] = sum(max(float(qi @ dj) for dj in d[b]) for qi in q[a])
    return out


def test_maxsim_equals_its_definition_and_pairwise_its_diagonal() -> None:
    torch.manual_seed(1)
    q, d = torch.randn(3, 5, 4), torch.randn(4, 7, 4)
    assert torch.allclose(maxsim(q, d), reference_maxsim(q, d), atol=1e-5)
    assert torch.allclose(maxsim_pairwise(q, d[:3]), torch.diagonal(maxsim(q, d[:3])), atol=1e-5)
    scores, ids = maxsim_topk(q, d, 2, budget=50)  # several blocks
    best = reference_maxsim(q, d).topk(2, 1)
    assert torch.equal(ids, best.indices) and torch.allclose(scores, best.values, atol=1e-5)


def test_token_matrices_mask_punctuation_padding_and_keep_query_expansion(
    colbert: MultiVectorEncoder,
) -> None:
    q_ids = colbert.tokenize_ids(["a cat plays ."], is_query=True)
    d_ids = colbert.tokenize_ids(["a dog , runs !"], is_query=False)
    assert q_ids[0][1] == colbert.query_prefix_id and len(q_ids[0]) == 8
    assert q_ids[0][-1] == colbert.tokenizer.mask_token_id
    assert d_ids[0][1] == colbert.document_prefix_id
    colbert.eval()
    out = colbert(q_ids + d_ids)
    assert out.shape == (2, colbert.token_width, 16)
    kept = out.abs().sum(-1) > 0
    assert kept[0].sum() == 8  # every query token, the "." and the [MASK]s too
    assert kept[1].sum() == len(d_ids[0]) - 2  # the document's "," and "!" are masked
    assert torch.allclose(out[kept].norm(dim=-1), torch.ones(int(kept.sum())), atol=1e-5)
    # expansion tokens are not attended to: the real tokens' vectors equal those of the unpadded query
    colbert.settings.do_query_expansion = False
    short = colbert(colbert.tokenize_ids(["a cat plays ."], is_query=True))
    colbert.settings.do_query_expansion = True
    assert torch.allclose(short[0, :6], out[0, :6], atol=1e-5)


def test_forward_is_batched_and_order_independent(colbert: MultiVectorEncoder) -> None:
    colbert.eval()
    ids = colbert.tokenize_ids(DOCS, is_query=False)
    whole = colbert(ids, max_tokens=64)
    one_by_one = torch.cat([colbert([i]) for i in ids])
    assert torch.allclose(whole, one_by_one, atol=1e-5)
    encoded = colbert.encode(DOCS)
    assert [len(m) for m in encoded] == (whole.abs().sum(-1) > 0).sum(1).tolist()


def test_losses_on_maxsim() -> None:
    torch.manual_seed(2)
    q, p, n = (torch.nn.functional.normalize(torch.randn(4, 6, 8), dim=-1) for _ in range(3))
    scores = maxsim(q, torch.cat([p, n]))
    expected = torch.nn.functional.cross_entropy(scores / 0.5, torch.arange(4))
    assert torch.allclose(MaxSimInfoNCELoss(temperature=0.5)([q, p, n]), expected)
    teacher = torch.tensor([[3.0, 1.0]] * 4)
    margins = maxsim_pairwise(q, p) - maxsim_pairwise(q, n)
    expected_mse = ((margins - 2.0) ** 2).mean()
    assert torch.allclose(MaxSimMarginMSELoss()([q, p, n], teacher), expected_mse)
    kl = MaxSimKLDistillLoss()([q, p, n], teacher)
    student = torch.stack([maxsim_pairwise(q, p), maxsim_pairwise(q, n)], 1).log_softmax(-1)
    expected_kl = torch.nn.functional.kl_div(student, teacher.softmax(-1), reduction="batchmean")
    assert torch.allclose(kl, expected_kl)


def _pairs(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.jsonl"
    rows = [{"anchor": q, "positive": d} for q, d in zip(QUERIES, DOCS)]
    rows += [{"anchor": "a woman sings", "positive": "a woman sings a song"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cached_step_equals_the_plain_step(colbert: MultiVectorEncoder, tmp_path: Path) -> None:
    task = prepare(Task("pairs", read_table(_pairs(tmp_path)), MaxSimInfoNCELoss()), colbert)
    rows = list(range(4))
    colbert.train()

    def grads(cached: bool) -> tuple[float, list[torch.Tensor]]:
        colbert.zero_grad()
        if cached:
            loss = cached_step(
                colbert,
                task,
                rows,
                mini_batch_size=3,
                max_tokens=64,
                dropout_seed=7,
                backward=lambda x: x.backward(),
            )
        else:
            loss = task.loss_fn(colbert(task.inputs(rows), max_tokens=64, dropout_seed=7), task.labels(rows))
            loss.backward()
        return float(loss.detach()), [p.grad.clone() for p in colbert.parameters() if p.grad is not None]

    # dropout on: the padding-free forward keys each text's masks by its place in the batch, so both passes agree
    plain_loss, plain = grads(False)
    cached_loss, cached = grads(True)
    assert abs(plain_loss - cached_loss) < 1e-5
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(plain, cached))


def test_train_save_load_and_evaluate(colbert: MultiVectorEncoder, tmp_path: Path) -> None:
    data = RetrievalData(
        doc_ids=[f"d{i}" for i in range(len(DOCS))],
        doc_texts=DOCS,
        query_ids=[f"q{i}" for i in range(len(QUERIES))],
        query_texts=QUERIES,
        qrels={f"q{i}": {f"d{i}": 1} for i in range(len(QUERIES))},
    )
    before = evaluate_multivector(colbert, data)
    task = Task("pairs", read_table(_pairs(tmp_path)), MaxSimInfoNCELoss(temperature=0.1))
    config = TrainConfig(
        output=str(tmp_path / "out"), max_steps=25, batch_size=4, lr=1e-3, quiet=True, mini_batch_size=2
    )
    summary = train(colbert, [task], config)
    assert summary["steps"] == 25
    after = evaluate_multivector(colbert, data)
    assert after["mrr@10"] >= before["mrr@10"]
    assert folder_kind(tmp_path / "out") == ModelKind.MULTIVECTOR
    loaded = MultiVectorEncoder.load(tmp_path / "out")
    assert kind_of(loaded) == ModelKind.MULTIVECTOR
    assert loaded.settings == colbert.settings
    for a, b in zip(colbert.encode(DOCS), loaded.encode(DOCS)):
        np.testing.assert_allclose(a, b, atol=1e-5)
    exact = multivector_run(loaded, data, depth=3)
    reranked = multivector_run(loaded, data, candidates={q: dict.fromkeys(exact[q], 0.0) for q in exact})
    assert recall_against(exact, reranked, k=3) == 1.0


def test_server_returns_token_vectors_and_searches_by_maxsim(colbert: MultiVectorEncoder) -> None:
    from fastapi.testclient import TestClient

    from embforge.serve.app import create_app

    with TestClient(create_app({"colbert": colbert})) as client:  # how `embforge serve --model DIR` builds it
        assert client.get("/v1/models").json()["data"][0] == {
            "id": "colbert",
            "object": "model",
            "owned_by": "embforge",
            "backend": "torch",
            "precision": "fp32",
            "kind": "multivector",
            "dim": 16,
        }
        got = client.post("/v1/embeddings", json={"input": DOCS[:2]}).json()["data"]
        for item, matrix in zip(got, colbert.encode(DOCS[:2])):
            np.testing.assert_allclose(np.array(item["embedding"]), matrix, atol=1e-6)
        query = client.post("/v1/embeddings", json={"input": "a cat", "input_type": "query"}).json()["data"][
            0
        ]
        assert len(query["embedding"]) == colbert.settings.query_length
        docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(DOCS)]
        assert client.post("/index/documents", json={"documents": docs}).json()["total"] == 4
        assert client.post("/index/documents", json={"documents": docs[:1]}).status_code == 409
        hits = client.post("/search", json={"query": QUERIES, "top_k": 2}).json()["results"]
        query_matrix = torch.from_numpy(colbert.encode(QUERIES[:1], is_query=True)[0])[None]
        scores = maxsim(query_matrix, colbert.encode_padded(DOCS)[0])
        assert hits[0]["hits"][0]["id"] == f"d{int(scores[0].argmax())}"
        assert abs(hits[0]["hits"][0]["score"] - float(scores[0].max())) < 1e-4
        assert client.post("/search", json={"query": [""]}).status_code == 422


def test_model_card_export_and_merge_know_the_kind(colbert: MultiVectorEncoder, tmp_path: Path) -> None:
    from embforge.merge import Merger
    from embforge.onnx.export import export_onnx
    from embforge.training.model_card import write_model_card

    colbert.save(tmp_path / "colbert")
    card = write_model_card(tmp_path / "colbert", base_model="tiny", tasks_info=[], config=TrainConfig())
    assert "multi-vector (ColBERT" in card.read_text() and "MultiVectorEncoder.load" in card.read_text()
    with pytest.raises(ValueError, match="multi-vector \\(ColBERT\\) model: embforge has no ONNX export"):
        export_onnx(tmp_path / "colbert", tmp_path / "onnx")
    assert isinstance(Merger([tmp_path / "colbert", tmp_path / "colbert"]).merge(), MultiVectorEncoder)  # #52


def test_cli_trains_and_evaluates_a_colbert_model(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    from embforge.cli import main

    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(DOCS))
    )
    (beir / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(QUERIES))
    )
    (beir / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(QUERIES)))
    )
    out = tmp_path / "colbert"
    flags = ["--model-type", "multivector", "--model", str(tiny_model_dir), "--train", str(_pairs(tmp_path))]
    assert (
        main(["train", *flags, "--max-steps", "2", "--batch-size", "4", "--output", str(out), "--quiet"]) == 0
    )
    assert folder_kind(out) == ModelKind.MULTIVECTOR
    capsys.readouterr()
    assert main(["eval", "retrieval", "--model", str(out), "--data", str(beir), "--split", "test"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["queries"] == 3.0
    # what a ColBERT model cannot do yet is refused with a message, not a traceback
    assert main(["train", *flags, "--eval", str(_pairs(tmp_path)), "--output", str(tmp_path / "x")]) == 2
    assert "multi-vector (ColBERT) embedding model is evaluated on retrieval" in capsys.readouterr().err
    mined = ["--retrieval-train", str(beir), "--retrieval-split", "test", "--num-negatives", "1"]
    assert main(["train", *flags[:4], *mined, "--output", str(tmp_path / "y")]) == 2
    assert "does not mine its own negatives yet" in capsys.readouterr().err


def _padded_reference(colbert: MultiVectorEncoder, ids: list[list[int]]) -> torch.Tensor:
    """Each text through the Hugging Face backbone alone (padded forward, attention mask), in the input order."""
    return torch.cat([colbert.token_matrices(*pad_ids([i], colbert.pad_token_id)) for i in ids])


def test_padding_free_forward_equals_the_padded_forward_with_gradients(colbert: MultiVectorEncoder) -> None:
    queries = colbert.tokenize_ids(
        [*QUERIES, "a cat ."], is_query=True
    )  # 8 tokens, [MASK]-padded, attend less
    docs = colbert.tokenize_ids([*DOCS, "a dog runs in the park and kicks a red ball on the road"])
    ids = queries + docs
    colbert.eval()  # no dropout: the two forwards draw their masks differently
    packed = colbert(ids, max_tokens=40)  # several attention groups, the queries' one without padding
    reference = _padded_reference(colbert, ids)
    assert torch.equal(packed != 0, reference != 0)  # the same masked rows (punctuation, nothing of queries)
    assert torch.allclose(packed, reference, atol=1e-5)
    weight = torch.randn_like(packed)
    grads = []
    for out in (packed, None):
        colbert.zero_grad()
        (
            (colbert(ids, max_tokens=40) if out is not None else _padded_reference(colbert, ids)) * weight
        ).sum().backward()
        grads.append([p.grad.clone() for p in colbert.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1])
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(*grads))


def test_a_padded_id_tensor_runs_the_padded_forward(colbert: MultiVectorEncoder) -> None:
    ids = colbert.tokenize_ids(QUERIES, is_query=True) + colbert.tokenize_ids(DOCS)
    colbert.eval()
    with torch.no_grad():  # one padded batch of queries and documents, as an exported graph takes it
        padded = colbert(*pad_ids(ids, colbert.pad_token_id))
        assert padded.shape == (len(ids), colbert.token_width, colbert.dim)
        assert torch.allclose(padded, _padded_reference(colbert, ids), atol=1e-5)


def test_attended_lengths_stop_at_the_query_expansion(colbert: MultiVectorEncoder) -> None:
    queries = colbert.tokenize_ids(["a cat plays", "a cat"], is_query=True)
    docs = colbert.tokenize_ids(["a cat plays"])
    assert colbert.attended_lengths(queries + docs).tolist() == [6, 5, 6]  # [CLS] [Q] ... [SEP]
    colbert.settings.attend_to_expansion_tokens = True
    assert colbert.attended_lengths(queries).tolist() == [8, 8]


def test_training_forward_with_dropout_does_not_depend_on_the_batching(colbert: MultiVectorEncoder) -> None:
    ids = colbert.tokenize_ids(QUERIES, is_query=True) + colbert.tokenize_ids(DOCS)
    colbert.train()
    whole = colbert(ids, max_tokens=40, dropout_seed=3)
    parts = torch.cat(
        [colbert(ids[:3], dropout_seed=3), colbert(ids[3:], dropout_seed=3, places=range(3, 7))]
    )
    assert torch.allclose(whole, parts, atol=1e-5)
    assert not torch.allclose(whole, colbert(ids, max_tokens=40, dropout_seed=4), atol=1e-3)
