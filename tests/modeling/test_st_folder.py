"""The sentence-transformers folder format (embforge/modeling/st_folder.py): what an Encoder saves reads back,
module paths stay inside the folder, an unknown module is named, a cross-encoder folder is recognised."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embforge.encoder import Encoder
from embforge.modeling.st_folder import (
    MODULES_FILE,
    ST_CONFIG_FILE,
    has_modules,
    is_cross_encoder_folder,
    read_st_config,
    read_st_settings,
)
from tests.conftest import make_bert, make_tokenizer


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    tokenizer = make_tokenizer()
    model = Encoder(make_bert(len(tokenizer)), tokenizer, pooling="cls", normalize=True, max_seq_length=48)
    model.prompts = {"query": "query: "}
    model.save(tmp_path / "m")
    return tmp_path / "m"


def test_what_an_encoder_saves_reads_back(saved: Path):
    settings = read_st_settings(saved)
    assert {k: settings[k] for k in ("transformer_path", "pooling", "normalize", "max_seq_length")} == {
        "transformer_path": "",
        "pooling": "cls",
        "normalize": True,
        "max_seq_length": 48,
    }
    assert settings["prompts"] == {"query": "query: "}
    config = read_st_config(saved)
    assert config["model_type"] == "SentenceTransformer" and "embforge" in config["__version__"]
    assert has_modules(saved) and not is_cross_encoder_folder(saved)


def test_a_module_path_outside_the_folder_is_refused(saved: Path, tmp_path: Path):
    modules = json.loads((saved / MODULES_FILE).read_text())
    modules[1]["path"] = "../elsewhere"
    (saved / MODULES_FILE).write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=r"module path '\.\./elsewhere' points outside the model folder"):
        read_st_settings(saved)


def test_an_unsupported_module_is_named(saved: Path):
    modules = json.loads((saved / MODULES_FILE).read_text())
    modules.append({"idx": 9, "name": "9", "path": "", "type": "sentence_transformers.models.LSTM"})
    (saved / MODULES_FILE).write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=r"module type 'sentence_transformers.models.LSTM' is not supported"):
        read_st_settings(saved)


def test_a_folder_is_a_cross_encoder_when_its_config_says_so(saved: Path, tmp_path: Path):
    config = read_st_config(saved)
    (saved / ST_CONFIG_FILE).write_text(json.dumps({**config, "model_type": "CrossEncoder"}))
    assert is_cross_encoder_folder(saved)
    assert not is_cross_encoder_folder(tmp_path / "missing")
    assert read_st_settings(tmp_path) == {
        "transformer_path": "",
        "pooling": "mean",
        "normalize": False,
        "max_seq_length": None,
    }
