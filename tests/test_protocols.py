"""The typed contracts: model kinds are declared (and read from the declaration), losses share one base, and no
code guesses a model's or a loss's kind from the attributes it happens to have."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from embforge.cross_encoder import CrossEncoder
from embforge.encoder import Encoder
from embforge.evaluate.matryoshka import TruncatedModel
from embforge.kinds import KINDS, ModelKind, is_pair_scorer, kind_of, model_class
from embforge.losses import LOSSES
from embforge.losses.base import BaseLoss, EmbeddingLoss
from embforge.losses.cross import CROSS_LOSSES, CrossLoss
from embforge.onnx.runtime import OnnxCrossEncoder, OnnxEncoder

ROOT = Path(__file__).resolve().parents[1] / "embforge"
# attributes whose presence used to stand for a kind: a cross-encoder (score_ids, predict), a bi-encoder
# (encode), a PyTorch model (state_dict), a cross-encoder loss (scores_in)
SNIFFED = ("score_ids", "predict", "encode", "state_dict", "scores_in", "embed_ids", "kind")


@pytest.mark.parametrize("kind", list(ModelKind))
def test_every_model_class_declares_its_kind(kind: ModelKind) -> None:
    assert model_class(kind).kind == kind, KINDS[kind].model_class


def test_exported_runtimes_declare_their_kind() -> None:
    assert OnnxEncoder.kind == ModelKind.DENSE
    assert OnnxCrossEncoder.kind == ModelKind.CROSS


def test_kind_is_read_from_the_declaration(tiny_model_dir: Path) -> None:
    encoder = Encoder.load(tiny_model_dir)
    cross = CrossEncoder.load(tiny_model_dir, new_head=True)
    assert kind_of(encoder) == ModelKind.DENSE and not is_pair_scorer(encoder)
    assert kind_of(cross) == ModelKind.CROSS and is_pair_scorer(cross)
    # a wrapper declares its model's kind through a property
    view = TruncatedModel(encoder, 8)
    assert kind_of(view) == ModelKind.DENSE


def test_truncated_view_offers_the_embedder_contract(tiny_model_dir: Path) -> None:
    encoder = Encoder.load(tiny_model_dir)
    view = TruncatedModel(encoder, 8)
    full = encoder.encode(["a cat", "a dog"], normalize=False)
    cut = view.encode(["a cat", "a dog"], normalize=False)
    np.testing.assert_allclose(cut, full[:, :8], rtol=1e-5, atol=1e-6)
    assert view.prompts == encoder.prompts and view.normalize == encoder.normalize
    assert view.tokenize_ids(["a cat"]) == encoder.tokenize_ids(["a cat"])


def test_one_loss_base_declares_the_data_contract() -> None:
    declared = (
        "min_texts",
        "max_texts",
        "needs_labels",
        "repeat_single_text",
        "fixed_dim",
        "in_batch_negatives",
    )
    for name in declared:
        assert name in vars(BaseLoss), name
        assert name not in vars(EmbeddingLoss), f"EmbeddingLoss repeats {name}"
    for cls in LOSSES.values():
        assert issubclass(cls, EmbeddingLoss) and not issubclass(cls, CrossLoss), cls
    for cls in CROSS_LOSSES.values():
        assert issubclass(cls, CrossLoss) and not issubclass(cls, EmbeddingLoss), cls


def test_no_kind_is_sniffed_from_attributes() -> None:
    """``hasattr``/``getattr`` never test for an attribute that stands for a model or loss kind (the kind is
    declared: :mod:`embforge.kinds`, :class:`~embforge.losses.base.BaseLoss`); kinds.kind_of alone reads ``kind``."""
    pattern = re.compile(r"\b(?:has|get)attr\(\s*[\w.()]+\s*,\s*[\"'](" + "|".join(SNIFFED) + r")[\"']")
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            match = pattern.search(line)
            if match and not (path.name == "kinds.py" and match.group(1) == "kind"):
                found.append(f"{path.relative_to(ROOT.parent)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
