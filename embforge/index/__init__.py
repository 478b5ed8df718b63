"""Vector indexes: exact (numpy), FAISS (flat / HNSW / IVF-PQ) and Qdrant, behind one small interface."""

from embforge.index.base import VectorIndex

__all__ = ["VectorIndex"]
