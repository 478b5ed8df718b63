"""Merging folders of every registered model kind (dense, cross-encoder, multi-vector, sparse, static) through the
one mechanism of embforge.merge: each kind's folder loads by its record's class, every method merges its state dict,
end points are the inputs bit for bit, the merged folder reloads as the same kind with the merged weights, and
folders whose kind or settings differ are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from embforge.kinds import KINDS, folder_record, kind_record
from embforge.merge import Merger
from embforge.merging.state import merge_state_dicts
from tests.conftest import make_cross_encoder
from tests.serve.tiny_kinds import build

KIND_NAMES = [kind.value for kind in KINDS]


def _tiny(kind: str, tmp: Path) -> torch.nn.Module:
    if kind == "cross":
        return make_cross_encoder()
    return build(kind, tmp).model


def _folders(kind: str, tmp: Path) -> tuple[Path, Path, Path]:
    """A base folder of ``kind`` and two 'fine-tuned' ones (the base's weights plus seeded noise)."""
    model = _tiny(kind, tmp)
    base = dict(model.state_dict())
    paths = []
    for seed, name in ((None, "base"), (1, "a"), (2, "b")):
        if seed is not None:
            generator = torch.Generator().manual_seed(seed)
            noisy = {
                k: v + 0.05 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
                for k, v in base.items()
            }
            model.load_state_dict(noisy)
        model.save(tmp / name)
        paths.append(tmp / name)
    return paths[0], paths[1], paths[2]


def _state(kind: str, path: Path) -> dict[str, torch.Tensor]:
    return dict(kind_record(kind).model_cls().load(path).state_dict())


def _equal(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_every_kind_is_built_here() -> None:
    assert set(KIND_NAMES) == {"dense", "cross", "multivector", "sparse", "static"}


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_every_method_merges_every_kind_with_exact_end_points(kind: str, tmp_path: Path) -> None:
    base, a, b = _folders(kind, tmp_path)
    s0, sa, sb = _state(kind, base), _state(kind, a), _state(kind, b)
    assert not _equal(sa, s0)
    for method in ("linear", "slerp"):
        merger = Merger([a, b], method=method)
        assert _equal(dict(merger.merge([1.0, 0.0]).state_dict()), sa), method
        assert _equal(dict(merger.merge([0.0, 1.0]).state_dict()), sb), method
    for method in ("task_arithmetic", "ties", "dare_linear", "dare_ties"):
        merger = Merger([a], method=method, base=base, density=1.0)
        assert _equal(dict(merger.merge([0.0]).state_dict()), s0), method
        assert _equal(dict(merger.merge([1.0]).state_dict()), sa), method
    # Model Stock of two models: base + t (mean - base), t from their task vectors' angle
    stock = dict(Merger([a, b], method="model_stock", base=base).merge().state_dict())
    key = next(k for k, v in s0.items() if v.is_floating_point() and v.dim() == 2)
    ta, tb = (sa[key] - s0[key]).reshape(-1).double(), (sb[key] - s0[key]).reshape(-1).double()
    cos = float(ta @ tb / (ta.norm() * tb.norm()))
    t = 2 * cos / (1 + cos)
    torch.testing.assert_close(
        stock[key], s0[key] + t * ((sa[key] + sb[key]) / 2 - s0[key]), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_a_merged_folder_reloads_as_its_kind_with_the_merged_weights(kind: str, tmp_path: Path) -> None:
    base, a, b = _folders(kind, tmp_path)
    merger = Merger([a, b], method="dare_ties", base=base, density=0.5, seed=3)
    merged = {k: v.clone() for k, v in merger.merge([0.7, 0.7]).state_dict().items()}
    expected = merge_state_dicts(
        [_state(kind, a), _state(kind, b)],
        [0.7, 0.7],
        method="dare_ties",
        base=_state(kind, base),
        density=0.5,
        seed=3,
    )
    assert _equal(merged, expected)
    out = merger.save(tmp_path / "merged", recipe={"method": "dare_ties"})
    assert folder_record(out).kind.value == kind
    assert _equal(_state(kind, out), merged)
    config = json.loads((out / "config_sentence_transformers.json").read_text())
    assert config["embforge_merge"] == {"method": "dare_ties"}


def test_folders_of_different_kinds_or_settings_are_refused(tmp_path: Path) -> None:
    _, dense, _ = _folders("dense", tmp_path / "dense")
    _, static, _ = _folders("static", tmp_path / "static")
    with pytest.raises(ValueError, match=r"cannot merge: kind differs .*'dense'.*'static'"):
        Merger([dense, static])
    _, sparse, _ = _folders("sparse", tmp_path / "sparse")
    config = sparse / "config_sentence_transformers.json"  # another pooling is another model
    other = tmp_path / "sparse-sum"
    model = kind_record("sparse").model_cls().load(sparse)
    model.pooling = "sum"
    model.save(other)
    assert config.exists()
    with pytest.raises(ValueError, match=r"cannot merge: pooling differs .*'max'.*'sum'"):
        Merger([sparse, other])
    _, colbert, _ = _folders("multivector", tmp_path / "colbert")
    model = kind_record("multivector").model_cls().load(colbert)
    model.settings.query_length = 12
    model.save(tmp_path / "colbert-12")
    with pytest.raises(ValueError, match="cannot merge: settings differs"):
        Merger([colbert, tmp_path / "colbert-12"])
    with pytest.raises(ValueError, match="layer scaling: no numbered layers"):  # a token table has no layers
        base, a, _ = _folders("static", tmp_path / "static2")
        Merger([a], method="task_arithmetic", base=base, layer_scaling=0.5).merge([1.0])


PEERS = {"dense": "SentenceTransformer", "cross": "CrossEncoder", "sparse": "SparseEncoder"}


@pytest.mark.parametrize("kind", list(PEERS))
@pytest.mark.parametrize(
    ("method", "weights", "parameters"),
    [
        ("slerp", [0.7, 0.3], {"t": 0.3}),
        ("ties", [0.6, 0.9], {"weight": [0.6, 0.9], "density": 0.4, "normalize": False}),
        ("model_stock", None, {}),
    ],
)
def test_parity_with_sentence_transformers_merge(
    kind: str, method: str, weights: list[float] | None, parameters: dict, tmp_path: Path
) -> None:
    """sentence-transformers 6.2 merges its dense, cross-encoder and sparse models through mergekit
    (``SentenceTransformer.merge``): its merged folder, loaded here, has this merge's weights."""
    st = pytest.importorskip("sentence_transformers")
    pytest.importorskip("mergekit")
    base, a, b = _folders(kind, tmp_path)
    with_base = method != "slerp"
    peer = getattr(st, PEERS[kind]).merge(
        [str(a), str(b)],
        method,
        base_model=str(base) if with_base else None,
        parameters=parameters,
        device="cpu",
    )
    peer.save_pretrained(str(tmp_path / "peer"))
    ours = Merger(
        [a, b], method=method, base=base if with_base else None, density=parameters.get("density", 1.0)
    )
    merged = dict(ours.merge(weights).state_dict())
    theirs = _state(kind, tmp_path / "peer")
    assert merged.keys() == theirs.keys()
    for key, value in merged.items():
        torch.testing.assert_close(value, theirs[key], atol=2e-6, rtol=1e-5, msg=key)
