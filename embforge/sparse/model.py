"""SparseEncoder: a masked-language-model head turned into a sparse lexical vector per text (SPLADE).

Each token's MLM logits over the vocabulary go through ``log(1 + relu(logits))`` and are max-pooled (or summed)
over the text's tokens: a vocabulary-size vector whose non-zero entries are the terms the text is "about",
including expansion terms it does not contain (Formal et al., 2021, "SPLADE v2"). Scores are dot products.

The inference-free variant (Geng et al., 2024) sends documents through the MLM encoder but queries through a
learned weight per vocabulary token: a query's vector is ``weight[t]`` for each distinct token ``t`` it contains,
so encoding a query costs a tokeniser call and a lookup. In training, the query column's token ids are marked
with :class:`QueryIds` by ``tokenize_ids(..., is_query=True)`` (the training tasks and the server ask every kind
for a query column's ids that way), and the forward routes them to the table.

In training the forward returns dense ``(n, vocab)`` tensors (the losses need gradients through every entry);
:meth:`SparseEncoder.encode` returns a ``scipy.sparse.csr_matrix`` (only the active dimensions are stored).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor, nn

from embforge.kinds import ModelKind
from embforge.modeling.module import TextModule
from embforge.modeling.padding import CHUNK_TOKENS, in_length_chunks, pad_ids, sort_by_length
from embforge.modeling.tokenizing import PromptTokenizing
from embforge.progress import progress_bar, progress_enabled
from embforge.sparse.folder import SparseParts, read_sparse_folder, write_sparse_folder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from typing_extensions import Unpack

    from embforge.protocols import BatchOptions, LoadOptions, ModelPath

POOLINGS = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")


class QueryIds(list):  # type: ignore[type-arg]
    """A query's token ids: an inference-free model sends these through its query weight table."""


def splade_pool(
    logits: Tensor, attention_mask: Tensor, *, pooling: str = "max", activation: str = "relu"
) -> Tensor:
    """``(batch, seq, vocab)`` MLM logits -> ``(batch, vocab)``: ``log1p(relu(logits))`` pooled over real tokens.

    ``activation="log1p_relu"`` applies ``log1p`` once more (OpenSearch's SPLADE models). Padding positions
    count as 0, which neither max nor sum pooling of non-negative values can pick up.
    """
    x = torch.log1p(torch.relu(logits * attention_mask.unsqueeze(-1).to(logits.dtype)))
    if activation == "log1p_relu":
        x = torch.log1p(x)
    return x.amax(dim=1) if pooling == "max" else x.sum(dim=1)


