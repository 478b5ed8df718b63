"""Each model kind once end to end: train -> evaluate -> save -> load in the peer library -> serve.

- multivector: all-MiniLM-L6-v2 made a ColBERT model, trained on SciFact train pairs, evaluated on a SciFact dev
  subset (exact MaxSim), its folder loaded by pylate (in ``.bench-venvs/pylate``: token vectors compared), served
  (``/v1/embeddings`` token vectors, ``/search`` by MaxSim);
- sparse: no pretrained MLM is available offline and all-MiniLM-L6-v2 has no MLM head, so its encoder gets a
  new MLM head (``BertForMaskedLM.from_pretrained``: the output layer tied to MiniLM's word embeddings, the
  transform layer freshly initialised), is trained with SpladeLoss on the same pairs, evaluated, loaded by
  sentence-transformers' ``SparseEncoder`` and served (``--sparse-base tiny``: the test suite's tiny random MLM);
- static: ``distill-static`` from all-MiniLM-L6-v2 (model2vec), one epoch of CoSENT on STS-B train, STS-B test
  Spearman before and after, loaded by sentence-transformers (``StaticEmbedding``), served.

Every step goes through ``embforge``'s CLI or public API; the script prints one JSON line per kind::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/kinds_minilm.py --out runs/kinds-minilm
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PYLATE = ROOT / ".bench-venvs" / "pylate" / "bin" / "python"
TEXTS = ["a cat plays", "the dog runs in the park ?", "oil price falls"]
DOCS = ["a cat plays the piano.", "a dog runs, kicks a ball!", "the stock market rises", "oil price falls"]


def cli(*args: str) -> dict:
    """``embforge ARGS`` in this process; the last stdout line parsed as JSON when it is one."""
    from embforge.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(args))
    if code != 0:
        raise SystemExit(f"embforge {' '.join(args)} exited {code}")
    lines = out.getvalue().strip().splitlines()
    return json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}


def scifact_files(out: Path, *, pairs: int, queries: int, docs: int) -> tuple[Path, Path]:
    """A pairs file of SciFact train and a BEIR folder of ``queries`` dev claims against ``docs`` abstracts
    (their relevant ones plus others drawn with a fixed seed)."""
    from embforge.data.builtin.scifact import load_scifact
    from embforge.data.retrieval import training_pairs

    train = training_pairs(load_scifact("train"))
    rows = list(zip(train.columns["anchor"], train.columns["positive"]))[:pairs]
    pairs_file = out / "pairs.jsonl"
    pairs_file.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in rows))
    dev = load_scifact("dev").queries_with_qrels()
    chosen = dev.query_ids[:queries]
    relevant = {d for q in chosen for d in dev.qrels[q]}
    others = sorted(set(dev.doc_ids) - relevant)
    keep = relevant | set(random.Random(0).sample(others, max(0, docs - len(relevant))))
    beir = out / "beir"
    (beir / "qrels").mkdir(parents=True, exist_ok=True)
    corpus = [
        {"_id": d, "title": title, "text": text}
        for d, title, text in zip(dev.doc_ids, dev.doc_titles, dev.doc_texts)
        if d in keep
    ]
    (beir / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    texts = dict(zip(dev.query_ids, dev.query_texts))
    (beir / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": texts[q]}) + "\n" for q in chosen)
    )
    qrels = "".join(f"{q}\t{d}\t1\n" for q in chosen for d in dev.qrels[q])
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return pairs_file, beir


def served(app: object, texts: list[str]) -> tuple[list, list]:
    """``/v1/embeddings`` of ``texts`` and ``/search`` of the first one over ``texts`` indexed as documents."""
    from fastapi.testclient import TestClient

    with TestClient(app) as client:  # type: ignore[arg-type]
        embedded = client.post("/v1/embeddings", json={"input": texts}).json()["data"]
        documents = [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]
        client.post("/index/documents", json={"documents": documents}).raise_for_status()
        hits = client.post("/search", json={"query": texts[0], "top_k": 3}).json()["results"][0]["hits"]
    return embedded, hits


def multivector(out: Path, minilm: Path, pairs: Path, beir: Path, steps: int) -> dict:
    from embforge.multivector import MultiVectorEncoder
    from embforge.serve.app import create_app

    folder = out / "multivector"
    start = time.perf_counter()
    cli("train", "--model", str(minilm), "--model-type", "multivector", "--loss", "infonce", "--train",
        str(pairs), "--max-steps", str(steps), "--batch-size", "8", "--output", str(folder), "--quiet")  # fmt: skip
    trained = time.perf_counter() - start
    metrics = cli("eval", "retrieval", "--model", str(folder), "--data", str(beir), "--split", "test")
    model = MultiVectorEncoder.load(folder)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    peer = out / "pylate.npz"
    subprocess.run(
        [
            str(PYLATE),
            str(ROOT / "tests" / "multivector" / "pylate_peer.py"),
            "encode",
            str(folder),
            str(peer),
        ],
        check=True,
        env=env,
    )
    theirs = np.load(peer)
    ours = model.encode(TEXTS, is_query=True) + model.encode(DOCS)
    names = [f"q{i}" for i in range(len(TEXTS))] + [f"d{i}" for i in range(len(DOCS))]
    same_shapes = all(theirs[n].shape == m.shape for n, m in zip(names, ours))
    gap = max(float(np.abs(theirs[n] - m).max()) for n, m in zip(names, ours)) if same_shapes else None
    embedded, hits = served(create_app({"colbert": model}), DOCS)
    return {
        "kind": "multivector",
        "train_s": round(trained, 1),
        "eval": {k: metrics[k] for k in ("ndcg@10", "recall@10", "queries") if k in metrics},
        "pylate_same_shapes": same_shapes,
        "pylate_max_abs_diff": gap,
        "served_tokens": [len(e["embedding"]) for e in embedded],
        "search_top": [h["id"] for h in hits],
    }


def mlm_folder(out: Path, minilm: Path, base: str) -> tuple[Path, str]:
    """A ``BertForMaskedLM`` folder to start SPLADE from: MiniLM's encoder with a new MLM head, or a tiny random
    one (the test suite's 60-word vocabulary: SciFact is mostly [UNK] to it)."""
    sys.path.insert(0, str(ROOT))
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from tests.conftest import make_tokenizer

    torch.manual_seed(0)
    folder = out / f"{base}-mlm"
    if base == "minilm":
        BertForMaskedLM.from_pretrained(minilm).save_pretrained(folder)
        AutoTokenizer.from_pretrained(minilm).save_pretrained(folder)
        return folder, "sparse (all-MiniLM-L6-v2 encoder + a new MLM head)"
    tokenizer = make_tokenizer()
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)  # fmt: skip
    BertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, "sparse (tiny random MLM)"


