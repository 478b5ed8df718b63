"""Leave-one-family-out for ``general_table.py loo``: train a recipe without family X, score X against the base.

A recipe file (``embforge/configs/general.toml`` or any pipeline TOML) is rewritten once per left-out family into
``OUT/loo/<tag>-without-<family>.toml`` — the same file minus every task on that family's data sets (a
distillation task on its texts included), optionally with
fewer steps (``--max-steps``) and extra ``[defaults]`` (``--set ema_decay=0.95``) — trained per seed by the CLI
into ``OUT/<tag>-without-<family>-s<seed>``, then scored on that family only. The base (the recipe's ``model``)
is scored on the same family once. "A recipe may not lower a family it did not train on": the table's verdict
column says whether every seed's score is >= the base's.

The ``snli`` task (general semantics, NLI triplets) is in no family: it stays in every run.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# family (general_table column group) -> the built-in data sets that train it: every task reading one of them
# (labelled, or its texts for a teacher) is left out with the family
FAMILY_DATA = {"sts": ("stsb",), "mrpc": ("mrpc",), "scifact": ("scifact",), "banking": ("banking77",)}
HEADLINE = {"sts": "sts", "mrpc": "mrpc_ap", "scifact": "scifact", "banking": "banking"}
# more columns of a family, a line each where scored (``general_table.py eval --families banking_mteb`` on the rows)
MORE_COLUMNS = {"banking": ("banking_mteb",)}


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """``["ema_decay=0.95", "soup_last=3"]`` -> ``{"ema_decay": 0.95, "soup_last": 3}`` (TOML values)."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--set wants KEY=VALUE (a TrainConfig field and a TOML value), got {item!r}")
        values[key.strip()] = tomllib.loads(f"v = {text}")["v"]
    return values


def variant_tag(
    recipe_path: Path, sets: dict[str, Any] | None = None, *, max_steps: int | None = None
) -> str:
    """The rows' name: the recipe file's stem, plus each ``--set`` (``general+ema_decay=0.95``) and a
    ``--max-steps`` (``general+steps=2``) — each trains something else, so each is its own row."""
    steps = {"steps": max_steps} if max_steps else {}
    return recipe_path.stem + "".join(f"+{k}={v}" for k, v in {**(sets or {}), **steps}.items())


def base_row(recipe: dict[str, Any]) -> tuple[str, str]:
    """``(row name, model)`` of the recipe's base: shared by every variant of recipes with that model."""
    model = str(recipe.get("model", "all-MiniLM-L6-v2"))
    return f"base-{Path(model).name}", model


