"""Prompts and tokenisation shared by every bi-encoder runtime (PyTorch :class:`Encoder`, ONNX encoder), and the
pad id every model with a tokenizer has."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class Tokenized:
    """Mixin of every model with a ``tokenizer`` attribute (bi-encoders and cross-encoders): its pad id."""

    tokenizer: PreTrainedTokenizerBase

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's padding id (0 when it has none)."""
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return int(pad) if pad is not None else 0


class PromptTokenizing(Tokenized):
    """Mixin: needs ``tokenizer``, ``max_seq_length``, ``prompts`` and ``default_prompt_name`` attributes.

    ``append_token_id`` (decoder embedders, see :func:`embforge.modeling.decoder.eos_to_append`): a token id put
    at the end of every text (within ``max_seq_length``) for last-token pooling; ``None`` appends nothing.
    """

    tokenizer: PreTrainedTokenizerBase
    max_seq_length: int
    prompts: dict[str, str]
    default_prompt_name: str | None
    append_token_id: int | None = None

    def prompt_text(self, prompt: str | None = None, prompt_name: str | None = None) -> str:
        """The prefix to put before every text: an explicit ``prompt``, a named one, or the default."""
        if prompt is not None:
            return prompt
        name = prompt_name if prompt_name is not None else self.default_prompt_name
        if name is None:
            return ""
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            raise KeyError(f"unknown prompt name {name!r}; this model has: {known}")
        return self.prompts[name]

    def tokenize_ids(
        self, texts: Sequence[str], *, prefix: str = "", is_query: bool = False
    ) -> list[list[int]]:
        """Token ids of each text (with special tokens, truncated to ``max_seq_length``, not padded); queries
        (``is_query``) are tokenised as documents are, unless a kind overrides this."""
        if prefix:
            texts = [prefix + t for t in texts]
        append = self.append_token_id
        out = self.tokenizer(
            list(texts),
            truncation=True,
            max_length=self.max_seq_length - (append is not None),
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        if append is None:
            return out["input_ids"]
        return [[*ids, append] for ids in out["input_ids"]]
