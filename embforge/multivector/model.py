"""The multi-vector (ColBERT) encoder: texts -> one L2-normalised vector per token, scored by MaxSim.

A Hugging Face encoder's last hidden states go through a linear projection (128-d by default, no bias) and are
L2-normalised per token, as in ColBERT (Khattab & Zaharia, 2020) and pylate:

- a marker token after ``[CLS]`` says what a text is: ``[Q]`` for queries, ``[D]`` for documents (tokens added to
  the vocabulary; pylate's defaults);
- queries are padded to ``query_length`` with ``[MASK]`` tokens (query augmentation). The expansion tokens are not
  attended to (unless ``attend_to_expansion_tokens``) but their output vectors take part in MaxSim;
- documents are truncated to ``document_length``; their punctuation tokens (``skiplist_words``) and padding are
  masked out of MaxSim.

The output contract, shared by training, GradCache and torchrun gathering: :meth:`MultiVectorEncoder.forward`
returns a ``(texts, token_width, dim)`` float tensor whose masked token rows are exactly zero, ``token_width`` being
fixed for the model (``max(query_length, document_length)``). A fixed width lets mini-batches be concatenated and
ranks gathered like any ``(n, ...)`` tensor; a zero row scores 0 against any query token, which is how pylate's
MaxSim masks documents (:mod:`embforge.multivector.scoring`), so no separate mask has to travel.

Which texts are queries is declared by the marker the model put there itself (``ids[1] == query_prefix_id``),
read with tensor ops, so one forward may mix queries and documents (a training batch's columns).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embforge.kinds import ModelKind
from embforge.modeling.dense import Dense
from embforge.modeling.dropout import text_keys
from embforge.modeling.module import TextModule
from embforge.modeling.packed_batch import PackedBatch, pack
from embforge.modeling.packing import packed_hidden, supports_packing
from embforge.modeling.padding import BLOCK_TOKENS, CHUNK_TOKENS, in_length_chunks, pad_ids, sort_by_length
from embforge.modeling.tokenizing import Tokenized
from embforge.multivector.folder import ColBERTParts, ColBERTSettings, read_multivector, save_multivector
from embforge.multivector.pooling import check_pool_factor, pool_documents

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from embforge.protocols import LoadOptions, ModelPath


class MultiVectorEncoder(Tokenized, TextModule):
    """A ColBERT model: a backbone, a token projection, markers, query augmentation and a punctuation skiplist.

    Example:
        >>> model = MultiVectorEncoder.load("all-MiniLM-L6-v2")  # doctest: +SKIP
        >>> [m.shape for m in model.encode(["a cat sat."], is_query=False)]  # doctest: +SKIP
        [(6, 128)]
    """

    kind: ClassVar[ModelKind] = ModelKind.MULTIVECTOR
    skiplist: Tensor  # token ids of the punctuation masked out of documents (a buffer)

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer: Any,  # a fast tokenizer (its token lookups read back as lists of ids)
        projection: Dense,
        *,
        settings: ColBERTSettings | None = None,
        prompts: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.projection = projection
        self.settings = settings or ColBERTSettings()
        self.prompts = dict(prompts or {})
        ids = tokenizer.convert_tokens_to_ids([self.settings.query_prefix, self.settings.document_prefix])
        if tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids:
            raise ValueError(
                f"the tokenizer does not know the marker tokens {self.settings.query_prefix!r} / "
                f"{self.settings.document_prefix!r}; build the model with MultiVectorEncoder.from_backbone"
            )
        self.query_prefix_id, self.document_prefix_id = int(ids[0]), int(ids[1])
        mask = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.eos_token_id
        if mask is None:
            raise ValueError(
                "a multi-vector model needs a [MASK] (or end-of-text) token for query augmentation"
            )
        self.expansion_id = int(mask)
        skip = tokenizer.convert_tokens_to_ids(list(self.settings.skiplist_words))
        self.register_buffer("skiplist", torch.tensor(sorted(set(skip)), dtype=torch.long), persistent=False)

    # ------------------------------------------------------------------ properties
    @property
    def dim(self) -> int:
        return int(self.projection.out_features)

    @property
    def token_width(self) -> int:
        """The fixed number of token rows of every output matrix (queries and documents alike)."""
        return max(self.settings.query_length, self.settings.document_length)

    @property
    def max_seq_length(self) -> int:
        return self.settings.document_length

    @property
    def pad_token_id(self) -> int:
        return self.expansion_id  # pylate pads with [MASK]; padding is never attended to either way

    # ------------------------------------------------------------------ tokenising
    def prompt_text(self, prompt: str | None = None, prompt_name: str | None = None) -> str:
        """The prefix put before every text: an explicit ``prompt``, else the named one (none by default)."""
        if prompt is not None:
            return prompt
        if prompt_name is None:
            return ""
        if prompt_name not in self.prompts:
            raise KeyError(
                f"unknown prompt name {prompt_name!r}; this model has: {sorted(self.prompts) or 'none'}"
            )
        return self.prompts[prompt_name]

    def tokenize_ids(
        self, texts: Sequence[str], *, is_query: bool = False, prefix: str = ""
    ) -> list[list[int]]:
        """Token ids with the marker after the first token; queries padded with ``[MASK]`` to ``query_length``
        (query augmentation), documents truncated to ``document_length``. ``prefix``: a prompt put before
        each text."""
        s = self.settings
        length = s.query_length if is_query else s.document_length
        out = self.tokenizer(
            [prefix + t.strip() for t in texts],
            truncation=True,
            max_length=length - 1,
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
        marker = self.query_prefix_id if is_query else self.document_prefix_id
        ids = [[row[0], marker, *row[1:]] for row in out]
        if is_query and s.do_query_expansion:
            ids = [row + [self.expansion_id] * (length - len(row)) for row in ids]
        return ids

    # ------------------------------------------------------------------ forward (TextModule.forward)
    def forward_ids(
        self, ids: Sequence[Sequence[int]], *, max_tokens: int | None, seed: int | None, places: list[int]
    ) -> Tensor:
        """Token matrices ``(n, token_width, dim)`` of tokenised texts (:meth:`tokenize_ids`), in the input order;
        masked token rows are zero.

        BERT-family backbones run padding-free (:meth:`packed_token_matrices`; ``max_tokens`` bounds each padded
        attention block): the projection and everything before attention see only real tokens, and a query's
        expansion tokens attend without being attended to. Other backbones run in length-sorted padded chunks of
        at most ``max_tokens`` tokens (:meth:`token_matrices`), each chunk's dropout seeded from ``seed`` and its
        first text's place (:func:`~embforge.modeling.padding.in_length_chunks`)."""
        if supports_packing(self.backbone):
            return self.packed_token_matrices(
                ids, max_tokens=max_tokens or BLOCK_TOKENS, seed=seed, places=places
            )
        return in_length_chunks(
            ids,
            max_tokens or CHUNK_TOKENS,
            lambda chunk: self.token_matrices(*pad_ids(chunk, self.pad_token_id, device=self.device)),
            seed=seed,
            places=places,
        )

    def padded_forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.token_matrices(input_ids, attention_mask)

    def attended_lengths(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """How many leading tokens of each text are attended to: all of a document's; a query's up to its trailing
        ``[MASK]`` run (its expansion tokens), unless ``attend_to_expansion_tokens``. NumPy passes, no loop."""
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        if self.settings.attend_to_expansion_tokens:
            return lengths
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        positions = np.arange(len(flat)) - np.repeat(offsets, lengths)
        last = np.maximum.reduceat(np.where(flat != self.expansion_id, positions + 1, 0), offsets)
        is_query = flat[offsets + 1] == self.query_prefix_id  # every text has [CLS] and its marker
        return np.where(is_query, last, lengths)

    def packed_token_matrices(
        self, ids: Sequence[Sequence[int]], *, max_tokens: int, seed: int | None, places: Sequence[int]
    ) -> Tensor:
        """The padding-free forward: ``(n, token_width, dim)`` as :meth:`token_matrices` gives per padded chunk
        (dropout keyed by ``seed`` and ``places``; ``seed=None``: none)."""
        keys = None if seed is None else text_keys(seed, places, device=self.device)
        attended = self.attended_lengths(ids)
        batch = pack(ids, max_tokens=max_tokens, keys=keys, attended=attended, device=self.device)
        hidden = packed_hidden(self.backbone, batch, checkpoint_layers=self.checkpointing)
        vectors = F.normalize(self.projection(hidden).float(), p=2, dim=-1)
        caller = torch.empty_like(batch.inverse)  # the input place of each packed text
        caller[batch.inverse] = torch.arange(len(ids), device=caller.device)
        keep = self.packed_mask(batch, torch.as_tensor(attended, device=caller.device)[caller])
        rows = caller[batch.segment] * self.token_width + batch.position_ids
        out = vectors.new_zeros(len(ids) * self.token_width, vectors.shape[1])
        return out.index_copy(0, rows, vectors * keep[:, None]).view(len(ids), self.token_width, -1)

    def packed_mask(self, batch: PackedBatch, attended: Tensor) -> Tensor:
        """:meth:`output_mask` over packed tokens ``(tokens,)``; ``attended``: per packed text."""
        keyed = batch.position_ids < attended[batch.segment]
        is_query = (batch.input_ids[batch.offsets + 1] == self.query_prefix_id)[batch.segment]
        document = keyed & ~torch.isin(batch.input_ids, self.skiplist)
        query = torch.ones_like(keyed) if self.settings.do_query_expansion else keyed
        return torch.where(is_query, query, document)

    def token_matrices(self, input_ids: Tensor, lengths_mask: Tensor) -> Tensor:
        """One padded forward: ``(batch, token_width, dim)`` normalised, masked token vectors."""
        is_query = input_ids[:, 1] == self.query_prefix_id
        is_expansion = input_ids == self.expansion_id
        trailing = is_expansion.flip(1).long().cumprod(1).flip(1).bool()  # the [MASK] run at each text's end
        expansion = trailing & is_query[:, None] & lengths_mask.bool()
        attention = lengths_mask.bool() & ~(expansion & (not self.settings.attend_to_expansion_tokens))
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention.long()).last_hidden_state
        vectors = F.normalize(self.projection(hidden).float(), p=2, dim=-1)
        keep = self.output_mask(input_ids, lengths_mask.bool(), attention, is_query)
        vectors = vectors * keep[..., None]
        return F.pad(vectors, (0, 0, 0, self.token_width - vectors.shape[1]))

    def output_mask(self, input_ids: Tensor, real: Tensor, attention: Tensor, is_query: Tensor) -> Tensor:
        """Which token vectors take part in MaxSim: a query's every token (its expansion tokens too, unless query
        expansion is off), a document's attended tokens that are not punctuation (pylate's ``masks``)."""
        document = attention & ~torch.isin(input_ids, self.skiplist)
        query = real if self.settings.do_query_expansion else attention
        return torch.where(is_query[:, None], query, document)

    # ------------------------------------------------------------------ inference
    def encode(
        self,
        texts: str | Sequence[str],
        *,
        is_query: bool = False,
        batch_size: int = 32,
        prompt: str | None = None,
        pool_factor: float = 1,
    ) -> list[np.ndarray]:
        """Each text's token vectors ``(tokens, dim)`` float32 (masked tokens dropped), in the input order.

        ``pool_factor`` above 1 pools each document's vectors to about ``1 / pool_factor`` of them
        (:mod:`embforge.multivector.pooling`, pylate's ``pool_factor``); queries are never pooled."""
        if is_query and check_pool_factor(pool_factor) != 1:
            raise ValueError("pool_factor pools documents' token vectors; queries are not pooled (use 1)")
        batch = [texts] if isinstance(texts, str) else list(texts)
        ids = self.tokenize_ids(batch, is_query=is_query, prefix=prompt or "")
        out: list[np.ndarray] = [np.zeros((0, self.dim), np.float32)] * len(ids)
        order = sort_by_length(ids)
        with self.inference():
            for start in range(0, len(ids), batch_size):
                rows = order[start : start + batch_size]
                matrices = self.token_matrices(
                    *pad_ids([ids[i] for i in rows], self.pad_token_id, device=self.device)
                )
                kept = matrices.abs().sum(-1) > 0
                for row, matrix, mask in zip(rows, matrices.cpu().numpy(), kept.cpu().numpy()):
                    out[row] = matrix[mask]
        return pool_documents(out, pool_factor)

    def encode_padded(
        self, texts: Sequence[str], *, is_query: bool = False, batch_size: int = 32
    ) -> tuple[Tensor, Tensor]:
        """``(matrices (n, width, dim), lengths (n,))`` on the CPU: each text's kept vectors first, then zeros —
        the layout :func:`~embforge.multivector.scoring.maxsim` and the indexes take."""
        matrices = self.encode(texts, is_query=is_query, batch_size=batch_size)
        return pad_matrices(matrices, self.dim)

    # ------------------------------------------------------------------ persistence (multivector/folder.py)
    @classmethod
    def load(cls, path: ModelPath, *, dim: int = 128, **options: Unpack[LoadOptions]) -> MultiVectorEncoder:
        """Load a pylate ColBERT folder, or start a new ColBERT model from any encoder folder (a ``dim``-d
        projection, markers added); ``options``: ``device``, and ``max_seq_length`` (overrides
        ``document_length``)."""
        parts = read_multivector(path, dim=dim, document_length=options.get("max_seq_length"))
        model = cls(
            parts.backbone, parts.tokenizer, parts.projection, settings=parts.settings, prompts=parts.prompts
        )
        return model.loaded_from(path, device=options.get("device"))

    def save(self, path: str | os.PathLike) -> None:
        """Write the folder in pylate's layout (loads with ``pylate.models.ColBERT``)."""
        parts = ColBERTParts(self.backbone, self.tokenizer, self.projection, self.settings, self.prompts)
        save_multivector(parts, path)


def pad_matrices(matrices: Sequence[np.ndarray], dim: int) -> tuple[Tensor, Tensor]:
    """Variable-length token matrices -> ``(n, longest, dim)`` zero-padded float32 tensor and the lengths."""
    lengths = torch.tensor([len(m) for m in matrices], dtype=torch.long)
    width = int(lengths.max()) if len(matrices) else 0
    out = torch.zeros((len(matrices), max(width, 1), dim), dtype=torch.float32)
    if len(matrices):
        flat = torch.from_numpy(np.concatenate(matrices)) if width else torch.zeros((0, dim))
        rows = torch.repeat_interleave(torch.arange(len(matrices)), lengths)
        cols = torch.arange(len(flat)) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
        out[rows, cols] = flat
    return out, lengths
