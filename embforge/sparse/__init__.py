"""Sparse lexical retrievers (SPLADE): vocabulary-size vectors from a masked-language-model head.

- :mod:`embforge.sparse.model`: :class:`~embforge.sparse.model.SparseEncoder` (training forward, sparse
  ``encode``, the inference-free query table);
- :mod:`embforge.sparse.folder`: sentence-transformers ``SparseEncoder`` folders (read and write);
- :mod:`embforge.sparse.index`: an inverted index (scipy sparse matrix products) with top-k search;
- :mod:`embforge.sparse.stats`: sparsity statistics (active dimensions per text).

The ``splade`` loss lives with the other losses (:mod:`embforge.losses.splade`).
"""
