"""CrossEncoder: ``[CLS] a [SEP] b [SEP]`` through a Hugging Face encoder with a scoring head -> one score per pair.

The on-disk layout is a plain ``AutoModelForSequenceClassification`` folder plus sentence-transformers'
``config_sentence_transformers.json`` (``model_type: CrossEncoder``, ``activation_fn``), so a folder saved here
loads in ``sentence_transformers.CrossEncoder`` and a folder saved there loads here. A bi-encoder checkpoint
(e.g. all-MiniLM-L6-v2) becomes a cross-encoder with a freshly initialised head only when that is asked for
(``new_head=True``, as training does); loading it to score pairs is refused (the head would be random).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

import numpy as np
import torch
from torch import Tensor, nn

from embforge.kind_names import ModelKind
from embforge.kinds import folder_kind, folder_record
from embforge.modeling.dropout import forward_keys, text_keys
from embforge.modeling.lora import adapter_note, has_adapter, load_adapter, save_backbone, uses_adapters
from embforge.modeling.module import TransformerModule
from embforge.modeling.packing import pack, packed_logits, supports_packed_classifier
from embforge.modeling.padding import (
    BLOCK_TOKENS,
    CHUNK_TOKENS,
    in_length_chunks,
    sort_by_length,
    token_budget_chunks,
)
from embforge.modeling.resolve import default_max_seq_length, naming_broken_files, resolve_model_path
from embforge.modeling.st_folder import (
    has_modules,
    is_cross_encoder_folder,
    read_json,
    read_st_config,
    read_st_settings,
    write_st_config,
)
from embforge.modeling.tokenizing import Tokenized
from embforge.progress import progress_bar, progress_enabled

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from typing_extensions import Unpack

    from embforge.protocols import LoadOptions, ModelPath

# activation applied by predict() -> sentence-transformers' name for it
_ACTIVATIONS = {
    "sigmoid": "torch.nn.modules.activation.Sigmoid",
    "identity": "torch.nn.modules.linear.Identity",
}
Pair = tuple[str, str]
PairIds = tuple[list[int], list[int] | None]  # token ids, token type ids (None for models without them)


class Ranked(TypedDict):
    """One document of :meth:`CrossEncoder.rank`: its position in the input and its score."""

    corpus_id: int
    score: float


class CrossEncoder(Tokenized, TransformerModule):
    """A cross-encoder (reranker): a pair of texts in, ``num_labels`` logits out.

    Example:
        >>> ce = CrossEncoder.load("all-MiniLM-L6-v2", new_head=True)  # doctest: +SKIP
        >>> # a bi-encoder checkpoint: the head is new and untrained (without new_head: refused)
        >>> ce.predict([("what is a cat", "a cat is a small feline")]).shape  # doctest: +SKIP
        (1,)
    """

    kind: ClassVar[ModelKind] = ModelKind.CROSS
    peft_slot = ("model", "SEQ_CLS")  # peft keeps the classification head fully trainable (modules_to_save)

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_seq_length: int = 512,
        activation: str | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        if activation is None:
            activation = "sigmoid" if self.num_labels == 1 else "identity"
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(_ACTIVATIONS)}")
        self.activation = activation

    # ------------------------------------------------------------------ properties
    @property
    def backbone(self) -> nn.Module:  # type: ignore[override]
        """The Hugging Face sequence-classification model (``self.model``)."""
        return self.model

    @property
    def num_labels(self) -> int:
        return int(self.backbone_config.num_labels or 1)

    # ------------------------------------------------------------------ tokenisation and forward
    def tokenize_ids(self, texts: Sequence[str], texts_b: Sequence[str] | None = None) -> list[PairIds]:
        """Token ids (and token type ids) of each pair ``(texts[i], texts_b[i])``, truncated, not padded."""
        if texts_b is not None and len(texts_b) != len(texts):
            raise ValueError(f"got {len(texts)} first texts but {len(texts_b)} second texts")
        out = self.tokenizer(
            list(texts),
            None if texts_b is None else list(texts_b),
            truncation="longest_first" if texts_b is not None else True,
            max_length=self.max_seq_length,
            padding=False,
            return_attention_mask=False,
        )
        types = out.get("token_type_ids")
        return [(ids, None if types is None else types[i]) for i, ids in enumerate(out["input_ids"])]

    def forward(
        self,
        items: Sequence[PairIds] | Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        max_tokens: int | None = None,
        dropout_seed: int | None = None,
        places: Sequence[int] | None = None,
    ) -> Tensor:
        """Logits ``(n, num_labels)`` in float32, in the input order.

        Two input forms: tokenised pairs (the training forward: padding-free for BERT backbones, else
        length-sorted padded chunks of at most ``max_tokens`` tokens; dropout keyed by ``dropout_seed`` and each
        pair's place in the batch, see :meth:`embforge.encoder.Encoder.forward`), or one padded batch
        (``input_ids``, ``attention_mask``, ``token_type_ids``).
        """
        if isinstance(items, Tensor):
            assert attention_mask is not None, "a padded id tensor needs its attention_mask"
            return self._padded_forward(items, attention_mask, token_type_ids)
        seed, where = forward_keys(self.training, len(items), dropout_seed, places)
        # packing.py reads BERT's projection weights directly and would skip LoRA layers: adapted models go padded
        if supports_packed_classifier(self.model) and not uses_adapters(self.model):  # padding-free
            keys = None if seed is None else text_keys(seed, where, device=self.device)
            batch = pack(
                [ids for ids, _ in items],
                max_tokens=max_tokens or BLOCK_TOKENS,
                token_type_ids=[types for _, types in items],
                keys=keys,
                device=self.device,
            )
            return packed_logits(self.model, batch, checkpoint_layers=self.checkpointing).float()[
                batch.inverse
            ]
        return in_length_chunks(
            items,
            max_tokens or CHUNK_TOKENS,
            lambda chunk: self._padded_forward(*self.pad(chunk)),
            lengths=[len(ids) for ids, _ in items],
            seed=seed,
            places=where,
        )

    def _padded_forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> Tensor:
        kwargs = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits.float()

    def pad(self, items: Sequence[PairIds]) -> tuple[Tensor, Tensor, Tensor | None]:
        """Right-pad pairs to the longest one: ``(input_ids, attention_mask, token_type_ids or None)``."""
        width = max(len(ids) for ids, _ in items)
        input_ids = torch.full((len(items), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        has_types = items[0][1] is not None
        types = torch.zeros((len(items), width), dtype=torch.long) if has_types else None
        for row, (ids, type_ids) in enumerate(items):
            input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
            if types is not None and type_ids is not None:
                types[row, : len(ids)] = torch.as_tensor(type_ids, dtype=torch.long)
        device = self.device
        return input_ids.to(device), mask.to(device), None if types is None else types.to(device)

    def score_ids(self, items: Sequence[PairIds], *, max_tokens: int | None = None) -> Tensor:
        """Logits ``(n, num_labels)`` of many tokenised pairs with gradients (``self(items, max_tokens=...)``)."""
        return self(items, max_tokens=max_tokens)

    # ------------------------------------------------------------------ inference
    def predict(
        self,
        pairs: Sequence[Pair] | Pair,
        *,
        batch_size: int = 32,
        max_tokens: int | None = None,
        activation: bool = True,
        show_progress: bool | None = None,
    ) -> np.ndarray:
        """Score pairs.

        Args:
            pairs: ``(text_a, text_b)`` tuples (or one tuple).
            batch_size: Pairs per forward pass; pairs are sorted by token length first so batches pad little.
            max_tokens: Instead of a fixed ``batch_size``, cut the length-sorted pairs into chunks of at most
                this many padded tokens. ``None`` (default): fixed batches of length-sorted pairs (on a busy 2-core
                CPU, 512-token chunks measured 2x slower than batches of 32 for all-MiniLM-L6-v2 on MRPC).
            activation: Apply the model's activation (sigmoid for one label) like sentence-transformers does;
                ``False`` returns raw logits.
            show_progress: Progress bar; ``None``: the command's setting (``embforge`` verbs show it unless
                ``--quiet``), else shown for long inputs on a terminal (:mod:`embforge.progress`).

        Returns:
            ``(n,)`` float32 scores for one label, ``(n, num_labels)`` otherwise (a scalar / ``(num_labels,)``
            for a single pair).
        """
        single = isinstance(pairs, tuple) and len(pairs) == 2 and isinstance(pairs[0], str)
        batch: list[Any] = [pairs] if single else list(pairs)  # each checked to be a (text, text) pair below
        for i, pair in enumerate(batch):
            if len(pair) != 2 or not all(isinstance(t, str) for t in pair):
                raise ValueError(f"pairs[{i}] must be a (text, text) tuple, got {pair!r}")
        items = self.tokenize_ids([a for a, _ in batch], [b for _, b in batch])
        order = sort_by_length([ids for ids, _ in items])
        if max_tokens is not None:
            chunks = [
                [order[i] for i in chunk]
                for chunk in token_budget_chunks([len(items[i][0]) for i in order], max_tokens)
            ]
        else:
            chunks = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
        enabled = progress_enabled(show_progress, steps=len(chunks))
        out = torch.empty((len(items), self.num_labels), dtype=torch.float32)
        with self.inference():
            for rows in progress_bar(chunks, desc="predict", unit="batch", enabled=enabled):
                out[rows] = self.score_ids([items[i] for i in rows]).cpu()  # padding-free for BERT backbones
        if activation:
            out = torch.sigmoid(out) if self.activation == "sigmoid" else out
        scores = out[:, 0] if self.num_labels == 1 else out
        return (scores[0] if single else scores).numpy()

    def rank(
        self, query: str, documents: Sequence[str], *, top_k: int | None = None, batch_size: int = 32
    ) -> list[Ranked]:
        """Documents sorted by score, best first: ``[{"corpus_id": i, "score": s}, ...]``."""
        if self.num_labels != 1:
            raise ValueError(f"rank() needs a one-label cross-encoder; this one has {self.num_labels} labels")
        scores = self.predict([(query, d) for d in documents], batch_size=batch_size)
        order = np.argsort(-scores, kind="stable")[:top_k]
        return [{"corpus_id": int(i), "score": float(scores[i])} for i in order]

    # ------------------------------------------------------------------ persistence
    @classmethod
    def load(
        cls,
        path: ModelPath,
        *,
        num_labels: int | None = None,
        activation: str | None = None,
        new_head: bool = False,
        **options: Unpack[LoadOptions],
    ) -> CrossEncoder:
        """Load a cross-encoder folder; with ``new_head``, start one for training from any encoder folder.

        Args:
            path: A cross-encoder folder or alias (with ``new_head``: also an HF encoder or a bi-encoder folder).
            num_labels: Outputs of the head; for a folder without a classification head it defaults to 1.
            activation: ``sigmoid`` or ``identity`` for :meth:`predict` (default: saved, else sigmoid for 1 label).
            new_head: Start from a model without a trained head (``embforge train --model-type cross``): a
                bi-encoder or encoder gets a new, randomly initialised head; a cross-encoder keeps its own. Without
                it, such a folder is refused (:func:`refuse_untrained_head`): it would score at random.
            **options: ``device``: where to put the model; ``max_seq_length``: truncate pairs to this many tokens
                (default: saved value or min(512, tokenizer's)).

        Raises:
            ValueError: Without ``new_head``: the folder is another kind of model, or its checkpoint lacks weights
                of the head.
        """
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging

        root = resolve_model_path(path)
        if not new_head:
            refuse_untrained_head(path, root)
        saved: dict[str, Any] = read_st_config(root)
        cross = is_cross_encoder_folder(root)
        source = root
        if not cross and has_modules(root):  # a bi-encoder folder: its backbone, a new head
            settings = read_st_settings(root)
            source = root / settings["transformer_path"]
            saved.setdefault("max_seq_length", settings.get("max_seq_length"))
        kwargs: dict[str, int] = {}
        if num_labels is not None:
            kwargs["num_labels"] = num_labels
        elif not cross:
            kwargs["num_labels"] = 1
        with naming_broken_files(source):
            tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
            was_enabled = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()  # a missing head is asked for (new_head) or refused below
            try:
                model, loading = AutoModelForSequenceClassification.from_pretrained(
                    str(source), local_files_only=True, output_loading_info=True, **kwargs
                )
            finally:
                hf_logging.set_verbosity(verbosity)
                if was_enabled:
                    hf_logging.enable_progress_bar()
        if not new_head:
            refuse_missing_weights(path, sorted(loading["missing_keys"]))
        if activation is None:
            saved_fn = saved.get("activation_fn") or (
                getattr(model.config, "sentence_transformers", None) or {}
            ).get("activation_fn")
            activation = next((k for k, v in _ACTIVATIONS.items() if v == saved_fn), None)
        max_seq_length = options.get("max_seq_length")
        if max_seq_length is None:
            max_seq_length = saved.get("max_seq_length") or default_max_seq_length(tokenizer)
        if has_adapter(root) and cross:  # LoRA: base + adapter/ (modeling/lora.py)
            model = load_adapter(model, root)
        ce = cls(model, tokenizer, max_seq_length=int(max_seq_length), activation=activation)
        return ce.loaded_from(path, device=options.get("device"))

    def load_weights(self, path: ModelPath) -> None:
        """Load the weights of the cross-encoder saved at ``path`` into this one, in place (a pipeline resuming
        from its last finished stage)."""
        self.load_state_dict(CrossEncoder.load(path).state_dict())

    def save(self, path: str | os.PathLike) -> None:
        """Write safetensors weights, tokenizer and sentence-transformers' cross-encoder config to ``path``."""
        self.backbone_config.sentence_transformers = {"activation_fn": _ACTIVATIONS[self.activation]}
        root = save_backbone(self.model, path)  # with adapters: base weights + adapter/ (modeling/lora.py)
        self.tokenizer.model_max_length = (
            self.max_seq_length
        )  # sentence-transformers truncates pairs at this length
        self.tokenizer.save_pretrained(root)
        config = {
            "model_type": "CrossEncoder",
            "activation_fn": _ACTIVATIONS[self.activation],
            "max_seq_length": self.max_seq_length,
            "prompts": {},
            "default_prompt_name": None,
            **adapter_note(self.model),
        }
        write_st_config(root, config)


_TRAIN_ONE = "train a cross-encoder from it (embforge train --model-type cross, or CrossEncoder.load(..., new_head=True))"


def refuse_untrained_head(path: ModelPath, root: Path) -> None:
    """A one-line ``ValueError`` when the folder ``root`` (``path`` as given) declares itself something other
    than a cross-encoder: another kind (``config_sentence_transformers.json``, ``modules.json``) or a Hugging Face
    model without a ``...ForSequenceClassification`` architecture. Its scores would come from a random head."""
    if is_cross_encoder_folder(root):
        return
    if folder_kind(root) is not None or has_modules(root):  # a modules.json without a declaration: dense
        raise ValueError(
            f"{path} is {folder_record(root).description}, not a cross-encoder: pass it as --model (an embedding model), or "
            f"{_TRAIN_ONE}"
        )
    architectures = read_json(root / "config.json").get("architectures") or []
    if architectures:
        raise ValueError(
            f"{path} is a Hugging Face {', '.join(architectures)} checkpoint without a sequence-classification "
            f"head, not a cross-encoder: give a trained cross-encoder, or {_TRAIN_ONE}"
        )


def refuse_missing_weights(path: ModelPath, missing: Sequence[str]) -> None:
    """A one-line ``ValueError`` when weights of the cross-encoder at ``path`` are not in its checkpoint (Hugging
    Face would initialise them at random: scores near 0.5, different at every start)."""
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ValueError(
            f"{path}: {shown} {'is' if len(missing) == 1 else 'are'} not in the checkpoint, so the head would "
            f"score at random: give a trained cross-encoder, or {_TRAIN_ONE}"
        )
