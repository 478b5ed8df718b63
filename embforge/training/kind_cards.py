"""The model-card section of each kind with its own facts and usage (named by its record's ``card``,
:mod:`embforge.kinds`): the facts table, the dimension and a usage snippet :mod:`embforge.training.model_card`
writes for a saved folder of that kind."""

from __future__ import annotations

from pathlib import Path

from embforge.training.report import read_json


def sparse_card(root: Path) -> dict[str, object]:
    """A sparse (SPLADE) folder's facts and usage."""
    name = root.resolve().name
    router = (root / "router_config.json").exists()
    pooling = read_json(root / ("document_1_SpladePooling" if router else "1_SpladePooling") / "config.json")
    dim = pooling.get("word_embedding_dimension") or pooling.get("embedding_dimension")
    table = {
        "Model type": "sparse encoder (SPLADE" + (", inference-free queries)" if router else ")"),
        "Output dimensionality": f"{dim} (the vocabulary; a few dozen to a few hundred active per text)",
        "Pooling": f"{pooling.get('pooling_strategy', 'max')} of log(1 + relu(MLM logits))",
        "Similarity": "dot product",
    }
    usage = [
        "from embforge.sparse.model import SparseEncoder",
        f'model = SparseEncoder.load("{name}")',
        'docs = model.encode_document(["The sun is 4.6 billion years old."])  # scipy.sparse CSR',
        'scores = model.encode_query(["how old is the sun"]) @ docs.T',
        "# or: sentence_transformers.SparseEncoder(...) with the same vectors",
    ]
    return {"kind": "sparse encoder", "dim": dim, "table": table, "usage": usage}


def multivector_card(root: Path) -> dict[str, object]:
    """A multi-vector (ColBERT) folder's facts and usage."""
    name, st = root.resolve().name, read_json(root / "config_sentence_transformers.json")
    dense = read_json(root / "1_Dense" / "config.json")
    table = {
        "Model type": "multi-vector (ColBERT late interaction; pylate layout)",
        "Output dimensionality": f"{dense.get('out_features', '?')} per token",
        "Query / document length": f"{st.get('query_length')} ([MASK]-augmented) / {st.get('document_length')}",
        "Similarity": "MaxSim (sum over query tokens of the best document-token dot product)",
    }
    usage = [
        "from embforge.multivector import MultiVectorEncoder, maxsim, pad_matrices",
        f'model = MultiVectorEncoder.load("{name}")',
        'docs = model.encode_padded(["The sun is 4.6 billion years old."])[0]',
        'scores = maxsim(model.encode_padded(["how old is the sun"], is_query=True)[0], docs)',
        "# or: pylate.models.ColBERT(...) with the same token vectors",
    ]
    facts = {"kind": "multi-vector model", "dim": dense.get("out_features"), "table": table}
    return {**facts, "usage": usage}


def static_card(root: Path) -> dict[str, object]:
    """A static embedding folder's facts and usage."""
    name, st = root.resolve().name, read_json(root / "config_sentence_transformers.json")
    hf = read_json(root / "config.json")
    table = {
        "Model type": "static embedding (token table, mean of the tokens' rows; no transformer)",
        "Output dimensionality": hf.get("hidden_dim", "?"),
        "Normalized": "yes" if hf.get("normalize", True) else "no",
        "Similarity": st.get("similarity_fn_name", "cosine"),
    }
    usage = [
        "from embforge.static.model import StaticEncoder",
        f'model = StaticEncoder.load("{name}")',
        'embeddings = model.encode(["The weather is lovely today.", "It is sunny outside."])',
        "# or: sentence_transformers.SentenceTransformer(...) / model2vec.StaticModel.from_pretrained(...)",
    ]
    return {"kind": "static embedding model", "dim": hf.get("hidden_dim"), "table": table, "usage": usage}
