"""``general_table.py loo``: the recipe rewritten without one family, its table, and the MPNet recipe file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from embforge.training.pipeline import load_pipeline, validate_pipeline
from embforge.training.run import load_toml
from tests.conftest import benchmark_module, requires_data

ROOT = Path(__file__).resolve().parents[2]
RECIPES = [
    "embforge/configs/general.toml",
    "embforge/configs/general-mpnet.toml",
    "benchmarks/general_simdistill.toml",
]


def _loo():
    return benchmark_module("_loo")


@pytest.mark.parametrize("recipe_file", [RECIPES[0], RECIPES[2]])
@pytest.mark.parametrize("family", ["sts", "mrpc", "scifact", "banking"])
def test_a_variant_drops_only_the_familys_tasks_and_round_trips_as_toml(tmp_path, family, recipe_file):
    loo = _loo()
    recipe = load_toml(ROOT / recipe_file)
    variant = loo.without(recipe, family, max_steps=2, sets=loo.parse_sets(["ema_decay=0.95", "soup_last=0"]))
    names = [t["name"] for s in variant["stages"] for t in s["tasks"]]
    everything = [t for s in recipe["stages"] for t in s["tasks"]]
    kept = [t["name"] for t in everything if t["data"].split(":")[0] not in loo.FAMILY_DATA[family]]
    assert names == kept and "snli" in names and len(kept) < len(everything)
    assert not any(n.startswith(loo.FAMILY_DATA[family][0]) for n in names)  # its teacher task too
    assert all(s["steps"] == 2 for s in variant["stages"])
    assert variant["defaults"]["ema_decay"] == 0.95 and variant["defaults"]["batch_size"] == 32
    path = tmp_path / "variant.toml"
    path.write_text(loo.dump_toml(variant))
    assert load_toml(path) == variant


def test_leaving_out_a_family_the_recipe_does_not_train_is_an_error():
    loo = _loo()
    recipe = {
        "model": "m",
        "stages": [{"name": "s", "tasks": [{"name": "snli", "data": "x", "loss": "infonce"}]}],
    }
    with pytest.raises(SystemExit, match="does not train sts"):
        loo.without(recipe, "sts")
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        loo.parse_sets(["ema_decay"])


def _scored(folder: Path, base: dict[str, float], left_out: dict[str, list[dict[str, float]]]) -> None:
    """The result files ``loo_table`` reads: the base row's and, per left-out family, one per seed."""
    folder.mkdir(parents=True)
    (folder / "base-all-MiniLM-L6-v2.json").write_text(json.dumps(base))
    for family, runs in left_out.items():
        for run in runs:
            (folder / f"general-without-{family}-s{run['seed']:.0f}.json").write_text(json.dumps(run))


def test_the_table_says_whether_every_seed_held_the_base(tmp_path):
    loo = _loo()
    _scored(tmp_path / "results" / "dev", {"sts": 80.0, "banking": 90.0}, {
        "sts": [{"seed": 42, "sts": 81.0}, {"seed": 43, "sts": 80.5}],
        "banking": [{"seed": 42, "banking": 89.0}, {"seed": 43, "banking": 90.5}],
    })  # fmt: skip
    text = loo.loo_table(tmp_path, ROOT / RECIPES[0], split="dev")
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()[2:]}
    assert "80.75 ± 0.35 | yes" in rows["sts"]
    assert "89.75 ± 1.06 | no (1 below)" in rows["banking"]
    assert "not run" in rows["mrpc"]
    assert "banking_mteb" not in text  # a family's further columns show only where scored
    assert (
        loo.variant_tag(Path("general.toml"), loo.parse_sets(["ema_decay=0.95"])) == "general+ema_decay=0.95"
    )


def test_a_familys_further_column_gets_its_own_line_where_scored(tmp_path):
    loo = _loo()
    _scored(tmp_path / "results" / "test", {"banking": 90.8, "banking_mteb": 80.0}, {
        "banking": [
            {"seed": 42, "banking": 90.7, "banking_mteb": 80.5}, {"seed": 43, "banking": 90.9, "banking_mteb": 80.4},
        ],
    })  # fmt: skip
    lines = [
        line for line in loo.loo_table(tmp_path, ROOT / RECIPES[0]).splitlines() if "| banking |" in line
    ]
    assert len(lines) == 2
    assert "| banking_mteb | 80.00 | 80.50 (s42), 80.40 (s43) | 80.45 ± 0.07 | yes |" in lines[1]
    assert "| no (1 below) |" in lines[0]


def test_a_shorter_run_is_its_own_row_not_the_full_runs(tmp_path):
    """``--max-steps`` changes what is trained, so its rows are not the full-length run's (which would be reused:
    a finished run is never trained again)."""
    loo = _loo()
    trained: list[str] = []

    def train(argv: list[str], log: Path) -> float:
        folder = Path(argv[argv.index("--output") + 1])
        (folder / "final").mkdir(parents=True)
        (folder / "final" / "modules.json").write_text("[]")
        trained.append(folder.name)
        return 0.0

    def evaluate(row, seed, out, **_):
        return {}

    for max_steps in (None, 2):
        loo.run_loo(
            ROOT / RECIPES[0], ["sts"], [42], tmp_path, train=train, evaluate=evaluate, max_steps=max_steps
        )
    assert trained == ["general-without-sts-s42", "general+steps=2-without-sts-s42"]
    assert loo.variant_tag(Path("general.toml"), {}, max_steps=2) == "general+steps=2"


