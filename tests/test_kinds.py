"""Model kinds: the registry (one record per kind, :mod:`embforge.kinds`), ``--model-type`` names, a folder's
declared kind, and that generic code asks the record instead of comparing kinds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from embforge.kinds import (
    KINDS,
    KindRecord,
    ModelKind,
    folder_kind,
    kind_record,
    load_named,
    model_class,
    parse_kind,
)
from embforge.losses.base import BaseLoss

ROOT = Path(__file__).resolve().parents[1] / "embforge"
RECORDS = list(KINDS.values())


def test_parse_kind_accepts_names_and_the_bi_alias() -> None:
    assert parse_kind("bi") is ModelKind.DENSE
    assert parse_kind("Sparse") is ModelKind.SPARSE
    assert parse_kind("colbert") is ModelKind.MULTIVECTOR
    assert parse_kind(ModelKind.STATIC) is ModelKind.STATIC
    with pytest.raises(ValueError, match=r"dense, cross, multivector, sparse, static .*bi = dense"):
        parse_kind("tfidf")


def test_dense_and_cross_classes_declare_their_kind(tiny_model_dir) -> None:
    from embforge.cross_encoder import CrossEncoder
    from embforge.encoder import Encoder

    assert model_class("dense") is Encoder
    assert model_class("cross") is CrossEncoder
    assert folder_kind(tiny_model_dir) is ModelKind.DENSE


def test_every_kind_has_one_record_and_aliases_are_unique() -> None:
    assert set(KINDS) == set(ModelKind)
    assert all(key is record.kind for key, record in KINDS.items())
    names = [name for record in RECORDS for name in (record.kind.value, *record.aliases)]
    assert len(names) == len(set(names))
    assert all(kind_record(name) is KINDS[parse_kind(name)] for name in names)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.kind.value)
def test_a_record_resolves(record: KindRecord) -> None:
    assert record.model_cls().kind == record.kind  # the class it names declares the kind
    assert callable(load_named(record.prepared_task))
    assert all(callable(record.evaluator(name)) for name in record.evaluators)
    assert record.card is None or callable(load_named(record.card))
    assert record.exportable == (record.no_export == ""), "a kind without an export says why"
    assert not (record.single_vector and record.pair_scoring)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.kind.value)
def test_a_records_default_losses_are_its_own_and_build(record: KindRecord) -> None:
    assert record.default_loss in record.loss_names()
    for name in (record.default_loss, record.retrieval_loss):
        loss = record.build_loss(name, dim=8, num_labels=2)
        assert isinstance(loss, BaseLoss)
    if not record.matryoshka:
        with pytest.raises(ValueError, match="matryoshka_dims applies to bi-encoders only"):
            record.build_loss(record.default_loss, matryoshka_dims=[4])


def test_a_kinds_loss_table_is_the_one_its_factory_builds_from() -> None:
    from embforge.losses import LOSSES
    from embforge.losses.cross import CROSS_LOSSES
    from embforge.losses.late import MULTIVECTOR_LOSSES

    assert KINDS[ModelKind.CROSS].loss_names() == tuple(CROSS_LOSSES)
    assert KINDS[ModelKind.MULTIVECTOR].loss_names() == tuple(MULTIVECTOR_LOSSES)
    assert KINDS[ModelKind.SPARSE].loss_names() == tuple(LOSSES)
    assert KINDS[ModelKind.SPARSE].build_loss("splade").name == "splade"


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.kind.value)
def test_the_server_serves_a_tiny_model_with_its_records_serving(
    record: KindRecord, tmp_path: Path, tiny_cross_encoder
) -> None:
    from embforge.serve.serving import serving_for
    from tests.serve.tiny_kinds import build

    if record.serving is None:  # served as a reranker, never by the embedding server
        with pytest.raises(ValueError, match="not an embedding model"):
            serving_for(tiny_cross_encoder)
        assert record.pair_scoring
        return
    model = build(record.kind.value, tmp_path).model
    assert type(serving_for(model)) is record.serving_class()


def test_query_columns_are_marked_one_way(tmp_path: Path) -> None:
    """The training task asks every kind for a query column's ids with ``tokenize_ids(is_query=True)``: a
    multi-vector model's [Q] marker, an inference-free sparse model's QueryIds; a dense model's ids are unchanged."""
    from embforge.sparse.model import QueryIds
    from tests.serve.tiny_kinds import build

    dense, colbert = build("dense", tmp_path).model, build("multivector", tmp_path).model
    assert dense.tokenize_ids(["a cat"], is_query=True) == dense.tokenize_ids(["a cat"])
    query, document = colbert.tokenize_ids(["a cat"], is_query=True), colbert.tokenize_ids(["a cat"])
    assert query[0][1] == colbert.query_prefix_id and document[0][1] == colbert.document_prefix_id
    sparse = build("sparse", tmp_path).model
    assert not isinstance(sparse.tokenize_ids(["a cat"], is_query=True)[0], QueryIds)  # not inference-free
    sparse.query_weights = __import__("torch").nn.Parameter(__import__("torch").ones(sparse.dim))
    assert isinstance(sparse.tokenize_ids(["a cat"], is_query=True)[0], QueryIds)
    assert not isinstance(sparse.tokenize_ids(["a cat"])[0], QueryIds)


# A model class declaring its kind (``kind: ClassVar[ModelKind] = ModelKind.X``) is the declaration the registry
# reads, not a comparison: allowed anywhere.
DECLARATION = re.compile(r"^\s*kind: ClassVar\[ModelKind\] = ModelKind\.\w+")
# Files allowed a kind comparison, with their count: none (training/run.py and training/pipeline.py ask the
# record: kind_record(...).default_loss / .retrieval_loss / .lora / .pair_scoring / .build_loss / .evaluator).
PENDING: dict[str, int] = {}


def test_generic_code_asks_the_record_instead_of_comparing_kinds() -> None:
    found: dict[str, int] = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = path.relative_to(ROOT.parent).as_posix()
        if name == "embforge/kinds.py":  # the registry itself
            continue
        for line in path.read_text().splitlines():
            if "ModelKind." in line and not DECLARATION.match(line):
                found[name] = found.get(name, 0) + 1
    over = {name: n for name, n in found.items() if n > PENDING.get(name, 0)}
    assert not over, f"kind comparisons outside embforge/kinds.py (ask kind_record(...) instead): {over}"


# isinstance tests on a model class that are not kind tests: a PyTorch model vs an exported graph of the same
# (dense) kind, whose folder the server reads.
NOT_KIND_TESTS = {"embforge/serve/dense.py", "embforge/serve/models.py"}


def test_generic_code_does_not_sniff_a_kind_by_its_class() -> None:
    sniff = re.compile(r"isinstance\([^)]*\b(SparseEncoder|MultiVectorEncoder|StaticEncoder|CrossEncoder)\b")
    offenders = [
        f"{path.relative_to(ROOT.parent)}:{i}"
        for path in ROOT.rglob("*.py")
        if path.parent.name not in ("sparse", "multivector", "static")  # a kind's own package knows its class
        and path.relative_to(ROOT.parent).as_posix() not in NOT_KIND_TESTS
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if sniff.search(line)
    ]
    assert not offenders, offenders
