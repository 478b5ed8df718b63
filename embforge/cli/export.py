"""``embforge export onnx``: an ONNX graph (+ tokenizer, + optional int8) checked against PyTorch."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from embforge.cli.common import add_actions, add_model_arg
from embforge.cli.values import data_path, folder, positive_int, similarity


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    formats = add_actions(verbs, "export", help="export a model (ONNX)", description=__doc__, dest="format")
    onnx = formats.add_parser("onnx", help="ONNX graph with pooling/normalisation inside; parity-checked")
    add_model_arg(onnx, amp=False)
    onnx.add_argument("--output", type=folder, required=True, help="folder to write")
    onnx.add_argument("--quantize", choices=("int8",), default=None, help="also write a dynamic int8 graph")
    onnx.add_argument(
        "--dim", type=positive_int, default=None, help="bi-encoders: keep this many dimensions (Matryoshka)"
    )
    onnx.add_argument(
        "--min-cosine", type=similarity, default=0.9999, help="parity threshold (fp32 vs PyTorch), -1 to 1"
    )
    onnx.add_argument(
        "--parity-data",
        type=data_path,
        default=None,
        help="a .txt file (one sentence per line) for the parity check",
    )
    onnx.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="bi-encoders: texts, one a line, whose embedding ranges are saved with the export (the server's "
        "int8/uint8 outputs use them)",
    )
    onnx.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> Mapping[str, object]:
    from embforge.onnx.export import export_onnx
    from embforge.quantization import read_texts as read_calibration

    texts = None
    if args.parity_data:
        from embforge.cli.encode import read_texts

        texts = read_texts(args.parity_data, None)
    return export_onnx(
        args.model,
        args.output,
        quantize=args.quantize,
        dim=args.dim,
        parity_texts=texts,
        min_cosine=args.min_cosine,
        calibration=read_calibration(args.calibration) if args.calibration else None,
    )
