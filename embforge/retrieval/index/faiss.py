"""FAISS indexes behind :class:`~embforge.retrieval.index.base.VectorIndex`: exact flat, HNSW, IVF-flat, IVF-PQ, fast-scan PQ.

All use inner product (cosine for normalised vectors). String ids map to FAISS's sequential positions.

=========  =====================================================  ============================================
kind       FAISS index                                            options (defaults)
=========  =====================================================  ============================================
``flat``   ``IndexFlatIP`` (exact)                                —
``hnsw``   ``IndexHNSWFlat(dim, m, METRIC_INNER_PRODUCT)``         ``m=32, ef_construction=200, ef_search=128``
``ivf``    ``IndexIVFFlat`` (k-means coarse quantiser)            ``nlist=4·√n, nprobe=16``
``ivfpq``  ``IndexIVFPQ`` (+ exact re-ranking of ``refine``·k)    ``nlist, nprobe, pq_m=dim/8, refine=4``
``pq``     ``IndexPQFastScan`` (4-bit codes, SIMD scan of all)    ``pq_m=dim/2, refine=10``
           + exact re-ranking of ``refine``·k (``IndexRefineFlat``)
=========  =====================================================  ============================================

``pq`` compares the query with every vector, but through 4-bit codes held in SIMD registers, then re-ranks the
best ``refine``·k with the exact vectors. It needs no neighbourhood structure, so it is the kind for data where
graphs and clusters cannot prune (near-uniform vectors, very high intrinsic dimension), and it builds in seconds.

IVF and PQ indexes train their quantiser on the vectors of the first ``add`` (which should therefore be the bulk of the
data, at least ``39 · nlist`` vectors for stable centroids; ``nlist`` is lowered to fit smaller data), or on a sample
given to :meth:`FaissIndex.train` first, so that a corpus can then be added a shard at a time.

Example:
    >>> import numpy as np
    >>> index = FaissIndex(4, kind="hnsw")
    >>> index.add(["a", "b"], np.eye(4, dtype=np.float32)[:2])
    >>> index.search(np.eye(4, dtype=np.float32)[1:2], 1)[1]
    [['b']]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embforge._optional import require
from embforge.retrieval.index.base import InMemoryIndex, read_ids, read_meta, write_listing
from embforge.retrieval.index.exact import check_queries, check_vectors

KINDS = ("flat", "hnsw", "ivf", "ivfpq", "pq")
DEFAULTS: dict[str, dict[str, Any]] = {
    "flat": {},
    "hnsw": {"m": 32, "ef_construction": 200, "ef_search": 128},
    "ivf": {"nlist": None, "nprobe": 16},
    "ivfpq": {"nlist": None, "nprobe": 16, "pq_m": None, "pq_bits": 8, "refine": 4},
    "pq": {"pq_m": None, "refine": 10},
}


class FaissIndex(InMemoryIndex):
    """A FAISS index of one of :data:`KINDS`; ``options`` override :data:`DEFAULTS` (unknown ones are an error)."""

    def __init__(self, dim: int, *, kind: str = "flat", **options: Any) -> None:
        self.faiss = require("faiss")
        if kind not in KINDS:
            raise ValueError(f"unknown FAISS index kind {kind!r}; choose one of {', '.join(KINDS)}")
        unknown = set(options) - set(DEFAULTS[kind])
        if unknown:
            known = ", ".join(DEFAULTS[kind]) or "none"
            raise ValueError(
                f"FAISS {kind} index: unknown option(s) {', '.join(sorted(unknown))}; known: {known}"
            )
        self.dim = int(dim)
        self.kind = kind
        self.options = {**DEFAULTS[kind], **options}
        if kind in ("pq", "ivfpq") and self.options["pq_m"]:
            self._pq_m(1)  # a pq_m that does not divide dim is an error now, not after the data is encoded
        self.ids: list[str] = []
        self._positions: dict[str, int] = {}
        self.index: Any = None
        if kind in ("flat", "hnsw"):
            self.index = self._build(0)

    def _build(self, n_train: int, total: int | None = None) -> Any:
        """The FAISS index, its quantiser sized for ``total`` vectors (default ``n_train``) and ``n_train``
        training vectors."""
        faiss, o = self.faiss, self.options
        ip = faiss.METRIC_INNER_PRODUCT
        if self.kind == "flat":
            return faiss.IndexFlatIP(self.dim)
        if self.kind == "hnsw":
            index = faiss.IndexHNSWFlat(self.dim, int(o["m"]), ip)
            index.hnsw.efConstruction = int(o["ef_construction"])
            index.hnsw.efSearch = int(o["ef_search"])
            return index
        if self.kind == "pq":
            o["pq_m"] = self._pq_m(2)
            fast_scan = faiss.IndexPQFastScan(self.dim, o["pq_m"], 4, ip)
            if not o["refine"]:
                return fast_scan
            refined = faiss.IndexRefineFlat(fast_scan)
            refined.k_factor = float(o["refine"])
            return refined
        nlist = int(o["nlist"] or max(1, round(4 * math.sqrt(total or n_train))))
        nlist = max(1, min(nlist, n_train // 39 or 1))
        o["nlist"] = nlist
        quantizer = faiss.IndexFlatIP(self.dim)
        if self.kind == "ivf":
            index = faiss.IndexIVFFlat(quantizer, self.dim, nlist, ip)
        else:
            o["pq_m"] = self._pq_m(8)
            index = faiss.IndexIVFPQ(quantizer, self.dim, nlist, o["pq_m"], int(o["pq_bits"]), ip)
        index.nprobe = min(int(o["nprobe"]), nlist)
        if self.kind == "ivfpq" and o["refine"]:
            index = faiss.IndexRefineFlat(index)
            index.k_factor = float(o["refine"])
        return index

    def _pq_m(self, dims_per_code: int) -> int:
        """The ``pq_m`` option (default: one sub-quantiser per ``dims_per_code`` dimensions); it must divide dim."""
        pq_m = int(self.options["pq_m"] or max(1, self.dim // dims_per_code))
        if self.dim % pq_m:
            raise ValueError(f"FAISS {self.kind}: pq_m={pq_m} must divide the dimension {self.dim}")
        return pq_m

    def train(self, sample: np.ndarray, *, total: int) -> None:
        """Train an IVF or PQ quantiser on ``sample`` (vectors drawn from the data) for an index that will hold
        ``total`` vectors, before the first :meth:`add`; then the data can be added in blocks of any size."""
        if self.index is not None:
            raise ValueError(f"FAISS {self.kind} index: already built; train it before the first add")
        array = check_queries(sample, self.dim, 1)
        self.index = self._build(len(array), total)
        self.index.train(array)

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        array = check_vectors(ids, vectors, self.dim, self._positions)
        if self.index is None:
            if not len(array):
                return
            self.train(array, total=len(array))
        self.index.add(array)
        for i in ids:
            self._positions[i] = len(self.ids)
            self.ids.append(i)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Top-``k`` per query. An approximate index may find fewer than ``k``; missing slots are dropped."""
        array = check_queries(queries, self.dim, k)
        k = min(k, len(self.ids))
        if k == 0:
            return np.empty((len(array), 0), dtype=np.float32), [[] for _ in range(len(array))]
        scores, positions = self.index.search(array, k)
        found = positions >= 0
        if not found.all():
            scores = np.where(found, scores, -np.inf).astype(np.float32)
        return scores, [[self.ids[p] for p in row if p >= 0] for row in positions]

    def has(self, key: str) -> bool:
        return key in self._positions

    def copy(self) -> FaissIndex:
        """An independent copy (FAISS ``clone_index``): the document store adds to it while this one serves."""
        other = FaissIndex.__new__(FaissIndex)
        other.faiss, other.dim, other.kind, other.options = (
            self.faiss,
            self.dim,
            self.kind,
            dict(self.options),
        )
        other.ids, other._positions = list(self.ids), dict(self._positions)
        other.index = None if self.index is None else self.faiss.clone_index(self.index)
        other.set_search_options()
        return other

    def snapshot(self) -> Callable[[Path], None]:
        data = None if self.index is None else self.faiss.serialize_index(self.index)  # a copy
        ids, meta = (
            list(self.ids),
            {"backend": "faiss", "dim": self.dim, "kind": self.kind, "options": dict(self.options)},
        )

        def write(folder: Path) -> None:
            if data is not None:
                np.asarray(data).tofile(folder / "index.faiss")
            write_listing(folder, ids, meta)

        return write

    @classmethod
    def load(cls, path: str | Path) -> FaissIndex:
        folder, meta = read_meta(path)
        index = cls(meta["dim"], kind=meta["kind"], **meta["options"])
        index.ids = read_ids(folder)
        index._positions = {i: n for n, i in enumerate(index.ids)}
        if (folder / "index.faiss").exists():
            index.index = index.faiss.read_index(str(folder / "index.faiss"))
        ntotal = 0 if index.index is None else index.index.ntotal
        if ntotal != len(index.ids):
            raise ValueError(f"{folder}: index.faiss holds {ntotal} vectors but the id file {len(index.ids)}")
        index.set_search_options()
        return index

    def set_search_options(
        self, *, ef_search: int | None = None, nprobe: int | None = None, refine: float | None = None
    ) -> None:
        """Change the speed/recall trade-off at search time: ``ef_search`` (HNSW), ``nprobe`` (IVF kinds),
        ``refine`` (PQ kinds: candidates re-ranked exactly, as a multiple of k)."""
        for name, value in (("ef_search", ef_search), ("nprobe", nprobe), ("refine", refine)):
            if value is not None:
                if name not in self.options:
                    raise ValueError(f"FAISS {self.kind} index has no search option {name!r}")
                self.options[name] = value
        if self.index is None:
            return
        if self.kind == "hnsw":
            self.index.hnsw.efSearch = int(self.options["ef_search"])
        if self.kind in ("ivf", "ivfpq"):
            ivf = self.faiss.extract_index_ivf(self.index)
            ivf.nprobe = min(int(self.options["nprobe"]), ivf.nlist)
        refined = self.faiss.downcast_index(self.index)
        if isinstance(refined, self.faiss.IndexRefine):
            refined.k_factor = float(self.options["refine"])

    def __len__(self) -> int:
        return len(self.ids)


def codes_index(kind: str, dim: int, sample: np.ndarray, *, total: int, **options: Any) -> tuple[Any, float]:
    """A bare FAISS ``ivfpq`` or ``pq`` index trained on ``sample`` for ``total`` vectors, holding codes only
    (no exact vectors inside: ``IndexRefineFlat`` would keep the whole float matrix in memory), and the re-ranking
    factor its options ask for. Its ids are the added vectors' positions; the caller adds the data in blocks and
    re-ranks ``refine · k`` candidates with the exact vectors read from where they are stored
    (:func:`embforge.retrieval.search.dense_candidates`)."""
    if kind not in ("ivfpq", "pq"):
        raise ValueError(f"a codes-only index is 'ivfpq' or 'pq', got {kind!r}")
    index = FaissIndex(dim, kind=kind, **options)
    refine = float(index.options["refine"] or 1)
    index.options["refine"] = 0
    index.train(sample, total=total)
    return index.index, refine