@requires_data
@pytest.mark.parametrize("recipe_file", [RECIPES[0], RECIPES[2]])
@pytest.mark.parametrize("family", ["sts", "mrpc", "scifact", "banking"])
def test_every_variant_of_the_shipped_recipes_validates(tmp_path, family, recipe_file):
    loo = _loo()
    path = tmp_path / f"without-{family}.toml"
    path.write_text(loo.dump_toml(loo.without(load_toml(ROOT / recipe_file), family)))
    validate_pipeline(load_pipeline(path), dim=384)


@requires_data
def test_the_similarity_distillation_recipe_validates():
    pipeline = load_pipeline(ROOT / RECIPES[2])
    validate_pipeline(pipeline, dim=384)  # teacher tasks with similarity_distill are accepted
    losses = [t.loss for s in pipeline.stages for t in s.tasks]
    assert losses.count("similarity_distill") == 4


@requires_data
def test_the_mpnet_recipe_validates_and_trains_what_the_minilm_recipe_trains():
    mpnet, minilm = load_pipeline(ROOT / RECIPES[1]), load_pipeline(ROOT / RECIPES[0])
    validate_pipeline(mpnet, dim=768)
    assert mpnet.model == "models/all-mpnet-base-v2"
    assert [(t.name, t.data, t.loss) for s in mpnet.stages for t in s.tasks] == [
        (t.name, t.data, t.loss) for s in minilm.stages for t in s.tasks
    ]


def _general_table():
    return benchmark_module("general_table")


def test_two_runs_scoring_one_row_at_once_keep_each_others_families(tmp_path, monkeypatch):
    """Two left-out runs score the base row at the same time: the second's families land while the first is
    still scoring; the row's file keeps both (the file is read again and updated under a lock)."""
    from embforge.encoder import Encoder
    from tests.conftest import make_bert, make_tokenizer

    table = _general_table()
    tokenizer = make_tokenizer()
    Encoder(make_bert(len(tokenizer)), tokenizer, pooling="mean", max_seq_length=32).save(tmp_path / "m")

    def sts(model):  # meanwhile another run scores the same row's banking column
        table.evaluate_row("base", None, tmp_path, model=str(tmp_path / "m"), families=("banking",))
        return {"sts": 80.0}

    monkeypatch.setattr(
        table, "_families", lambda split: {"sts": sts, "banking": lambda m: {"banking": 90.0}}
    )
    record = table.evaluate_row("base", None, tmp_path, model=str(tmp_path / "m"), families=("sts",))
    saved = json.loads((tmp_path / "results" / "test" / "base.json").read_text())
    assert saved["sts"] == 80.0 and saved["banking"] == 90.0
    assert set(saved["seconds"]) == {"sts", "banking"} and record["banking"] == 90.0


def test_the_seed_soup_row_merges_the_recipes_seeds_with_equal_weights(tmp_path):
    from embforge.encoder import Encoder
    from tests.conftest import make_bert, make_tokenizer

    table = _general_table()
    tokenizer = make_tokenizer()
    for seed in (42, 43):  # stand-ins for two finished seeds of the recipe
        model = Encoder(make_bert(len(tokenizer), seed=seed), tokenizer, pooling="mean", max_seq_length=64)
        model.save(tmp_path / f"general-s{seed}" / "final")
    table.seed_soup([42, 43], tmp_path, mix="unused", grid="unused")
    soup = Encoder.load(tmp_path / "seedsoup").state_dict()
    a, b = (Encoder.load(tmp_path / f"general-s{s}" / "final").state_dict() for s in (42, 43))
    name = "backbone.encoder.layer.0.attention.self.query.weight"
    torch.testing.assert_close(soup[name], (a[name] + b[name]) / 2, atol=1e-6, rtol=1e-5)


def test_a_variants_data_files_stay_the_recipes_when_it_is_written_elsewhere(tmp_path):
    """A task reading a file next to the recipe (``data = "lists.jsonl"``) reads the same file from OUT/loo/."""
    loo = _loo()
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "lists.jsonl").write_text(
        '{"anchor": "a", "positive": "b", "negative_1": "c", "score": [1, 0]}\n'
    )
    (recipes / "r.toml").write_text(
        'model = "m"\n[[stages]]\nname = "s"\n'
        '  [[stages.tasks]]\n  name = "stsb"\n  data = "stsb:train"\n  loss = "cosent"\n'
        '  [[stages.tasks]]\n  name = "lists"\n  data = "lists.jsonl"\n  loss = "kl_distill"\n'
    )
    out = tmp_path / "out"
    loo.run_loo(recipes / "r.toml", ["sts"], [42], out, train=None, evaluate=None, dry_run=True)
    variant = load_toml(out / "loo" / "r-without-sts.toml")
    (task,) = variant["stages"][0]["tasks"]
    assert task["data"] == str((recipes / "lists.jsonl").resolve())
    assert (
        loo.anchored(load_toml(recipes / "r.toml"), recipes)["stages"][0]["tasks"][0]["data"] == "stsb:train"
    )
