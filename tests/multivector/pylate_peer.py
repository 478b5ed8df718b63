"""Run by pylate's own interpreter (``.bench-venvs/pylate``) from the parity tests: pylate's side of each check.

``encode FOLDER OUT.npz``: pylate encodes the shared queries and documents (token vectors per text);
``create HF_FOLDER OUT_FOLDER DIM``: pylate starts a ColBERT model on an encoder folder and saves it;
``plaid OUT.npz``: embforge's PLAID index (fast-plaid lives in this interpreter) against exact MaxSim.
"""

from __future__ import annotations

import sys

import numpy as np

QUERIES = ["a cat plays", "the dog runs in the park ?", "oil price falls"]
DOCS = ["a cat plays the piano.", "a dog runs, kicks a ball!", "the stock market rises", "oil price falls"]


def encode(folder: str, out: str) -> None:
    from pylate import models

    model = models.ColBERT(folder, device="cpu")
    queries = model.encode(QUERIES, is_query=True, convert_to_numpy=True)
    docs = model.encode(DOCS, is_query=False, convert_to_numpy=True)
    arrays = {f"q{i}": np.asarray(m) for i, m in enumerate(queries)}
    arrays.update({f"d{i}": np.asarray(m) for i, m in enumerate(docs)})
    np.savez(out, **arrays)


def create(folder: str, out: str, dim: str) -> None:
    import torch
    from pylate import models

    torch.manual_seed(0)
    models.ColBERT(folder, device="cpu", embedding_size=int(dim), query_length=8, document_length=24).save(
        out
    )


def plaid(out: str) -> None:
    from embforge.multivector.search import ExactMaxSimIndex, PlaidIndex

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((40, 16)).astype("float32")  # clustered tokens, as real token vectors are
    docs = [
        centres[rng.integers(0, 40, rng.integers(8, 30))] + 0.05 * rng.standard_normal((1, 16))
        for _ in range(400)
    ]
    docs = [(d / np.linalg.norm(d, axis=1, keepdims=True)).astype("float32") for d in docs]
    queries = [d[:6] for d in docs[:30]]
    ids = [f"d{i}" for i in range(len(docs))]
    exact, approximate = ExactMaxSimIndex(), PlaidIndex()
    exact.add(ids, docs)
    approximate.add(ids, docs)
    _, exact_ids = exact.search(queries, 10)
    _, plaid_ids = approximate.search(queries, 10)
    approximate.close()
    np.savez(out, exact=np.array(exact_ids), plaid=np.array(plaid_ids))


if __name__ == "__main__":
    {"encode": encode, "create": create, "plaid": plaid}[sys.argv[1]](*sys.argv[2:])
