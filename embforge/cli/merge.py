"""``embforge merge``: merge same-architecture models of any kind (dense, cross-encoder, multi-vector, sparse,
static) by linear interpolation / checkpoint averaging, SLERP, task arithmetic, TIES, DARE or Model Stock.

With ``--choose-on SPEC`` the weight is swept over ``--grid`` and chosen on a dev mix of embforge's own evaluators
(e.g. ``sts:stsb-dev,retrieval:scifact-dev``); the table it chose from is printed (stderr) and returned.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from embforge.cli.values import float_list, folder, number, ratio, seed
from embforge.merging.records import METHODS

if TYPE_CHECKING:
    from embforge.protocols import Embedder


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser("merge", help="merge models of one architecture into one", description=__doc__)
    parser.add_argument("--models", nargs="+", required=True, help="model folders (or aliases) to merge")
    parser.add_argument("--output", type=folder, required=True, help="folder for the merged model")
    parser.add_argument(
        "--method",
        choices=tuple(METHODS),
        default="linear",
        help="; ".join(f"{m.name}: {m.summary}" for m in METHODS.values()) + " (default linear)",
    )
    parser.add_argument(
        "--weights", type=float_list, default=None, help="comma list, one per model (default: equal weights)"
    )
    parser.add_argument("--base", default=None, help="base model the others were fine-tuned from")
    parser.add_argument(
        "--density",
        type=number(0, 1, open_low=True),
        default=0.2,
        help="ties: fraction of each task vector kept (by magnitude); dare_linear/dare_ties: probability of "
        "keeping each entry; in (0, 1] (default 0.2)",
    )
    parser.add_argument(
        "--seed", type=seed, default=0, help="dare_linear/dare_ties: seed of the drops (default 0)"
    )
    parser.add_argument(
        "--normalize",
        action="store_true",
        help="ties/dare_ties: average the task vectors that agree on an entry (divide by their weights' sum) "
        "instead of summing them, as mergekit's normalize: true does (default off: summed)",
    )
    parser.add_argument(
        "--layer-scaling",
        type=ratio,
        default=None,
        metavar="ALPHA",
        help="with --base: scale each layer's task vector by ALPHA + (1-ALPHA)*depth, ALPHA in [0, 1] (LiNeS: "
        "embeddings and shallow layers stay near the base, the last layer gets the full weight)",
    )
    parser.add_argument(
        "--choose-on",
        default=None,
        metavar="SPEC",
        help="choose the weight on a dev mix, e.g. 'sts:stsb-dev,retrieval:scifact-dev' (or FILE / FOLDER@split)",
    )
    parser.add_argument(
        "--grid",
        type=float_list,
        default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1",
        help="weights tried by --choose-on: w for the 2nd model (linear) or every task vector",
    )
    parser.set_defaults(func=run_merge)


def run_merge(args: argparse.Namespace) -> Mapping[str, object]:
    from embforge.kinds import kind_record
    from embforge.merge import Merger, sweep_weights

    merger = Merger(
        args.models,
        method=args.method,
        base=args.base,
        density=args.density,
        layer_scaling=args.layer_scaling,
        seed=args.seed,
        normalize=args.normalize,
    )
    recipe: dict[str, object] = {"method": args.method, "models": args.models, "base": args.base}
    if merger.record.density:
        recipe["density"] = args.density
    if merger.record.seeded:
        recipe["seed"] = args.seed
    if args.normalize:
        recipe["normalize"] = True
    if args.layer_scaling is not None:
        recipe["layer_scaling"] = args.layer_scaling
    result: dict[str, object] = {"output": args.output}
    weights: list[float] | None
    if args.choose_on:
        from embforge.evaluate.mix import evaluate_mix, parse_mix

        if args.weights:
            raise ValueError("give either --weights or --choose-on, not both")
        sweep = [
            sweep_weights(len(args.models), args.method, w) for w in args.grid
        ]  # refused before reading data
        parts = parse_mix(args.choose_on)
        table = []
        for w, point in zip(args.grid, sweep):
            merged = merger.merge(point)
            # any kind: evaluate_mix's evaluators take the kind's own (its record's) where it has one
            scores = evaluate_mix(cast("Embedder", merged), parts)
            table.append({"w": w, **scores})
        best = max(table, key=lambda row: row["mean"])
        _print_table(table, best, [p.label for p in parts])
        weights = sweep_weights(len(args.models), args.method, best["w"])
        result["table"] = table
        recipe["chosen_on"] = args.choose_on
    else:
        weights = args.weights
    model = merger.merge(weights)
    if merger.record.weights != "none":
        recipe["weights"] = weights if weights is not None else [1 / len(args.models)] * len(args.models)
    merger.save(args.output, recipe=recipe)
    record = kind_record(model)
    result.update({"method": args.method, "weights": recipe.get("weights"), "kind": record.kind.value})
    if not record.pair_scoring:  # a cross-encoder embeds nothing
        result["dim"] = cast("Embedder", model).dim
    return result


def _print_table(table: list[dict[str, float]], best: dict[str, float], labels: list[str]) -> None:
    header = ["w", *labels, "mean"]
    print("  ".join(f"{h:>12}" for h in header), file=sys.stderr)
    for row in table:
        mark = "  <- chosen" if row is best else ""
        print("  ".join(f"{row[h]:>12.2f}" for h in header) + mark, file=sys.stderr)
