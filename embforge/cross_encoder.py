"""CrossEncoder: ``[CLS] a [SEP] b [SEP]`` through a Hugging Face encoder with a scoring head -> one score per pair.

The on-disk layout is a plain ``AutoModelForSequenceClassification`` folder plus sentence-transformers'
``config_sentence_transformers.json`` (``model_type: CrossEncoder``, ``activation_fn``), so a folder saved here
loads in ``sentence_transformers.CrossEncoder`` and a folder saved there loads here. A bi-encoder checkpoint
(e.g. all-MiniLM-L6-v2) becomes a cross-encoder with a freshly initialised head.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from embforge.modeling.packing import pack, packed_logits, supports_packed_classifier
from embforge.modeling.padding import sort_by_length, token_budget_chunks
from embforge.modeling.resolve import resolve_model_path

# activation applied by predict() -> sentence-transformers' name for it
_ACTIVATIONS = {
    "sigmoid": "torch.nn.modules.activation.Sigmoid",
    "identity": "torch.nn.modules.linear.Identity",
}
Pair = tuple[str, str]
PairIds = tuple[list[int], list[int] | None]  # token ids, token type ids (None for models without them)


def is_cross_encoder_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` (a folder or alias) holds a cross-encoder rather than a bi-encoder."""
    try:
        root = resolve_model_path(path)
    except FileNotFoundError:
        return False
    st_config = root / "config_sentence_transformers.json"
    if st_config.exists() and json.loads(st_config.read_text()).get("model_type") == "CrossEncoder":
        return True
    config = root / "config.json"
    if (root / "modules.json").exists() or not config.exists():
        return False
    architectures = json.loads(config.read_text()).get("architectures") or []
    return any(a.endswith("ForSequenceClassification") for a in architectures)