class SparseEncoder(PromptTokenizing, TextModule):
    """A SPLADE model: texts -> sparse vocabulary-size vectors, scored by dot product.

    Example:
        >>> model = SparseEncoder.load("naver/splade-v3")  # doctest: +SKIP
        >>> model.encode_document(["a cat sat"]).nnz  # doctest: +SKIP
        117
    """

    kind: ClassVar[ModelKind] = ModelKind.SPARSE
    special: Tensor  # ids that are never a query's term: those added around a text, and padding (a buffer)

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        pooling: str = "max",
        activation: str = "relu",
        max_seq_length: int = 256,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
        query_weights: Tensor | None = None,
        freeze_query_weights: bool = False,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS or activation not in ACTIVATIONS:
            raise ValueError(
                f"SPLADE pooling must be one of {POOLINGS} and activation one of {ACTIVATIONS}; "
                f"got {pooling!r}, {activation!r}"
            )
        self.backbone = backbone  # a Hugging Face ...ForMaskedLM model
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.activation = activation
        self.max_seq_length = max_seq_length
        self.prompts = dict(prompts or {})
        self.default_prompt_name = default_prompt_name
        self.query_weights = (
            None
            if query_weights is None
            else nn.Parameter(query_weights.float().clone(), requires_grad=not freeze_query_weights)
        )
        added = {*tokenizer("")["input_ids"], self.pad_token_id}  # e.g. [CLS], [SEP] and [PAD]
        special = torch.zeros(self.dim, dtype=torch.bool)
        special[[i for i in added if 0 <= i < self.dim]] = True
        self.register_buffer("special", special, persistent=False)

    @property
    def dim(self) -> int:
        """The vocabulary size (the length of every vector)."""
        return int(self.backbone_config.vocab_size)

    @property
    def inference_free(self) -> bool:
        """Whether queries go through the per-token weight table instead of the MLM encoder."""
        return self.query_weights is not None

    def tokenize_ids(
        self, texts: Sequence[str], *, prefix: str = "", is_query: bool = False
    ) -> list[list[int]]:
        """Token ids of each text; an inference-free model's queries (``is_query``) marked as :class:`QueryIds`,
        which its forward sends through the query weight table."""
        ids = super().tokenize_ids(texts, prefix=prefix)
        return [QueryIds(x) for x in ids] if is_query and self.inference_free else ids

    # ------------------------------------------------------------------ forward (TextModule.forward)
    def forward_ids(
        self, ids: Sequence[Sequence[int]], *, max_tokens: int | None, seed: int | None, places: list[int]
    ) -> Tensor:
        """Sparse vectors of token-id lists as a dense ``(n, vocab)`` float tensor, in the input order:
        :class:`QueryIds` items through the query table of an inference-free model, the others through the MLM in
        length-sorted padded chunks of at most ``max_tokens`` tokens (documents)."""
        # each chunk's MLM logits are (tokens, vocab) floats: cap them at 2^27 (512 MiB), whatever the budget
        max_tokens = min(max_tokens or CHUNK_TOKENS, max(self.max_seq_length, (1 << 27) // self.dim))
        queries = [i for i, x in enumerate(ids) if isinstance(x, QueryIds)] if self.inference_free else []
        if not queries:
            return self._documents(ids, max_tokens=max_tokens, seed=seed, places=places)
        chosen = set(queries)
        documents = [i for i in range(len(ids)) if i not in chosen]
        out = torch.zeros(len(ids), self.dim, device=self.device)
        out = out.index_copy(0, self._rows(queries), self.query_vectors([ids[i] for i in queries]))
        if documents:
            docs = self._documents(
                [ids[i] for i in documents],
                max_tokens=max_tokens,
                seed=seed,
                places=[places[i] for i in documents],
            )
            out = out.index_copy(0, self._rows(documents), docs)
        return out

    def _rows(self, rows: list[int]) -> Tensor:
        return torch.as_tensor(rows, dtype=torch.long, device=self.device)

    def _documents(
        self, ids: Sequence[Sequence[int]], *, max_tokens: int, seed: int | None, places: Sequence[int]
    ) -> Tensor:
        return in_length_chunks(
            ids,
            max_tokens,
            lambda chunk: self.padded_forward(*pad_ids(chunk, self.pad_token_id, device=self.device)),
            seed=seed,
            places=places,
        )

    def padded_forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Documents' sparse vectors from a padded id tensor (inference and export)."""
        logits = self.backbone(input_ids=input_ids, attention_mask=attention_mask).logits
        return splade_pool(logits.float(), attention_mask, pooling=self.pooling, activation=self.activation)

    def query_vectors(self, ids: Sequence[Sequence[int]]) -> Tensor:
        """Inference-free queries: ``weight[t]`` for each distinct non-special token ``t`` of each query."""
        assert self.query_weights is not None, "query_vectors needs an inference-free model"
        input_ids, mask = pad_ids(ids, self.pad_token_id, device=self.device)
        present = (mask.bool() & ~self.special[input_ids]).float()
        presence = torch.zeros(len(ids), self.dim, device=self.device)
        presence = presence.scatter_reduce(1, input_ids, present, "amax")
        return presence * self.query_weights

    # ------------------------------------------------------------------ inference
    def encode(
        self,
        texts: str | Sequence[str],
        *,
        batch_size: int = 32,
        query: bool = False,
        prompt: str | None = None,
        prompt_name: str | None = None,
        show_progress: bool | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> sp.csr_matrix:
        """Sparse vectors of ``texts``: an ``(n, vocab)`` float32 ``csr_matrix`` (only active dimensions stored).

        ``query=True`` encodes queries: through the query table of an inference-free model, and with the
        model's ``"query"`` prompt when it has one and no other prompt is given.
        """
        batch = [texts] if isinstance(texts, str) else list(texts)
        if prompt is None and prompt_name is None and query and "query" in self.prompts:
            prompt_name = "query"
        enabled = progress_enabled(show_progress, steps=(len(batch) + batch_size - 1) // batch_size)
        bar = progress_bar(total=len(batch), desc="encode", unit="text", enabled=enabled)
        parts: list[sp.csr_matrix] = []
        with self.inference():
            ids = self.tokenize_ids(batch, prefix=self.prompt_text(prompt, prompt_name))
            order = sort_by_length(ids)
            for start in range(0, len(ids), batch_size):
                chunk = [ids[i] for i in order[start : start + batch_size]]
                dense = (
                    self.query_vectors(chunk)
                    if query and self.inference_free
                    else self._encode_documents(chunk)
                )
                parts.append(sp.csr_matrix(dense.float().cpu().numpy()))
                bar.update(len(chunk))
                if on_batch is not None:
                    on_batch(len(chunk))
        bar.close()
        if not parts:
            return sp.csr_matrix((0, self.dim), dtype=np.float32)
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[np.asarray(order)] = np.arange(len(order))
        return sp.csr_matrix(sp.vstack(parts, format="csr")[inverse], dtype=np.float32)

    def _encode_documents(self, ids: Sequence[Sequence[int]]) -> Tensor:
        return self.padded_forward(*pad_ids(ids, self.pad_token_id, device=self.device))

    def encode_query(self, texts: str | Sequence[str], **options: Unpack[BatchOptions]) -> sp.csr_matrix:
        """:meth:`encode` with ``query=True``."""
        return self.encode(texts, query=True, **options)

    def encode_document(self, texts: str | Sequence[str], **options: Unpack[BatchOptions]) -> sp.csr_matrix:
        """:meth:`encode` of documents (the ``"document"`` prompt when the model has one)."""
        if (
            options.get("prompt") is None
            and options.get("prompt_name") is None
            and "document" in self.prompts
        ):
            options["prompt_name"] = "document"
        return self.encode(texts, **options)

    def decode(
        self, vector: sp.csr_matrix | sp.csr_array, *, top_k: int | None = None
    ) -> list[tuple[str, float]]:
        """The tokens and weights of one sparse vector (one row), largest weight first."""
        row = sp.csr_matrix(vector)
        order = np.argsort(-row.data)[:top_k]
        tokens = self.tokenizer.convert_ids_to_tokens(row.indices[order].tolist())
        return list(zip(tokens, row.data[order].tolist()))

    # ------------------------------------------------------------------ persistence (sparse/folder.py)
    @classmethod
    def load(
        cls, path: ModelPath, *, inference_free: bool | None = None, **options: Unpack[LoadOptions]
    ) -> SparseEncoder:
        """Load a sentence-transformers ``SparseEncoder`` folder (plain or inference-free ``Router``), or a
        Hugging Face ``...ForMaskedLM`` folder (max pooling, ReLU). ``inference_free=True`` on a folder without
        a query table adds one (all weights 1) for training; ``options``: ``device``, ``max_seq_length``."""
        parts = read_sparse_folder(
            path, max_seq_length=options.get("max_seq_length"), inference_free=inference_free
        )
        model = cls(
            parts.backbone,
            parts.tokenizer,
            pooling=parts.pooling,
            activation=parts.activation,
            max_seq_length=parts.max_seq_length,
            prompts=parts.prompts,
            default_prompt_name=parts.default_prompt_name,
            query_weights=parts.query_weights,
            freeze_query_weights=parts.frozen,
        )
        return model.loaded_from(path, device=options.get("device"))

    def save(self, path: str | os.PathLike) -> None:
        """Write a sentence-transformers ``SparseEncoder`` folder (loads with ``SparseEncoder(path)``)."""
        weights = self.query_weights
        parts = SparseParts(
            self.backbone,
            self.tokenizer,
            pooling=self.pooling,
            activation=self.activation,
            max_seq_length=self.max_seq_length,
            prompts=self.prompts,
            default_prompt_name=self.default_prompt_name,
            query_weights=None if weights is None else weights.detach(),
            frozen=weights is not None and not weights.requires_grad,
        )
        write_sparse_folder(parts, path)
