"""Model resolution: local folders, the bundled alias, and Hugging Face Hub ids through the local HF cache."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from embforge.cross_encoder import CrossEncoder
from embforge.encoder import Encoder
from embforge.modeling import resolve
from embforge.modeling.resolve import hub_cache_dir, resolve_model_path

REVISION = "0123456789abcdef0123456789abcdef01234567"


def plant_in_hub_cache(cache: Path, repo_id: str, model_dir: Path) -> Path:
    """Copy ``model_dir`` into ``cache`` the way huggingface_hub stores a download: content-addressed blobs,
    ``snapshots/<revision>/`` of relative symlinks to them, and ``refs/main`` naming the revision."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    for number, source in enumerate(sorted(p for p in model_dir.rglob("*") if p.is_file())):
        blob = repo / "blobs" / f"{number:040x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, blob)
        link = snapshot / source.relative_to(model_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_hub_id_resolves_from_the_local_cache(hub_cache, tiny_model_dir, tiny_encoder):
    snapshot = plant_in_hub_cache(hub_cache, "tiny-org/tiny-bert", tiny_model_dir)
    assert hub_cache_dir() == hub_cache
    assert resolve_model_path("tiny-org/tiny-bert").resolve() == snapshot.resolve()
    loaded = Encoder.load("tiny-org/tiny-bert")
    assert loaded.name_or_path == "tiny-org/tiny-bert"  # what the model card names as the base model
    np.testing.assert_allclose(
        loaded.encode(["a cat", "a dog"]), tiny_encoder.encode(["a cat", "a dog"]), atol=1e-6
    )
    cross = CrossEncoder.load("tiny-org/tiny-bert", new_head=True)  # a bi-encoder gets a new one-logit head
    assert cross.predict([("a cat", "a dog")]).shape == (1,)


def test_offline_hub_id_absent_from_the_cache_says_where_it_looked_and_what_to_do(hub_cache):
    with pytest.raises(FileNotFoundError) as error:
        Encoder.load("BAAI/bge-small-en-v1.5")
    message = str(error.value)
    assert "BAAI/bge-small-en-v1.5" in message
    assert str(hub_cache) in message
    assert "HF_HUB_OFFLINE" in message and "hf download BAAI/bge-small-en-v1.5" in message


def test_online_hub_id_downloads_once_then_reads_the_cache(hub_cache, tiny_model_dir, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    calls = []

    def fake_download(repo_id, *, cache_dir, local_files_only=False, **kwargs):
        calls.append(local_files_only)
        if local_files_only:
            from huggingface_hub.errors import LocalEntryNotFoundError

            if not (Path(cache_dir) / "models--org--fresh").exists():
                raise LocalEntryNotFoundError("not cached")
        return str(plant_in_hub_cache(Path(cache_dir), repo_id, tiny_model_dir))

    monkeypatch.setattr(resolve, "_snapshot_download", fake_download)
    resolve_model_path("org/fresh")
    assert calls == [True, False]  # the cache first, then one download


def test_local_folders_and_typos(tmp_path, tiny_model_dir, monkeypatch):
    assert resolve_model_path(tiny_model_dir) == tiny_model_dir
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(FileNotFoundError, match="model folder 'runs/typo' does not exist"):
        resolve_model_path("runs/typo")  # its parent folder exists: a local path, not a Hub id