class CrossEncoder(nn.Module):
    """A cross-encoder (reranker): a pair of texts in, ``num_labels`` logits out.

    Example:
        >>> ce = CrossEncoder.load("all-MiniLM-L6-v2")  # doctest: +SKIP  (new, untrained head)
        >>> ce.predict([("what is a cat", "a cat is a small feline")]).shape  # doctest: +SKIP
        (1,)
    """

    def __init__(
        self, model: Any, tokenizer: Any, *, max_seq_length: int = 512, activation: str | None = None
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
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def num_labels(self) -> int:
        return int(self.model.config.num_labels)

    @property
    def pad_token_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return int(pad) if pad is not None else 0

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
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """Logits ``(batch, num_labels)`` of one padded batch, in float32."""
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

    def score_ids(self, items: Sequence[PairIds], *, max_tokens: int = 4096) -> Tensor:
        """Logits ``(n, num_labels)`` of many tokenised pairs with gradients, in the input order.

        Pairs are sorted by length and cut into chunks of at most ``max_tokens`` padded tokens: each pair's
        logits are what one big padded forward would give, with less padding work.
        """
        if supports_packed_classifier(self.model):  # padding-free BERT forward (embforge/packing.py)
            batch = pack(
                [ids for ids, _ in items],
                max_tokens=max_tokens,
                token_type_ids=[types for _, types in items],
                device=self.device,
            )
            return packed_logits(self.model, batch).float()[batch.inverse]
        order = sort_by_length([ids for ids, _ in items])
        parts = [
            self(*self.pad([items[order[i]] for i in chunk]))
            for chunk in token_budget_chunks([len(items[i][0]) for i in order], max_tokens)
        ]
        logits = torch.cat(parts)
        inverse = torch.empty(len(order), dtype=torch.long, device=logits.device)
        inverse[torch.as_tensor(order, device=logits.device)] = torch.arange(len(order), device=logits.device)
        return logits[inverse]

    def prepare_task(self, task: Any) -> Any:
        """Tokenise a training task once (see :mod:`embforge.training.tasks` and :mod:`embforge.losses.cross`)."""
        return PreparedCrossTask(task, self)

    # ------------------------------------------------------------------ inference
    @torch.inference_mode()
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
            show_progress: Progress bar; ``None`` shows it for long inputs on a terminal.

        Returns:
            ``(n,)`` float32 scores for one label, ``(n, num_labels)`` otherwise (a scalar / ``(num_labels,)``
            for a single pair).
        """
        single = isinstance(pairs, tuple) and len(pairs) == 2 and isinstance(pairs[0], str)
        batch: list[Any] = [pairs] if single else list(pairs)
        for i, pair in enumerate(batch):
            if len(pair) != 2 or not all(isinstance(t, str) for t in pair):
                raise ValueError(f"pairs[{i}] must be a (text, text) tuple, got {pair!r}")
        was_training = self.training
        self.eval()
        items = self.tokenize_ids([a for a, _ in batch], [b for _, b in batch])
        order = sort_by_length([ids for ids, _ in items])
        if max_tokens is not None:
            chunks = [
                [order[i] for i in chunk]
                for chunk in token_budget_chunks([len(items[i][0]) for i in order], max_tokens)
            ]
        else:
            chunks = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
        if show_progress is None:
            show_progress = len(chunks) > 20 and sys.stderr.isatty()
        out = torch.empty((len(items), self.num_labels), dtype=torch.float32)
        for rows in tqdm(chunks, disable=not show_progress, desc="predict"):
            out[rows] = self.score_ids([items[i] for i in rows]).cpu()  # padding-free for BERT backbones
        self.train(was_training)
        if activation:
            out = torch.sigmoid(out) if self.activation == "sigmoid" else out
        scores = out[:, 0] if self.num_labels == 1 else out
        return (scores[0] if single else scores).numpy()

    def rank(
        self, query: str, documents: Sequence[str], *, top_k: int | None = None, batch_size: int = 32
    ) -> list[dict[str, Any]]:
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
        path: str | os.PathLike,
        *,
        num_labels: int | None = None,
        device: str | torch.device | None = None,
        max_seq_length: int | None = None,
        activation: str | None = None,
    ) -> CrossEncoder:
        """Load a cross-encoder folder, or start one from any encoder / bi-encoder folder with a new head.

        Args:
            path: A folder (cross-encoder, HF encoder or sentence-transformers bi-encoder) or a known alias.
            num_labels: Outputs of the head; for a folder without a classification head it defaults to 1.
            device: Where to put the model.
            max_seq_length: Truncate pairs to this many tokens (default: saved value or min(512, tokenizer's)).
            activation: ``sigmoid`` or ``identity`` for :meth:`predict` (default: saved, else sigmoid for 1 label).
        """
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging

        root = resolve_model_path(path)
        saved: dict[str, Any] = {}
        st_config = root / "config_sentence_transformers.json"
        if st_config.exists():
            saved = json.loads(st_config.read_text())
        source = root
        if not is_cross_encoder_folder(root) and (root / "modules.json").exists():
            from embforge.encoder import read_st_settings

            settings = read_st_settings(root)
            source = root / settings["transformer_path"]
            saved.setdefault("max_seq_length", settings.get("max_seq_length"))
        kwargs: dict[str, Any] = {}
        if num_labels is not None:
            kwargs["num_labels"] = num_labels
        elif not is_cross_encoder_folder(root):
            kwargs["num_labels"] = 1
        tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
        was_enabled = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # "newly initialized head" is expected when starting from an encoder
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                str(source), local_files_only=True, **kwargs
            )
        finally:
            hf_logging.set_verbosity(verbosity)
            if was_enabled:
                hf_logging.enable_progress_bar()
        if activation is None:
            saved_fn = saved.get("activation_fn") or (
                getattr(model.config, "sentence_transformers", None) or {}
            ).get("activation_fn")
            activation = next((k for k, v in _ACTIVATIONS.items() if v == saved_fn), None)
        if max_seq_length is None:
            max_seq_length = saved.get("max_seq_length") or min(
                512, int(getattr(tokenizer, "model_max_length", 512) or 512)
            )
        ce = cls(model, tokenizer, max_seq_length=int(max_seq_length), activation=activation)
        if device is not None:
            ce.to(device)
        return ce

    def save(self, path: str | os.PathLike) -> None:
        """Write safetensors weights, tokenizer and sentence-transformers' cross-encoder config to ``path``."""
        from embforge.encoder import _version

        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self.model.config.sentence_transformers = {"activation_fn": _ACTIVATIONS[self.activation]}
        self.model.save_pretrained(root, safe_serialization=True)
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
            "__version__": {"embforge": _version()},
        }
        (root / "config_sentence_transformers.json").write_text(json.dumps(config, indent=2) + "\n")


class PreparedCrossTask:
    """A cross-encoder task tokenised once: the pairs ``(first text, other text)`` of every row, and the labels.

    Pointwise losses score ``(sentence1, sentence2)``; grouped losses (``listwise``) score the query with each
    candidate column (or, with a single candidate column, with every positive of the batch).
    """

    def __init__(self, task: Any, model: CrossEncoder) -> None:
        task.validate()
        if not getattr(task.loss, "scores_in", False):
            raise ValueError(
                f"task {task.name!r}: loss {task.loss.name!r} is a bi-encoder loss; a cross-encoder needs one of "
                "bce, ce, cosent, mse, listwise"
            )
        self.task = task
        self.grouped = bool(task.loss.grouped)
        columns = task.data.text_columns
        self.first = task.data.columns[columns[0]]
        self.others = [task.data.columns[c] for c in columns[1:]]
        self.in_batch = self.grouped and len(self.others) == 1
        self.ids = [model.tokenize_ids(self.first, other) for other in self.others]
        labels = task.data.labels()
        self.labels = (
            None if labels is None or self.grouped else torch.as_tensor(task.loss.prepare_labels(labels))
        )
        self.lengths = [sum(len(col[r][0]) for col in self.ids) for r in range(len(task.data))]

    def loss(self, model: CrossEncoder, rows: tuple[int, ...], chunk_tokens: int) -> Tensor:
        if self.in_batch:
            queries = [self.first[r] for r in rows]
            positives = [self.others[0][r] for r in rows]
            items = model.tokenize_ids(
                [q for q in queries for _ in positives], [p for _ in queries for p in positives]
            )
            scores = model.score_ids(items, max_tokens=chunk_tokens)[:, 0].view(len(rows), len(rows))
            target = torch.arange(len(rows), device=scores.device)
            return self.task.loss(scores, target)
        if self.grouped:
            items = [col[r] for r in rows for col in self.ids]
            scores = model.score_ids(items, max_tokens=chunk_tokens)[:, 0].view(len(rows), len(self.ids))
            return self.task.loss(scores, None)
        logits = model.score_ids([self.ids[0][r] for r in rows], max_tokens=chunk_tokens)
        labels = None if self.labels is None else self.labels[list(rows)].to(logits.device)
        return self.task.loss(logits, labels)
