"""SciFact (BEIR ``scifact``) from ``<data root>/scifact``: claims CSV + corpus CSV + train qrels.

Files (see ``SOURCE.md`` there): ``corpus_train.csv`` (``doc_id, title, abstract, structured``; ``abstract`` is
a Python-list-looking literal of sentences, joined here with spaces), ``claims_train.csv`` (``id, claim, ...``;
one row per evidence document, so ids repeat) and ``qrels/train.tsv`` (809 queries, 919 judgements).

Only the train qrels ship here, so a **dev split is carved from the train queries**, deterministically and
independently of file order: a query goes to ``dev`` when ``md5(query id) % 8 == 0`` (121 of the 809 queries),
else to ``train`` (688). ``split="all"`` keeps every query.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import os
import tokenize
from pathlib import Path

from embforge.data.paths import data_root
from embforge.data.retrieval import RetrievalData
from embforge.data.tables import DataError

SPLITS = ("train", "dev", "all")
CORPUS_FILE = "corpus_train.csv"


def is_scifact_folder(root: str | os.PathLike) -> bool:
    """Whether ``root`` is SciFact in the layout shipped here (not a BEIR folder)."""
    return (Path(root) / CORPUS_FILE).exists()


def scifact_dir(root: str | os.PathLike | None = None) -> Path:
    """The SciFact folder (``<data root>/scifact`` unless ``root`` is given)."""
    path = Path(root) if root is not None else data_root() / "scifact"
    if not is_scifact_folder(path):
        raise FileNotFoundError(
            f"SciFact not found in {path}: expected corpus_train.csv, claims_train.csv and qrels/train.tsv "
            "(set EMBFORGE_DATA to the folder holding 'scifact')"
        )
    return path


def split_of(query_id: str) -> str:
    """``"dev"`` for about 1 query in 8 (by the md5 of its id), else ``"train"``."""
    return "dev" if int(hashlib.md5(query_id.encode()).hexdigest(), 16) % 8 == 0 else "train"


def join_sentences(literal: str) -> str:
    """``"['First.'\\n 'Second.']"`` -> ``"First. Second."`` (the CSV's list repr has no commas between items)."""
    parts = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(literal).readline):
            if token.type == tokenize.STRING:
                parts.append(_string_value(token.string))
    except (tokenize.TokenError, SyntaxError):
        return literal.strip()
    return " ".join(p.strip() for p in parts if p.strip()) if parts else literal.strip()


def _string_value(token: str) -> str:
    return str(ast.literal_eval(token))


def load_scifact(split: str = "dev", *, root: str | os.PathLike | None = None) -> RetrievalData:
    """The SciFact corpus (5,183 abstracts) with the queries of ``split`` (``train``, ``dev`` or ``all``)."""
    if split not in SPLITS:
        raise ValueError(f"unknown SciFact split {split!r}; choose one of {', '.join(SPLITS)}")
    folder = scifact_dir(root)
    doc_ids, titles, texts = [], [], []
    with (folder / "corpus_train.csv").open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            doc_ids.append(row["doc_id"].strip())
            titles.append(row["title"].strip())
            texts.append(join_sentences(row["abstract"]))
    claims: dict[str, str] = {}
    with (folder / "claims_train.csv").open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            claims.setdefault(row["id"].strip(), row["claim"].strip())
    qrels_path = folder / "qrels" / "train.tsv"
    known_docs = set(doc_ids)
    qrels: dict[str, dict[str, int]] = {}
    with qrels_path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t")
        for row in reader:
            qid, did = row["query-id"].strip(), row["corpus-id"].strip()
            if qid not in claims or did not in known_docs:
                missing = f"query {qid!r}" if qid not in claims else f"document {did!r}"
                raise DataError(f"{qrels_path}:{reader.line_num}: qrels name unknown {missing}")
            if split == "all" or split_of(qid) == split:
                qrels.setdefault(qid, {})[did] = int(row["score"])
    query_ids = sorted(qrels, key=int)
    return RetrievalData(
        doc_ids, texts, query_ids, [claims[q] for q in query_ids], qrels, titles, name=f"scifact/{split}"
    )
