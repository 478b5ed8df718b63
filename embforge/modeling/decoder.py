"""Decoder (LLM) backbones as embedders: detection, the EOS token appended to every text, positions, prompts.

Decoder embedders (Qwen3-Embedding, gte-Qwen2, e5-mistral, LLM2Vec-style Llama models) read a text with causal
attention and take the hidden state of its LAST token, which is the only one that has seen the whole text. Three
conventions make that work, and this module holds them so the PyTorch encoder, the ONNX graph and the ONNX
runtime agree:

- an end-of-text token is appended to every text (:func:`eos_to_append`), so the pooled state is always read at
  the same kind of token (Qwen3-Embedding appends ``<|endoftext|>``; Llama/Mistral models ``</s>``);
- positions count real tokens only (:func:`padded_position_ids`), so left- and right-padded batches give the same
  rotary positions and the same embeddings;
- queries carry an instruction, ``"Instruct: {task}\\nQuery:"`` (:func:`instruct_prompt`), documents none.

The padding-free training forward for these backbones is :mod:`embforge.modeling.decoder_packing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Hugging Face ``config.model_type`` values of decoder-only models whose base model takes ``position_ids``.
DECODER_MODEL_TYPES = frozenset(
    {
        "qwen2",
        "qwen3",
        "qwen2_moe",
        "qwen3_moe",
        "llama",
        "mistral",
        "mixtral",
        "gemma",
        "gemma2",
        "gemma3_text",
        "phi3",
        "olmo2",
    }
)

# Qwen3-Embedding's query prompt; documents get no prompt.
QWEN3_QUERY_PROMPT = "Instruct: {task}\nQuery:"
DEFAULT_RETRIEVAL_TASK = "Given a web search query, retrieve relevant passages that answer the query"


def base_model(backbone: nn.Module) -> nn.Module:
    """The Hugging Face model under a peft wrapper (LoRA layers stay injected in it), else ``backbone`` itself."""
    get_base = getattr(backbone, "get_base_model", None)
    return get_base() if callable(get_base) else backbone


def is_decoder_backbone(backbone: nn.Module) -> bool:
    """Whether ``backbone`` is a decoder-only (causal) model: Qwen2/Qwen3, Llama, Mistral, Gemma, Phi-3, ..."""
    config = getattr(base_model(backbone), "config", None)
    return config is not None and getattr(config, "model_type", None) in DECODER_MODEL_TYPES


def eos_to_append(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The token id to append to every text, or ``None`` when the tokenizer already ends texts with one.

    A tokenizer whose post-processor appends a special token (recent Qwen3-Embedding tokenizers append
    ``<|endoftext|>``) needs nothing. Otherwise Qwen-family vocabularies get ``<|endoftext|>`` (the token
    Qwen3-Embedding and gte-Qwen2 were trained with; their ``eos_token`` is the chat ``<|im_end|>``), and others
    the tokenizer's ``eos_token_id``.
    """
    probe = tokenizer("a", add_special_tokens=True)["input_ids"]
    special = set(getattr(tokenizer, "all_special_ids", []) or []) - {
        getattr(tokenizer, "unk_token_id", None)
    }
    if probe and probe[-1] in special:
        return None
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    if "<|endoftext|>" in vocab:
        return int(vocab["<|endoftext|>"])
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError(
            "this decoder tokenizer has no eos_token and no <|endoftext|> token; last-token pooling needs an "
            "end-of-text token appended to every text (set tokenizer.eos_token in the model folder)"
        )
    return int(eos)


def padded_position_ids(attention_mask: Tensor) -> Tensor:
    """Positions ``0, 1, ...`` of each row's real tokens (padding gets 0): the same for left and right padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def backbone_hidden(backbone: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Last hidden states ``(batch, seq, hidden)`` of one padded batch.

    Decoders get positions counted over real tokens (:func:`padded_position_ids`): Hugging Face would otherwise
    number left padding too, shifting every rotary position of a left-padded text.
    """
    if is_decoder_backbone(backbone):
        position_ids = padded_position_ids(attention_mask)
        out = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    else:
        out = backbone(input_ids=input_ids, attention_mask=attention_mask)
    return out.last_hidden_state


def instruct_prompt(task: str = DEFAULT_RETRIEVAL_TASK) -> str:
    """Qwen3-Embedding's query prefix for ``task``: ``"Instruct: {task}\\nQuery:"`` (documents take none).

    Example:
        >>> instruct_prompt("Given a question, retrieve passages that answer it")
        'Instruct: Given a question, retrieve passages that answer it\\nQuery:'
    """
    return QWEN3_QUERY_PROMPT.format(task=task)
