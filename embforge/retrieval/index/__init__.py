"""Vector indexes: exact (numpy), FAISS (flat / HNSW / IVF / PQ) and Qdrant, behind one small interface and one
registry (:mod:`embforge.retrieval.index.registry`)."""
