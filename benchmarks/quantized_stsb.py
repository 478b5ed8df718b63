"""STS-B test Spearman of quantised outputs (``encoding_format`` int8/uint8/binary/ubinary) against float, MiniLM.

The codes are those the server returns (:func:`embforge.quantization.quantize`, sentence-transformers'
``quantize_embeddings`` semantics); int8/uint8 use ranges calibrated on 1,000 STS-B *train* sentences (what
``embforge serve --calibration`` does). Similarity of two codes: cosine of the int8/uint8 values, and for the binary
formats the cosine of the ±1 sign vectors (1 - 2 · Hamming / dim).

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/quantized_stsb.py
"""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    from embforge.data.paths import data_root
    from embforge.data.tables import read_table
    from embforge.encoder import Encoder
    from embforge.evaluate.similarity import correlations
    from embforge.quantization import calibrate, quantize, unpack_bits

    columns = "0=sentence1,1=sentence2,2=score"
    test = read_table(data_root() / "stsb_en" / "stsb-en-test.csv", header=None, columns=columns)
    train = read_table(data_root() / "stsb_en" / "stsb-en-train.csv", header=None, columns=columns)
    model = Encoder.load("all-MiniLM-L6-v2")
    ranges = calibrate(model, list(dict.fromkeys(train.columns["sentence1"]))[:1000])
    a, b = model.encode(test.columns["sentence1"]), model.encode(test.columns["sentence2"])
    labels = np.asarray(test.labels(), dtype=np.float64)

    def cosine(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        x, y = x.astype(np.float64), y.astype(np.float64)
        return (x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)

    print("| encoding_format | STS-B test Spearman | vs float |")
    print("|---|---:|---:|")
    base = correlations(cosine(a, b), labels)["spearman"]
    print(f"| float | {base:.2f} | — |")
    for precision in ("int8", "uint8", "binary", "ubinary"):
        qa, qb = quantize(a, precision, ranges), quantize(b, precision, ranges)
        if precision.endswith("binary"):
            qa, qb = unpack_bits(qa, a.shape[1]) * 2.0 - 1, unpack_bits(qb, b.shape[1]) * 2.0 - 1
        score = correlations(cosine(qa, qb), labels)["spearman"]
        print(f"| {precision} | {score:.2f} | {score - base:+.2f} |")


if __name__ == "__main__":
    main()
