"""Sparsity statistics of sparse vectors: how many dimensions each text activates.

Example:
    >>> import scipy.sparse as sp
    >>> sparsity_stats(sp.csr_matrix([[0, 1.0, 2.0, 0], [3.0, 0, 0, 0]]))["active_dims_mean"]
    1.5
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def sparsity_stats(vectors: sp.spmatrix | sp.sparray) -> dict[str, float]:
    """Active (non-zero) dimensions per text — mean, median, min, max — and the mean fraction of the vocabulary
    that is zero (``sparsity``)."""
    matrix = sp.csr_matrix(vectors)
    matrix.eliminate_zeros()
    active = np.diff(matrix.indptr).astype(np.float64)
    if active.size == 0:
        return {
            "active_dims_mean": 0.0,
            "active_dims_median": 0.0,
            "active_dims_min": 0.0,
            "active_dims_max": 0.0,
            "sparsity": 1.0,
        }
    return {
        "active_dims_mean": float(active.mean()),
        "active_dims_median": float(np.median(active)),
        "active_dims_min": float(active.min()),
        "active_dims_max": float(active.max()),
        "sparsity": float(1.0 - active.mean() / matrix.shape[1]),
    }
