"""Retrieval: BEIR-style corpus/queries/qrels, corpus encoding to disk, search runs."""

from embforge.retrieval.data import RetrievalData, load_beir, load_retrieval_files

__all__ = ["RetrievalData", "load_beir", "load_retrieval_files"]
