"""Retrieval data: a corpus, queries and graded relevance judgements (qrels), validated.

Two ways in:

* :func:`load_beir` reads a BEIR folder: ``corpus.jsonl`` (``_id, title, text``), ``queries.jsonl`` (``_id, text``)
  and ``qrels/<split>.tsv`` (``query-id, corpus-id, score`` with a header line);
* :func:`load_retrieval_files` reads the same from any CSV/TSV/JSONL files with a column mapping, e.g.
  ``corpus_columns={"doc_id": "_id", "abstract": "text"}``.

Every problem names the file and line: a qrels line naming an unknown document or query, duplicate ids, an empty
corpus, a non-integer grade.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from embforge.data.delimited import header_rows
from embforge.data.tables import DataError, Dataset
from embforge.files import read_jsonl
from embforge.ranges import NON_NEGATIVE_INT, POSITIVE_INT, check


@dataclass
class RetrievalData:
    """A corpus, queries and qrels. Documents keep the corpus order; ``qrels`` is ``{qid: {docid: grade}}``."""

    doc_ids: list[str]
    doc_texts: list[str]
    query_ids: list[str]
    query_texts: list[str]
    qrels: dict[str, dict[str, int]]
    doc_titles: list[str] = field(default_factory=list)
    name: str = ""

    def __post_init__(self) -> None:
        if not self.doc_titles:
            self.doc_titles = [""] * len(self.doc_ids)

    @property
    def documents(self) -> list[str]:
        """The text to embed for each document: ``title + " " + text`` (BEIR's convention)."""
        return [f"{t} {x}".strip() if t else x for t, x in zip(self.doc_titles, self.doc_texts)]

    def queries_with_qrels(self) -> RetrievalData:
        """Keep only the queries that have at least one judgement (what gets evaluated)."""
        keep = [i for i, q in enumerate(self.query_ids) if q in self.qrels]
        return self.subset_queries([self.query_ids[i] for i in keep])

    def subset(self, *, max_queries: int | None = None, max_corpus: int | None = None) -> RetrievalData:
        """A smaller set for a quick look, the same on every call: the first ``max_queries`` queries with qrels
        (all of them when ``None``) and, with ``max_corpus``, a corpus of their judged documents plus the first
        ``max_corpus`` others, in corpus order (the whole corpus when ``None``).

        Fewer documents means fewer distractors: scores on a cut corpus are higher than on the whole one, and
        only comparable with runs on the same cut.
        """
        check("max_queries", max_queries, POSITIVE_INT, optional=True)
        check("max_corpus", max_corpus, NON_NEGATIVE_INT, optional=True)
        judged = [q for q in self.query_ids if q in self.qrels]
        small = self.subset_queries(judged[:max_queries] if max_queries is not None else judged)
        if max_corpus is None:
            return small
        needed = {d for docs in small.qrels.values() for d in docs}
        others = [i for i, d in enumerate(self.doc_ids) if d not in needed][:max_corpus]
        keep = sorted({i for i, d in enumerate(self.doc_ids) if d in needed} | set(others))
        return RetrievalData(
            [self.doc_ids[i] for i in keep],
            [self.doc_texts[i] for i in keep],
            small.query_ids,
            small.query_texts,
            small.qrels,
            [self.doc_titles[i] for i in keep],
            self.name,
        )

    def subset_queries(self, query_ids: list[str]) -> RetrievalData:
        """The same corpus with only ``query_ids`` (in that order) and their qrels."""
        position = {q: i for i, q in enumerate(self.query_ids)}
        return RetrievalData(
            self.doc_ids,
            self.doc_texts,
            list(query_ids),
            [self.query_texts[position[q]] for q in query_ids],
            {q: self.qrels[q] for q in query_ids if q in self.qrels},
            self.doc_titles,
            self.name,
        )


def size_of(data: RetrievalData | Dataset) -> str:
    """``"688 queries, 5183 documents"`` (the queries with qrels), or a table's ``"873 rows"``."""
    if isinstance(data, RetrievalData):
        return f"{sum(q in data.qrels for q in data.query_ids)} queries, {len(data.doc_ids)} documents"
    return f"{len(data)} rows"


def load_beir(folder: str | os.PathLike, *, split: str = "test") -> RetrievalData:
    """Read a BEIR folder: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.

    Raises:
        FileNotFoundError: when a file is missing, listing the qrels splits that exist.
        DataError: for duplicate ids, an empty corpus, or qrels naming unknown ids (file:line).
    """
    root = Path(folder)
    qrels_file = root / "qrels" / f"{split}.tsv"
    for path in (root / "corpus.jsonl", root / "queries.jsonl"):
        if not path.exists():
            raise FileNotFoundError(
                f"{path} does not exist: a BEIR folder has corpus.jsonl, queries.jsonl, qrels/"
            )
    if not qrels_file.exists():
        splits = sorted(p.stem for p in (root / "qrels").glob("*.tsv")) if (root / "qrels").is_dir() else []
        raise FileNotFoundError(
            f"{qrels_file} does not exist; splits available: {', '.join(splits) or 'none'}"
        )
    return load_retrieval_files(
        root / "corpus.jsonl", root / "queries.jsonl", qrels_file, name=f"{root.name}/{split}"
    )


def load_retrieval_files(
    corpus: str | os.PathLike,
    queries: str | os.PathLike,
    qrels: str | os.PathLike,
    *,
    corpus_columns: Mapping[str, str] | None = None,
    query_columns: Mapping[str, str] | None = None,
    qrels_columns: Mapping[str, str] | None = None,
    name: str = "",
) -> RetrievalData:
    """Read corpus, queries and qrels from CSV/TSV/JSONL files.

    Args:
        corpus: rows with ``_id``, ``text`` and optionally ``title``.
        queries: rows with ``_id`` and ``text``.
        qrels: rows with ``query-id``, ``corpus-id`` and optionally ``score`` (default 1); a TSV/CSV needs a header.
        corpus_columns: ``{source column: standard name}`` for the corpus (standard: ``_id``, ``title``, ``text``).
        query_columns: the same for the queries (``_id``, ``text``).
        qrels_columns: the same for the qrels (``query-id``, ``corpus-id``, ``score``).
        name: a label for reports.
    """
    doc_ids, titles, texts = read_texts(Path(corpus), corpus_columns, with_title=True, kind="corpus")
    if not doc_ids:
        raise DataError(f"{corpus}:1: the corpus is empty: retrieval needs at least one document")
    query_ids, _, query_texts = read_texts(Path(queries), query_columns, with_title=False, kind="queries")
    judged = _read_qrels(Path(qrels), qrels_columns, set(doc_ids), set(query_ids))
    return RetrievalData(doc_ids, texts, query_ids, query_texts, judged, titles, name)


def _rows(path: Path, mapping: Mapping[str, str] | None) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line, {standard name: value})`` for each row of a JSONL/CSV/TSV file."""
    mapping = dict(mapping or {})
    if not path.exists():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")

    def rename(line: int, row: Mapping[str, object]) -> dict[str, str]:
        named: dict[str, str] = {}
        for key, value in row.items():
            name = mapping.get(key, key)
            if name in named:
                raise DataError(f"{path}:{line}: two columns become {name!r} (check the column mapping)")
            named[name] = "" if value is None else str(value)
        return named

    rows = read_jsonl(path) if path.suffix.lower() in (".jsonl", ".json") else header_rows(path)
    for line, row in rows:
        yield line, rename(line, row)


def read_texts(
    path: Path, mapping: Mapping[str, str] | None, *, with_title: bool, kind: str
) -> tuple[list[str], list[str], list[str]]:
    """``(ids, titles, texts)`` of a corpus or queries file (``kind`` names it in errors); duplicate ids are an
    error."""
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    seen: dict[str, int] = {}
    for line, row in _rows(path, mapping):
        for needed in ("_id", "text"):
            if needed not in row:
                raise DataError(
                    f"{path}:{line}: {kind} row has no {needed!r} field (has {', '.join(row) or 'none'}); "
                    f"map yours with a column mapping, e.g. {{'doc_id': '_id'}}"
                )
        doc_id = row["_id"].strip()
        if not doc_id:
            raise DataError(f"{path}:{line}: empty '_id' in {kind}")
        if doc_id in seen:
            raise DataError(f"{path}:{line}: duplicate {kind} id {doc_id!r} (first on line {seen[doc_id]})")
        seen[doc_id] = line
        title = row.get("title", "").strip() if with_title else ""
        text = row["text"].strip()
        if not text and not title:
            raise DataError(f"{path}:{line}: {kind} entry {doc_id!r} has an empty text")
        ids.append(doc_id)
        titles.append(title)
        texts.append(text)
    return ids, titles, texts


def _read_qrels(
    path: Path, mapping: Mapping[str, str] | None, doc_ids: set[str], query_ids: set[str]
) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for line, row in _rows(path, mapping):
        for needed in ("query-id", "corpus-id"):
            if needed not in row:
                raise DataError(
                    f"{path}:{line}: qrels row has no {needed!r} column (has {', '.join(row)}); "
                    "a qrels file needs a header 'query-id<TAB>corpus-id<TAB>score'"
                )
        qid, did = row["query-id"].strip(), row["corpus-id"].strip()
        if qid not in query_ids:
            raise DataError(f"{path}:{line}: qrels name query {qid!r}, which is not in the queries file")
        if did not in doc_ids:
            raise DataError(f"{path}:{line}: qrels name document {did!r}, which is not in the corpus")
        raw = row.get("score", "1").strip() or "1"
        try:
            grade = int(float(raw))
        except ValueError:
            raise DataError(f"{path}:{line}: qrels score {raw!r} is not an integer grade") from None
        if float(raw) != grade:
            raise DataError(f"{path}:{line}: qrels score {raw!r} is not an integer grade")
        qrels.setdefault(qid, {})[did] = grade
    if not qrels:
        raise DataError(f"{path}:1: the qrels file has no judgements")
    return qrels


def training_pairs(data: RetrievalData) -> Dataset:
    """``anchor, positive`` rows (query text, relevant document text), one per relevant (query, document)."""
    position = {d: i for i, d in enumerate(data.doc_ids)}
    documents = data.documents
    anchors, positives = [], []
    for qid, text in zip(data.query_ids, data.query_texts):
        for did, grade in data.qrels.get(qid, {}).items():
            if grade > 0:
                anchors.append(text)
                positives.append(documents[position[did]])
    return Dataset(
        data.name or "retrieval",
        {"anchor": anchors, "positive": positives},
        list(range(1, len(anchors) + 1)),
    )
