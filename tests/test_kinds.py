"""Model kinds: ``--model-type`` names, the class behind each kind, a folder's declared kind."""

from __future__ import annotations

import pytest

from embforge.kinds import ModelKind, folder_kind, model_class, parse_kind


def test_parse_kind_accepts_names_and_the_bi_alias() -> None:
    assert parse_kind("bi") is ModelKind.DENSE
    assert parse_kind("Sparse") is ModelKind.SPARSE
    assert parse_kind(ModelKind.STATIC) is ModelKind.STATIC
    with pytest.raises(ValueError, match="dense, cross, multivector, sparse, static"):
        parse_kind("tfidf")


def test_dense_and_cross_classes_declare_their_kind(tiny_model_dir) -> None:
    from embforge.cross_encoder import CrossEncoder
    from embforge.encoder import Encoder

    assert model_class("dense") is Encoder
    assert model_class("cross") is CrossEncoder
    assert folder_kind(tiny_model_dir) is ModelKind.DENSE