def sparse(out: Path, mlm: Path, pairs: Path, beir: Path, steps: int) -> dict:
    from sentence_transformers import SparseEncoder as STSparseEncoder

    from embforge.kinds import load_any
    from embforge.serve.app import create_app

    folder = out / "sparse"
    start = time.perf_counter()
    cli("train", "--model", str(mlm), "--model-type", "sparse", "--loss", "splade", "--train", str(pairs),
        "--max-steps", str(steps), "--batch-size", "8", "--output", str(folder), "--quiet")  # fmt: skip
    trained = time.perf_counter() - start
    metrics = cli("eval", "retrieval", "--model", str(folder), "--data", str(beir), "--split", "test")
    model = load_any(folder)
    theirs = STSparseEncoder(str(folder)).encode_document(DOCS)
    theirs = theirs.to_dense().numpy() if hasattr(theirs, "to_dense") else theirs.toarray()
    gap = float(np.abs(model.encode_document(DOCS).toarray() - theirs).max())
    embedded, hits = served(create_app({"splade": model}), DOCS)
    return {
        "train_s": round(trained, 1),
        "eval": {k: metrics[k] for k in ("ndcg@10", "document_active_dims", "queries") if k in metrics},
        "sentence_transformers_max_abs_diff": gap,
        "served_active_dims": [len(e["embedding"]["indices"]) for e in embedded],
        "search_top": [h["id"] for h in hits],
    }


def static(out: Path, minilm: Path) -> dict:
    from sentence_transformers import SentenceTransformer

    from embforge.data.builtin.stsb import load_stsb
    from embforge.evaluate.sts import evaluate_sts
    from embforge.serve.app import create_app
    from embforge.serve.store import DocumentStore
    from embforge.static.model import StaticEncoder

    distilled, folder = out / "static-distilled", out / "static"
    cli("distill-static", "--model", str(minilm), "--output", str(distilled), "--quiet")
    test = load_stsb("test")
    before = evaluate_sts(StaticEncoder.load(distilled), test)["spearman"]
    train_csv = (
        Path(os.environ.get("EMBFORGE_DATA", ROOT.parent / "shared" / "data"))
        / "stsb_en"
        / "stsb-en-train.csv"
    )
    cli("train", "--model", str(distilled), "--model-type", "static", "--train", str(train_csv), "--loss",
        "cosent", "--lr", "0.01", "--epochs", "1", "--batch-size", "32", "--output", str(folder), "--quiet")  # fmt: skip
    model = StaticEncoder.load(folder)
    after = evaluate_sts(model, test)["spearman"]
    gap = float(np.abs(model.encode(DOCS) - SentenceTransformer(str(folder)).encode(DOCS)).max())
    embedded, hits = served(
        create_app(model, store=DocumentStore(model.dim)), DOCS
    )  # a dense kind: /search needs a store
    return {
        "kind": "static",
        "stsb_test_spearman_distilled": before,
        "stsb_test_spearman_after_cosent_epoch": after,
        "sentence_transformers_max_abs_diff": gap,
        "served_dim": len(embedded[0]["embedding"]),
        "search_top": [h["id"] for h in hits],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/kinds-minilm")
    parser.add_argument("--kinds", default="multivector,sparse,static")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--sparse-base", default="minilm", choices=["minilm", "tiny"], help="SPLADE's start")
    args = parser.parse_args()
    from embforge.modeling.resolve import resolve_model_path

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    minilm = resolve_model_path("all-MiniLM-L6-v2")
    pairs, beir = scifact_files(out, pairs=64, queries=20, docs=100)
    for kind in args.kinds.split(","):
        if kind == "multivector":
            result = multivector(out, minilm, pairs, beir, args.steps)
        elif kind == "sparse":
            mlm, name = mlm_folder(out, minilm, args.sparse_base)
            result = {"kind": name} | sparse(out, mlm, pairs, beir, args.steps)
        else:
            result = static(out, minilm)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
