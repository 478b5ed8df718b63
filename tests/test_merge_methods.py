"""Merge methods on tensors (embforge.merging): SLERP, DARE (linear / TIES), Model Stock by their formulas, DARE's
seeded determinism and expectation, Model Stock's ratio against its closed form, and parity with mergekit (the
reference implementation, arcee-ai/mergekit) on whole state dicts and single tensors."""

from __future__ import annotations

import math

import pytest
import torch

from embforge.merging.methods import TensorInputs, dare_linear_coefficients, dare_ties_coefficients
from embforge.merging.records import METHODS
from embforge.merging.state import merge_state_dicts, share_clones
from tests.conftest import make_bert

KEY = "w"


def _states(seed: int = 0, n: int = 3, shape: tuple[int, ...] = (6, 5)) -> list[dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    return [{KEY: torch.randn(shape), "b": torch.randn(shape[0])} for _ in range(n)]


def test_every_method_has_a_coefficient_function_and_help() -> None:
    for record in METHODS.values():
        assert callable(record.function()) and record.summary
        assert record.min_models >= 1 and (
            record.max_models is None or record.max_models >= record.min_models
        )


def test_slerp_by_hand_keeps_the_norm_and_falls_back_to_linear_when_colinear() -> None:
    one, two = {KEY: torch.tensor([1.0, 0.0])}, {KEY: torch.tensor([0.0, 1.0])}
    out = merge_state_dicts([one, two], [0.5, 0.5], method="slerp")[KEY]
    assert torch.allclose(out, torch.tensor([math.sqrt(0.5), math.sqrt(0.5)]), atol=1e-7)  # linear: 0.5, 0.5
    out = merge_state_dicts([one, two], [2 / 3, 1 / 3], method="slerp")[KEY]  # a third of the way: 30 degrees
    assert torch.allclose(out, torch.tensor([math.cos(math.pi / 6), math.sin(math.pi / 6)]), atol=1e-6)
    # nearly colinear (cosine above 0.9995): the straight line, as mergekit does
    a, b = {KEY: torch.tensor([1.0, 2.0, 3.0])}, {KEY: torch.tensor([2.0, 4.0, 6.01])}
    out = merge_state_dicts([a, b], [0.75, 0.25], method="slerp")[KEY]
    assert torch.allclose(out, 0.75 * a[KEY] + 0.25 * b[KEY])


def test_slerp_end_points_are_the_inputs_bit_for_bit() -> None:
    a, b, _ = _states()
    for weights, expected in (([1.0, 0.0], a), ([0.0, 1.0], b)):
        out = merge_state_dicts([a, b], weights, method="slerp")
        assert all(torch.equal(out[k], expected[k]) for k in a), weights


def test_dare_at_density_one_is_task_arithmetic_and_ties_bit_for_bit() -> None:
    base, a, b = _states()
    plain = merge_state_dicts([a, b], [0.4, 0.7], method="task_arithmetic", base=base)
    dare = merge_state_dicts([a, b], [0.4, 0.7], method="dare_linear", base=base, density=1.0)
    assert all(torch.equal(plain[k], dare[k]) for k in plain)
    ties = merge_state_dicts([a, b], [0.4, 0.7], method="ties", base=base, density=1.0)
    dare_ties = merge_state_dicts([a, b], [0.4, 0.7], method="dare_ties", base=base, density=1.0)
    assert all(torch.equal(ties[k], dare_ties[k]) for k in ties)
    for method in ("dare_linear", "dare_ties"):  # weight 0 / 1 on one model: the base / the model
        assert torch.equal(
            merge_state_dicts([a], [0.0], method=method, base=base, density=0.3)[KEY], base[KEY]
        )


def test_dare_drops_and_rescales_by_hand() -> None:
    base, a = {KEY: torch.zeros(4000)}, {KEY: torch.full((4000,), 2.0)}
    out = merge_state_dicts([a], [1.0], method="dare_linear", base=base, density=0.25, seed=3)[KEY]
    assert set(out.unique().tolist()) == {0.0, 8.0}  # dropped, or kept and rescaled by 1/0.25
    assert (out != 0).float().mean().item() == pytest.approx(0.25, abs=0.03)
    # dare_ties: the dropped-and-rescaled task vectors' signs are elected, then disagreeing entries dropped
    one, two = {KEY: torch.tensor([3.0, -1.0])}, {KEY: torch.tensor([-1.0, -2.0])}
    zero = {KEY: torch.zeros(2)}
    x = TensorInputs([one[KEY], two[KEY]], [1.0, 1.0], zero[KEY], 0.5, torch.Generator().manual_seed(0))
    masks = dare_linear_coefficients(x)  # w_i m_i / p with w = 1
    x = TensorInputs([one[KEY], two[KEY]], [1.0, 1.0], zero[KEY], 0.5, torch.Generator().manual_seed(0))
    kept = [m * t for m, t in zip(masks, (one[KEY], two[KEY]))]
    total = kept[0] + kept[1]
    expected = sum(k * (torch.sign(k) == torch.where(total >= 0, 1.0, -1.0)) for k in kept)
    coefficients = dare_ties_coefficients(x)
    assert torch.equal(coefficients[0] * one[KEY] + coefficients[1] * two[KEY], expected)


def test_dare_is_deterministic_with_a_seed_and_per_weight() -> None:
    base, a, b = _states(shape=(40, 30))
    first = merge_state_dicts([a, b], [0.5, 0.5], method="dare_ties", base=base, density=0.5, seed=7)
    again = merge_state_dicts([a, b], [0.5, 0.5], method="dare_ties", base=base, density=0.5, seed=7)
    other = merge_state_dicts([a, b], [0.5, 0.5], method="dare_ties", base=base, density=0.5, seed=8)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first[KEY], other[KEY])
    # a weight's draws depend on the seed and its name only, not on the other weights
    alone = merge_state_dicts(
        [{KEY: a[KEY]}, {KEY: b[KEY]}],
        [0.5, 0.5],
        method="dare_ties",
        base={KEY: base[KEY]},
        density=0.5,
        seed=7,
    )
    assert torch.equal(alone[KEY], first[KEY])


