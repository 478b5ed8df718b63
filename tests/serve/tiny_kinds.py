"""Tiny random models of every kind the server serves (dense, static, sparse, multi-vector), built in memory or
in a temporary folder, and the app of one with the settings a test needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from embforge.kinds import KINDS as REGISTRY
from tests.conftest import make_bert, make_tokenizer, tiny_bert_config

# every kind whose registry record names a serving record: a kind registered with one is in every serve test
KINDS = tuple(kind.value for kind, record in REGISTRY.items() if record.serving is not None)


@dataclass
class Case:
    """One kind's tiny model, and the document store its app searches (``None``: the kind keeps its own)."""

    kind: str
    model: Any
    store: Callable[[], Any] | None = None


def build(kind: str, folder: Path) -> Case:
    """The tiny model of ``kind`` (``folder``: where a model that loads from a folder is saved first)."""
    from embforge.serve.store import DocumentStore

    tokenizer = make_tokenizer()
    if kind == "dense":
        from embforge.encoder import Encoder

        model = Encoder(make_bert(len(tokenizer)), tokenizer, pooling="mean", max_seq_length=64)
        return Case(kind, model, lambda: DocumentStore(model.dim))
    if kind == "static":
        from embforge.static.model import StaticEncoder

        torch.manual_seed(0)
        static = StaticEncoder(torch.randn(len(tokenizer), 8), tokenizer.backend_tokenizer)
        return Case(kind, static, lambda: DocumentStore(static.dim))
    if kind == "sparse":
        from transformers import BertForMaskedLM

        from embforge.sparse.model import SparseEncoder

        torch.manual_seed(0)
        return Case(kind, SparseEncoder(BertForMaskedLM(tiny_bert_config(len(tokenizer))), tokenizer))
    if kind != "multivector":
        raise NotImplementedError(
            f"the {kind} kind is served: build a tiny model of it here (tests/serve/tiny_kinds.py)"
        )
    from embforge.encoder import Encoder
    from embforge.multivector import MultiVectorEncoder

    Encoder(make_bert(len(tokenizer)), tokenizer, max_seq_length=64).save(folder / "dense")
    torch.manual_seed(0)
    colbert = MultiVectorEncoder.load(folder / "dense", dim=16)
    colbert.settings.query_length, colbert.settings.document_length = 8, 24
    return Case(kind, colbert)


def app_for(case: Case, **settings: Any) -> Any:
    """``create_app`` of the case's model named ``tiny``, with its store and the :class:`ServeConfig` ``settings``."""
    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    config = ServeConfig(**{"model_name": "tiny", "max_wait_ms": 1, **settings})
    return create_app(case.model, config=config, store=case.store() if case.store else None)
