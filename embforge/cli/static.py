"""``embforge distill-static``: a static embedding model (a token table, no transformer) distilled from a
transformer by model2vec (vocabulary distillation, PCA, Zipf weighting); ``pip install 'embforge[static]'``.

The folder loads in embforge (``--model-type static`` trains it further), model2vec and sentence-transformers.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from embforge.cli.values import device, folder, non_negative_float, non_negative_int


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "distill-static", help="distil a transformer into a static embedding model", description=__doc__
    )
    parser.add_argument("--model", required=True, help="transformer folder or alias, e.g. all-MiniLM-L6-v2")
    parser.add_argument("--output", type=folder, required=True, help="folder for the static model")
    parser.add_argument(
        "--pca-dims",
        type=non_negative_int,
        default=256,
        help="dimensions kept by PCA, 0 = no PCA (default 256)",
    )
    parser.add_argument(
        "--sif-coefficient",
        type=non_negative_float,
        default=1e-4,
        help="Zipf weighting a / (a + p(token)); 0 = none (default 1e-4)",
    )
    parser.add_argument(
        "--device",
        type=device,
        default="cpu",
        help="device of the transformer's forward passes (default cpu)",
    )
    parser.set_defaults(func=run_distill_static)


def run_distill_static(args: argparse.Namespace) -> Mapping[str, object]:
    from embforge.static.distill import distill_static
    from embforge.static.model import StaticEncoder

    out = distill_static(
        args.model,
        args.output,
        pca_dims=args.pca_dims or None,
        sif_coefficient=args.sif_coefficient or None,
        device=args.device,
    )
    model = StaticEncoder.load(out)
    return {"output": str(out), "dim": model.dim, "vocabulary": model.embedding.num_embeddings}