def test_dare_expectation_is_task_arithmetic() -> None:
    base, a, b = _states(shape=(50,))
    plain = merge_state_dicts([a, b], [0.6, 0.3], method="task_arithmetic", base=base)[KEY]
    runs = torch.stack(
        [
            merge_state_dicts([a, b], [0.6, 0.3], method="dare_linear", base=base, density=0.5, seed=s)[KEY]
            for s in range(2000)
        ]
    )
    # each entry: base + sum w_i tau_i m_i / p, E[m_i / p] = 1; sd of the mean over 2000 draws <= 0.023 |tau| here
    scale = (a[KEY] - base[KEY]).abs() + (b[KEY] - base[KEY]).abs()
    assert ((runs.mean(0) - plain).abs() <= 0.1 * scale + 1e-6).all()
    assert not torch.allclose(runs[0], plain)


def test_model_stock_ratio_against_the_closed_form() -> None:
    for angle in (0.3, 1.0, 1.4):
        base = {KEY: torch.tensor([0.5, -0.5, 1.0])}
        one = {KEY: base[KEY] + torch.tensor([2.0, 0.0, 0.0])}
        two = {KEY: base[KEY] + 3 * torch.tensor([math.cos(angle), math.sin(angle), 0.0])}
        out = merge_state_dicts([one, two], method="model_stock", base=base)[KEY]
        t = 2 * math.cos(angle) / (1 + math.cos(angle))  # N cos / (1 + (N-1) cos), N = 2
        expected = base[KEY] + t * ((one[KEY] + two[KEY]) / 2 - base[KEY])
        assert torch.allclose(out, expected, atol=1e-6), angle
    # three models: the mean of the three pairwise cosines
    base = {KEY: torch.zeros(3)}
    models = [{KEY: torch.tensor(v)} for v in ([1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [1.0, 1.0, 0.0])]
    cos = (0 + math.sqrt(0.5) + math.sqrt(0.5)) / 3
    t = 3 * cos / (1 + 2 * cos)
    out = merge_state_dicts(models, method="model_stock", base=base)[KEY]
    assert torch.allclose(out, t * torch.tensor([2.0, 3.0, 0.0]) / 3, atol=1e-6)
    # orthogonal task vectors: t = 0, the base bit for bit; opposite ones (a zero denominator): the base too
    orth = merge_state_dicts(models[:2], method="model_stock", base=base)[KEY]
    assert torch.equal(orth, base[KEY])
    opposite = [{KEY: torch.tensor([1.0, 0.0, 0.0])}, {KEY: torch.tensor([-1.0, 0.0, 0.0])}]
    assert torch.equal(merge_state_dicts(opposite, method="model_stock", base=base)[KEY], base[KEY])


def test_tied_weights_are_merged_once_with_the_same_draws() -> None:
    """A masked-LM decoder shares the word embeddings' tensor: both names get one merge (DARE's draws included)."""
    states = []
    for seed in range(3):
        table = torch.randn(8, 4, generator=torch.Generator().manual_seed(seed))
        states.append({"embeddings.weight": table, "decoder.weight": table, "decoder.bias": torch.zeros(8)})
    base, a, b = states
    out = merge_state_dicts([a, b], [0.5, 0.5], method="dare_ties", base=base, density=0.5)
    assert out["decoder.weight"] is out["embeddings.weight"]
    copy = share_clones(a)
    assert (
        copy["decoder.weight"] is copy["embeddings.weight"]
        and copy["embeddings.weight"] is not a["decoder.weight"]
    )
    assert torch.equal(copy["decoder.weight"], a["decoder.weight"])


def test_recipe_errors_say_what_the_method_needs() -> None:
    base, a, b = _states()
    with pytest.raises(ValueError, match="slerp merging needs exactly 2 models, got 3"):
        merge_state_dicts([a, b, base], [0.2, 0.3, 0.5], method="slerp")
    with pytest.raises(ValueError, match="slerp merging takes no base model"):
        merge_state_dicts([a, b], [0.5, 0.5], method="slerp", base=base)
    with pytest.raises(ValueError, match="model_stock merging needs 2 or more models, got 1"):
        merge_state_dicts([a], method="model_stock", base=base)
    with pytest.raises(ValueError, match=r"model_stock merging derives its ratio .* give no weights"):
        merge_state_dicts([a, b], [0.5, 0.5], method="model_stock", base=base)
    with pytest.raises(
        ValueError, match="dare_ties merging needs 1 or more fine-tuned models and their base"
    ):
        merge_state_dicts([a, b], [0.5, 0.5], method="dare_ties")
    with pytest.raises(ValueError, match="unknown merge method 'karcher'; choose one of linear, slerp"):
        merge_state_dicts([a, b], [0.5, 0.5], method="karcher")


# ------------------------------------------------------------------ parity with mergekit (the reference)


def _bert_states() -> list[dict[str, torch.Tensor]]:
    states = []
    for seed in range(3):
        states.append({k: v.clone() for k, v in make_bert(60, seed=seed).state_dict().items()})
    return states


@pytest.mark.parametrize(
    ("method", "ours", "theirs"),
    [
        ("linear", {"weights": [0.3, 0.7]}, {"weight": [0.3, 0.7]}),
        ("slerp", {"weights": [0.6, 0.4]}, {"t": 0.4}),
        ("task_arithmetic", {"weights": [0.5, 0.8]}, {"weight": [0.5, 0.8]}),
        (
            "ties",
            {"weights": [0.5, 0.8], "density": 0.3},
            {"weight": [0.5, 0.8], "density": 0.3, "normalize": False},
        ),
        (  # mergekit's default: each entry divided by the weights of the models that agree on it
            "ties",
            {"weights": [0.5, 0.8], "density": 0.3, "normalize": True},
            {"weight": [0.5, 0.8], "density": 0.3, "normalize": True},
        ),
        ("model_stock", {}, {}),
    ],
)
def test_parity_with_mergekit_on_state_dicts(method: str, ours: dict, theirs: dict) -> None:
    api = pytest.importorskip("mergekit.merge_methods.api")
    base, a, b = _bert_states()
    with_base = METHODS[method].base
    models = {"base": base, "a": a, "b": b} if with_base else {"a": a, "b": b}
    parameters = {
        name: dict(zip(("a", "b"), value)) if isinstance(value, list) else value
        for name, value in theirs.items()
    }
    reference = api.merge_state_dicts(
        models, method, parameters=parameters, base="base" if with_base else "a"
    )
    merged = merge_state_dicts(
        [a, b],
        ours.get("weights"),
        method=method,
        base=base if with_base else None,
        density=ours.get("density", 1.0),
        normalize=ours.get("normalize", False),
    )
    assert merged.keys() == reference.keys()
    for key, value in merged.items():
        torch.testing.assert_close(value, reference[key], atol=2e-6, rtol=1e-5, msg=key)


@pytest.mark.parametrize(
    ("method", "normalize"), [("dare_linear", False), ("dare_ties", False), ("dare_ties", True)]
)
def test_parity_with_mergekit_dare_on_tensors(method: str, normalize: bool) -> None:
    """mergekit draws its masks from torch's global generator, one Bernoulli draw per model in order, and rescales
    by the L1 norm unless ``rescale: false``; with the same seed, ``rescale: false`` and the weights divided by the
    density, its result is this module's (which rescales by 1/density)."""
    api = pytest.importorskip("mergekit.merge_methods.api")
    torch.manual_seed(0)
    base, a, b = torch.randn(3, 16, 12).unbind(0)
    weights, density = [0.6, 0.3], 0.4
    torch.manual_seed(11)
    reference = api.merge_tensors(
        [base, a, b],
        method,
        parameters={
            "weight": {"a": 0.6 / density, "b": 0.3 / density},
            "density": density,
            "rescale": False,
            **({"normalize": normalize} if method == "dare_ties" else {}),
        },
        ids=["base", "a", "b"],
        base_index=0,
    )
    inputs = TensorInputs(
        [a, b], weights, base, density, torch.Generator().manual_seed(11), normalize=normalize
    )
    coefficients = METHODS[method].function()(inputs)
    ours = (1 - coefficients[0] - coefficients[1]) * base + coefficients[0] * a + coefficients[1] * b
    torch.testing.assert_close(ours, reference, atol=2e-6, rtol=1e-5)


def test_normalize_is_refused_for_a_method_without_sign_election() -> None:
    base, a, b = _bert_states()
    with pytest.raises(ValueError, match=r"normalize .*ties and dare_ties, not task_arithmetic"):
        merge_state_dicts([a, b], [0.5, 0.5], method="task_arithmetic", base=base, normalize=True)
