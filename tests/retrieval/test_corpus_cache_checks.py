"""A corpus cache's shards are checked against their manifests: damage is recomputed (with a warning naming the
shard), never read as embeddings; NaN/inf vectors are refused on write and on read."""

from __future__ import annotations

import json
import random
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from embforge.retrieval.corpus_cache import encode_corpus, load_encoded
from tests.conftest import WORDS

DOCS = 300


def _beir(root: Path, seed: int) -> Path:
    """``DOCS`` documents of random words; 40 queries, each the first words of its one relevant document."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choices(WORDS, k=8)) for _ in range(DOCS)]
    root.mkdir(parents=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts))
    )
    (root / "queries.jsonl").write_text(
        "".join(
            json.dumps({"_id": f"q{i}", "text": " ".join(texts[i].split()[:4])}) + "\n" for i in range(40)
        )
    )
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(40))
    )
    return root


def _eval(
    model: Path, data: Path, cache: Path, capsys: pytest.CaptureFixture
) -> tuple[int, float | None, str]:
    """``embforge eval retrieval --corpus-cache``: (exit status, NDCG@10 or None, stderr and warnings)."""
    from embforge.cli import main

    argv = ["eval", "retrieval", "--model", str(model), "--data", str(data), "--split", "test"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = main([*argv, "--metrics", "ndcg@10", "--corpus-cache", str(cache), "--quiet"])
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    ndcg = json.loads(lines[-1])["ndcg@10"] if lines else None
    return rc, ndcg, err + "".join(f"{w.category.__name__}: {w.message}\n" for w in caught)


def _rewrite(change: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path, Path], None]:
    def damage(shard: Path, _other: Path) -> None:
        np.save(shard, change(np.load(shard)))

    return damage


def _flip_bytes(shard: Path, _other: Path) -> None:
    """The sign bit of every other float of the relevant documents' rows (past the 128-byte .npy header)."""
    data = bytearray(shard.read_bytes())
    for at in range(128 + 3, 128 + 40 * 32 * 4, 8):
        data[at] ^= 0x80
    shard.write_bytes(bytes(data))


def _other_corpus(shard: Path, other: Path) -> None:
    """Every file of another corpus' cache shard folder (same model, same shape) copied over this one's."""
    for path in (other / "shards").iterdir():
        shutil.copy(path, shard.parent / path.name)


def _nan_rows(vectors: np.ndarray) -> np.ndarray:
    vectors[3:13] = np.nan
    return vectors


DAMAGES: dict[str, Callable[[Path, Path], None]] = {
    "flipped bytes": _flip_bytes,
    "other corpus, same shape": _other_corpus,
    "NaN rows": _rewrite(_nan_rows),
    "all-zero rows": _rewrite(np.zeros_like),
    "100 missing rows": _rewrite(lambda vectors: vectors[:-100]),
    "empty file": lambda shard, _other: shard.write_bytes(b""),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_shard_is_recomputed_with_a_warning_naming_it(
    damage: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data, cache = _beir(tmp_path / "beir", seed=0), tmp_path / "cache"
    rc, clean, _ = _eval(tiny_model_dir, data, cache, capsys)
    assert rc == 0 and clean is not None
    other = tmp_path / "other-cache"  # the same model's cache of another corpus of the same size
    assert _eval(tiny_model_dir, _beir(tmp_path / "other", seed=1), other, capsys)[0] == 0
    shard = cache / "shards" / "00000.npy"
    DAMAGES[damage](shard, other)
    rc, ndcg, err = _eval(tiny_model_dir, data, cache, capsys)
    assert (rc, ndcg) == (0, clean)  # the damaged shard was not read as embeddings
    assert str(shard) in err  # the warning names it
    rc, ndcg, err = _eval(tiny_model_dir, data, cache, capsys)
    assert (rc, ndcg) == (0, clean) and "CacheWarning" not in err  # recomputed once, then reused


def test_an_old_cache_without_manifests_is_recomputed_with_a_warning(tiny_encoder, tmp_path: Path) -> None:
    texts, ids = [f"document {w}" for w in WORDS[:20]], [f"d{i}" for i in range(20)]
    encode_corpus(tiny_encoder, texts, ids, tmp_path, block_size=8, show_progress=False)
    for manifest in (tmp_path / "shards").glob("*.json"):
        manifest.unlink()
    progress = json.loads((tmp_path / "progress.json").read_text())
    (tmp_path / "progress.json").write_text(json.dumps({**progress, "layout": "shards-v1"}))
    with pytest.warns(UserWarning, match="older embforge"):
        again = encode_corpus(tiny_encoder, texts, ids, tmp_path, block_size=8, show_progress=False)
    np.testing.assert_allclose(np.asarray(again), tiny_encoder.encode(texts), atol=1e-5)


def test_nan_vectors_are_refused_on_write_naming_the_shard(tiny_encoder, tmp_path: Path) -> None:
    texts, ids = [f"document {w}" for w in WORDS[:20]], [f"d{i}" for i in range(20)]
    original = tiny_encoder.encode

    def broken(batch: list[str], **options: object) -> np.ndarray:
        vectors = original(batch, **options)
        vectors[1] = np.inf if len(batch) < 8 else np.nan
        return vectors

    tiny_encoder.encode = broken
    with pytest.raises(ValueError, match=r"shards/00000\.npy.*row 1 \(id 'd1'\).*not finite"):
        encode_corpus(tiny_encoder, texts, ids, tmp_path, block_size=8, show_progress=False)
    assert not (tmp_path / "shards" / "00000.npy").exists()


def test_a_damaged_shard_read_without_the_model_is_refused_naming_it(tiny_encoder, tmp_path: Path) -> None:
    texts, ids = [f"document {w}" for w in WORDS[:20]], [f"d{i}" for i in range(20)]
    encode_corpus(tiny_encoder, texts, ids, tmp_path, block_size=8, show_progress=False)
    shard = tmp_path / "shards" / "00001.npy"
    vectors = np.load(shard)
    vectors[2] = np.nan
    np.save(shard, vectors)
    _, emb = load_encoded(tmp_path)
    with pytest.raises(ValueError, match=rf"^{shard}: .*checksum"):
        np.asarray(emb)
    with pytest.raises(ValueError, match=rf"^{shard}: "):
        emb.take([9])
    emb.take([0])  # the intact shards still read


def test_nan_rows_are_refused_on_read_even_with_a_matching_checksum(tiny_encoder, tmp_path: Path) -> None:
    import hashlib

    texts, ids = [f"document {w}" for w in WORDS[:20]], [f"d{i}" for i in range(20)]
    encode_corpus(tiny_encoder, texts, ids, tmp_path, block_size=8, show_progress=False)
    shard = tmp_path / "shards" / "00002.npy"
    vectors = np.load(shard)
    vectors[1] = np.inf
    np.save(shard, vectors)  # then a manifest that agrees with the bytes (written by a buggy tool, say)
    manifest = json.loads(shard.with_suffix(".json").read_text())
    data = shard.read_bytes()
    manifest.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    shard.with_suffix(".json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"^{shard}: 1 rows hold NaN or inf \(first: row 17\)"):
        load_encoded(tmp_path)[1].take([17])
    with pytest.warns(UserWarning, match=rf"{shard}: 1 rows hold NaN or inf"):
        again = encode_corpus(tiny_encoder, texts, ids, tmp_path, block_size=8, show_progress=False)
    assert np.isfinite(np.asarray(again)).all()
