"""Run by pylate's own interpreter (``.bench-venvs/pylate``) from tests/multivector/test_pooling.py: pylate pools the
token matrices of ``IN.npz`` (``d0``, ``d1`` ...) at ``FACTOR`` and writes them to ``OUT.npz`` under the same names.

``python pylate_pooling_peer.py IN.npz FACTOR OUT.npz``
"""

from __future__ import annotations

import sys

import numpy as np


def pool(inputs: str, factor: str, out: str) -> None:
    import torch
    from pylate import models

    saved = np.load(inputs)
    names = sorted(saved.files, key=lambda name: int(name[1:]))
    docs = [torch.from_numpy(saved[name]) for name in names]
    # the method reads nothing of the model: pylate's definition, called on its class
    pooled = models.ColBERT.pool_embeddings_hierarchical(
        None, docs, pool_factor=int(factor), protected_tokens=1
    )
    np.savez(out, **{name: matrix.numpy() for name, matrix in zip(names, pooled)})


if __name__ == "__main__":
    pool(*sys.argv[1:])