def anchored(recipe: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A copy of ``recipe`` whose relative data files (resolved against the recipe's ``folder``, as the pipeline
    does) are absolute, so the variant written elsewhere (``OUT/loo/``) reads the same files."""

    def fix(task: dict[str, Any]) -> dict[str, Any]:
        data = Path(str(task["data"]))
        local = folder / data
        return {**task, "data": str(local.resolve())} if not data.is_absolute() and local.is_file() else task

    stages = [{**stage, "tasks": [fix(t) for t in stage["tasks"]]} for stage in recipe["stages"]]
    return {**recipe, "stages": stages}


def without(
    recipe: dict[str, Any], family: str, *, max_steps: int | None = None, sets: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A copy of the parsed ``recipe`` without the tasks reading ``family``'s data sets (an error when none do)."""
    dropped = FAMILY_DATA[family]
    stages = []
    for stage in recipe["stages"]:
        tasks = [t for t in stage["tasks"] if str(t["data"]).partition(":")[0] not in dropped]
        if tasks:
            stages.append({**stage, "tasks": tasks, **({"steps": max_steps} if max_steps else {})})
    removed = sum(len(s["tasks"]) for s in recipe["stages"]) - sum(len(s["tasks"]) for s in stages)
    if not removed:
        raise SystemExit(f"the recipe has no task on {' / '.join(dropped)}: it does not train {family}")
    return {**recipe, "defaults": {**recipe.get("defaults", {}), **(sets or {})}, "stages": stages}


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return json.dumps(value) if not isinstance(value, float) else repr(value)


def dump_toml(recipe: dict[str, Any]) -> str:
    """A pipeline recipe (top-level keys, ``[defaults]``, ``[[stages]]`` with ``[[stages.tasks]]``) as TOML."""
    lines = [f"{k} = {_value(v)}" for k, v in recipe.items() if k not in ("defaults", "stages")]
    lines += ["", "[defaults]", *(f"{k} = {_value(v)}" for k, v in recipe.get("defaults", {}).items())]
    for stage in recipe["stages"]:
        lines += ["", "[[stages]]", *(f"{k} = {_value(v)}" for k, v in stage.items() if k != "tasks")]
        for task in stage["tasks"]:
            lines += ["  [[stages.tasks]]", *(f"  {k} = {_value(v)}" for k, v in task.items())]
    return "\n".join(lines) + "\n"


def run_loo(
    recipe_path: Path,
    families: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    *,
    train: Callable[[list[str], Path], float],
    evaluate: Callable[..., dict[str, Any]],
    split: str = "test",
    max_steps: int | None = None,
    sets: dict[str, Any] | None = None,
    dry_run: bool = False,
) -> None:
    """Train and score every (family, seed) still missing; ``dry_run`` writes the TOMLs and prints the plan."""
    recipe = anchored(tomllib.loads(recipe_path.read_text()), recipe_path.resolve().parent)
    tag = variant_tag(recipe_path, sets, max_steps=max_steps)
    base_name, base = base_row(recipe)
    for family in families:
        variant = without(recipe, family, max_steps=max_steps, sets=sets)
        toml = out / "loo" / f"{tag}-without-{family}.toml"
        toml.parent.mkdir(parents=True, exist_ok=True)
        toml.write_text(dump_toml(variant))
        row = f"{tag}-without-{family}"
        print(json.dumps({"family": family, "recipe": str(toml), "base": base,
                          "tasks": [t["name"] for s in variant["stages"] for t in s["tasks"]]}), flush=True)  # fmt: skip
        if dry_run:
            continue
        evaluate(base_name, None, out, split=split, model=base, families=(family,))
        for seed in seeds:
            folder = out / f"{row}-s{seed}"
            if not (folder / "final" / "modules.json").exists():
                args = [
                    "train",
                    str(toml),
                    "--output",
                    str(folder),
                    "--seed",
                    str(seed),
                    "--resume",
                    "--quiet",
                ]
                train(args, out / "logs" / f"{row}-s{seed}.log")
            evaluate(row, seed, out, split=split, model=str(folder / "final"), families=(family,))


def loo_table(
    out: Path,
    recipe_path: Path,
    *,
    sets: dict[str, Any] | None = None,
    split: str = "test",
    max_steps: int | None = None,
) -> str:
    """Markdown: per family, the base, each recipe-without-it seed, mean ± std, and whether it held."""
    tag = variant_tag(recipe_path, sets, max_steps=max_steps)
    base_name, _ = base_row(tomllib.loads(recipe_path.read_text()))
    folder = out / "results" / split
    lines = [
        f"| left out ({tag}) | column | base | without it, per seed | mean ± std | every seed >= base |",
        "|---|---|---:|---|---:|---|",
    ]
    columns = [*HEADLINE.items(), *((f, c) for f, more in MORE_COLUMNS.items() for c in more)]
    for family, column in columns:
        base_file = folder / f"{base_name}.json"
        base = json.loads(base_file.read_text()).get(column) if base_file.exists() else None
        runs = [json.loads(p.read_text()) for p in sorted(folder.glob(f"{tag}-without-{family}-s*.json"))]
        values = [(r["seed"], r[column]) for r in runs if column in r]
        if base is None or not values:
            if column == HEADLINE[family]:
                lines.append(
                    f"| {family} | {column} | {base if base is not None else '–'} | not run | – | – |"
                )
            continue
        scores = [v for _, v in values]
        spread = f" ± {statistics.stdev(scores):.2f}" if len(scores) > 1 else ""
        held = "yes" if all(v >= base for v in scores) else f"no ({sum(v < base for v in scores)} below)"
        per_seed = ", ".join(f"{v:.2f} (s{s})" for s, v in values)
        lines.append(
            f"| {family} | {column} | {base:.2f} | {per_seed} | {statistics.mean(scores):.2f}{spread} | {held} |"
        )
    return "\n".join(lines)
