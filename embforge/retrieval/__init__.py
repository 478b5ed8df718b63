"""Retrieval: vector indexes behind one registry (exact, FAISS, Qdrant), dense candidate search, hard-negative
mining, the corpus-encoding cache, and two-stage retrieve-then-rerank."""
