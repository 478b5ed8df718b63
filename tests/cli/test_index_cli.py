"""Issues #16 and #12 for indexes: one on-disk format (``index build`` writes what ``serve --index`` and
``index search`` open), the building model recorded and checked, arguments checked before any encoding, one
flag vocabulary with deprecated spellings, and ``mine`` refusing to write an empty file quietly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import make_bert, make_tokenizer
from tests.retrieval.test_retrieval import _beir

pytest.importorskip("faiss")


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def _build(tmp_path: Path, model: Path, *extra: str) -> list[str]:
    root = _beir(tmp_path / "beir")
    return [
        "index",
        "build",
        "--model",
        str(model),
        "--data",
        str(root),
        "--index",
        str(tmp_path / "idx"),
        *extra,
    ]


def test_serve_opens_what_index_build_wrote_with_its_texts(tiny_model_dir: Path, tmp_path: Path, capsys):
    from embforge.cli import main
    from embforge.encoder import Encoder
    from embforge.serve.store import DocumentStore, model_identity

    assert main(_build(tmp_path, tiny_model_dir)) == 0
    assert _last_json(capsys.readouterr().out)["kind"] == "exact"  # the README's default
    model = Encoder.load(tiny_model_dir)
    store = DocumentStore.open(tmp_path / "idx", dim=model.dim, model=model_identity(model, "tiny"))
    assert len(store) == 5 and store.docs["d3"]["text"] == "Markets the stock market rises"
    store.add([{"id": "new", "text": "a red car"}], model.encode(["a red car"]))
    store.close()
    search = ["index", "search", "--model", str(tiny_model_dir), "--index", str(tmp_path / "idx")]
    assert main([*search, "--query", "oil price falls", "-k", "2"]) == 0
    hits = _last_json(capsys.readouterr().out)["results"][0]["hits"]
    assert hits[0]["id"] == "d4" and hits[0]["text"] == "oil price falls" and hits[0]["score"] > 0.99
    assert len(hits) == 2
    recorded = DocumentStore.open(tmp_path / "idx", dim=model.dim, read_only=True)
    assert recorded.model == {
        "name": str(tiny_model_dir),
        "fingerprint": model_identity(model, "")["fingerprint"],
    }


def test_another_model_is_refused_unless_allowed(tiny_model_dir: Path, tmp_path: Path, capsys):
    from embforge.cli import main
    from embforge.encoder import Encoder

    assert main(_build(tmp_path, tiny_model_dir, "--index-kind", "flat")) == 0
    tokenizer = make_tokenizer()
    other = tmp_path / "other"
    Encoder(make_bert(len(tokenizer), seed=7), tokenizer, pooling="mean", max_seq_length=64).save(other)
    capsys.readouterr()
    search = ["index", "search", "--model", str(other), "--index", str(tmp_path / "idx"), "--query", "oil"]
    assert main(search) == 2
    err = capsys.readouterr().err
    assert f"built by '{tiny_model_dir}'" in err and "--allow-model-mismatch" in err
    assert main([*search, "--allow-model-mismatch"]) == 0


def test_arguments_are_checked_before_the_corpus_is_encoded(
    tiny_model_dir: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
):
    import embforge.retrieval.corpus_cache as corpus_cache
    from embforge.cli import main

    def no_encoding(*args, **kwargs):
        raise AssertionError("the corpus was encoded before the arguments were checked")

    monkeypatch.setattr(corpus_cache, "encode_corpus", no_encoding)
    assert main(_build(tmp_path, tiny_model_dir, "--kind", "annoy")) == 2
    err = capsys.readouterr().err
    assert "--kind is deprecated" in err and "unknown index kind 'annoy'" in err
    assert main(_build(tmp_path, tiny_model_dir, "--index-kind", "hnsw", "--option", "mm=3")) == 2
    assert "unknown option(s) mm" in capsys.readouterr().err
    assert main(_build(tmp_path, tiny_model_dir, "--index-kind", "pq", "--option", "pq_m=5")) == 2
    assert "must divide the dimension" in capsys.readouterr().err
    assert not (tmp_path / "idx").exists()


def test_corpus_cache_is_reused_by_a_second_build(
    tiny_model_dir: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
):
    from embforge.cli import main
    from embforge.encoder import Encoder

    cache = tmp_path / "cache"
    assert main(_build(tmp_path, tiny_model_dir, "--corpus-cache", str(cache))) == 0
    assert (cache / "shards" / "00000.npy").exists()

    def no_encoding(self, *args, **kwargs):
        raise AssertionError("encoded again")

    monkeypatch.setattr(Encoder, "encode", no_encoding)
    argv = _build(tmp_path, tiny_model_dir, "--corpus-cache", str(cache), "--index-kind", "hnsw")
    assert main(argv) == 0
    assert _last_json(capsys.readouterr().out)["documents"] == 5
    from embforge.serve.store import DocumentStore

    dim = Encoder.load(tiny_model_dir).dim
    assert DocumentStore.open(tmp_path / "idx", dim=dim, read_only=True).kind == "hnsw"


def test_one_flag_vocabulary_with_deprecated_spellings(tiny_model_dir: Path, tmp_path: Path, capsys):
    from embforge.cli import main

    root = _beir(tmp_path / "beir")
    ev = ["eval", "retrieval", "--model", str(tiny_model_dir), "--data", str(root), "--split", "test"]
    assert main([*ev, "--index-kind", "flat"]) == 0
    new = capsys.readouterr()
    assert "deprecated" not in new.err
    assert main([*ev, "--index", "flat"]) == 0
    old = capsys.readouterr()
    assert "--index is deprecated" in old.err and "--index-kind" in old.err
    assert _last_json(old.out)["ndcg@10"] == _last_json(new.out)["ndcg@10"]
    assert main([*ev, "--index-kind", "annoy"]) == 2
    assert "unknown index kind 'annoy'" in capsys.readouterr().err


def test_mine_with_no_rows_fails_loudly_and_writes_nothing(tmp_path: Path, capsys):
    pytest.importorskip("bm25s")
    from embforge.cli import main

    root = _beir(tmp_path / "beir")
    out = tmp_path / "mined.jsonl"
    argv = ["mine", "--data", str(root), "--split", "test", "--method", "bm25", "--output", str(out)]
    assert main([*argv, "--num-negatives", "9", "--depth", "5"]) == 2
    err = capsys.readouterr().err
    assert "no rows were mined" in err and "--num-negatives" in err
    assert not out.exists()


def test_an_index_folder_of_the_old_index_build_gets_a_clear_error(tmp_path: Path):
    from embforge.retrieval.index.exact import NumpyIndex
    from embforge.serve.store import DocumentStore

    index = NumpyIndex(4)
    index.add(["a"], np.ones((1, 4), np.float32))
    index.save(tmp_path / "old")
    with pytest.raises(ValueError, match=r"older 'embforge index build'.*rebuild"):
        DocumentStore.open(tmp_path / "old", dim=4)
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == ["ids.jsonl", "index.json", "vectors.npy"]


def test_reopening_a_store_with_another_kind_names_both(tmp_path: Path):
    from embforge.serve.store import DocumentStore

    DocumentStore.open(tmp_path / "s", dim=4, kind="flat").close()
    with pytest.raises(ValueError, match="kind 'flat' but --index-kind is 'exact'"):
        DocumentStore.open(tmp_path / "s", dim=4, kind="exact")


def test_an_onnx_export_of_the_building_model_is_the_same_model(tiny_model_dir: Path, tmp_path: Path):
    pytest.importorskip("onnxruntime")
    from embforge.encoder import Encoder
    from embforge.onnx.export import export_onnx
    from embforge.serve.store import model_identity

    export_onnx(tiny_model_dir, tmp_path / "onnx", parity_texts=["a man plays the guitar", "the cat"])
    onnx = Encoder.load(tmp_path / "onnx", backend="onnx")
    torch_model = Encoder.load(tiny_model_dir)
    assert model_identity(onnx, "x")["fingerprint"] == model_identity(torch_model, "y")["fingerprint"]
