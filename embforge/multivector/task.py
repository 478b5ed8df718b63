"""A training task tokenised for a multi-vector model: the first text column as queries, the others as documents.

Queries get the ``[Q]`` marker and ``[MASK]`` augmentation, documents the ``[D]`` marker
(:meth:`~embforge.multivector.model.MultiVectorEncoder.tokenize_ids`). The rest is the bi-encoder task's
contract (:mod:`embforge.training.tasks`): ``inputs(rows)`` column after column, ``labels(rows)``,
``loss_fn(outputs, labels)`` splitting the ``(columns * rows, width, dim)`` token matrices back into columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from embforge.training.tasks import PreparedEmbeddingTask

if TYPE_CHECKING:
    from embforge.multivector.model import MultiVectorEncoder


class PreparedMultiVectorTask(PreparedEmbeddingTask):
    """A multi-vector task: the first text column tokenised as queries, the others as documents; fetching,
    batches, labels and the loss call are the bi-encoder task's."""

    model: MultiVectorEncoder

    def tokenize(self, column: int, texts: list[str]) -> list[list[int]]:
        """Token ids of ``texts`` of text column ``column``: queries for column 0, documents otherwise."""
        return self.model.tokenize_ids(texts, is_query=column == 0, prefix=self.prefixes[column])
