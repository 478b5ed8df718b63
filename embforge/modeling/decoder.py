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

**Bidirectional attention** (LLM2Vec, BehnamGhader et al. 2024; tevatron 3.0's ``attn_implementation`` route):
:func:`set_bidirectional` makes every token attend to every real token of its text, as an encoder does, for
embedding training with mean or last-token pooling. The switch is an attribute of the backbone's Hugging Face
config (``embforge_bidirectional``), so ``save_pretrained`` writes it into ``config.json`` and a reload keeps it
(transformers keeps unknown config keys). The padded forward passes transformers' own bidirectional mask
(``masking_utils.create_bidirectional_mask``: a 4-D padding mask for eager/SDPA, the 2-D one for flash-attention)
and ``is_causal=False``, which the attention functions read before the module's ``is_causal``; the packed forward
(:mod:`~embforge.modeling.decoder_packing`) masks padding keys instead of the future. Sliding windows are not
applied then: the whole text is seen.

The padding-free training forward for these backbones is :mod:`embforge.modeling.decoder_packing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from torch import Tensor, nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

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


# the backbone config attribute that turns a decoder's causal attention into bidirectional attention
BIDIRECTIONAL = "embforge_bidirectional"


def is_bidirectional(backbone: nn.Module) -> bool:
    """Whether a decoder backbone attends both ways (:func:`set_bidirectional`); ``False`` for other models."""
    config = getattr(base_model(backbone), "config", None)
    return bool(getattr(config, BIDIRECTIONAL, False)) and is_decoder_backbone(backbone)


def set_bidirectional(backbone: nn.Module, bidirectional: bool = True) -> None:
    """Make a decoder backbone attend bidirectionally (or causally again) in every embedforge forward; the setting
    lives in its config, so it is saved with the model.

    Raises:
        ValueError: ``backbone`` is not a decoder (encoders attend both ways already).
    """
    if not is_decoder_backbone(backbone):
        model_type = getattr(getattr(base_model(backbone), "config", None), "model_type", None)
        raise ValueError(
            f"bidirectional attention is an option of decoder backbones ({', '.join(sorted(DECODER_MODEL_TYPES))});"
            f" a {model_type!r} model attends both ways already"
        )
    setattr(base_model(backbone).config, BIDIRECTIONAL, bool(bidirectional))


def make_bidirectional(model: object) -> None:
    """:func:`set_bidirectional` on a dense model's backbone (``embforge train --bidirectional``).

    Raises:
        ValueError: the model is not a single-vector model over a transformer backbone, or not a decoder.
    """
    from embforge.kinds import is_single_vector

    backbone = getattr(model, "backbone", None)
    if not is_single_vector(model) or not isinstance(backbone, nn.Module):
        raise ValueError("--bidirectional is an option of dense models over a decoder (LLM) backbone")
    set_bidirectional(backbone)


def padded_position_ids(attention_mask: Tensor) -> Tensor:
    """Positions ``0, 1, ...`` of each row's real tokens (padding gets 0): the same for left and right padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def backbone_hidden(backbone: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Last hidden states ``(batch, seq, hidden)`` of one padded batch.

    Decoders get positions counted over real tokens (:func:`padded_position_ids`): Hugging Face would otherwise
    number left padding too, shifting every rotary position of a left-padded text.
    """
    if is_bidirectional(backbone):
        return _bidirectional_hidden(backbone, input_ids, attention_mask)
    if is_decoder_backbone(backbone):
        position_ids = padded_position_ids(attention_mask)
        out = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    else:
        out = backbone(input_ids=input_ids, attention_mask=attention_mask)
    return out.last_hidden_state


def _bidirectional_hidden(backbone: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """A decoder's padded forward without the causal mask: transformers' bidirectional padding mask, built for the
    model's attention implementation, and ``is_causal=False`` for the kernels that take a flag."""
    from transformers.masking_utils import create_bidirectional_mask

    model = cast("PreTrainedModel", base_model(backbone))
    embeds = model.get_input_embeddings()(input_ids)
    mask = create_bidirectional_mask(
        config=model.config,
        inputs_embeds=embeds,
        attention_mask=attention_mask,
        allow_is_bidirectional_skip=False,  # a 4-D mask always: None would make the model build a causal one
    )
    position_ids = padded_position_ids(attention_mask)
    out = backbone(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids, is_causal=False)
    return out.last_hidden_state


def instruct_prompt(task: str = DEFAULT_RETRIEVAL_TASK) -> str:
    """Qwen3-Embedding's query prefix for ``task``: ``"Instruct: {task}\\nQuery:"`` (documents take none).

    Example:
        >>> instruct_prompt("Given a question, retrieve passages that answer it")
        'Instruct: Given a question, retrieve passages that answer it\\nQuery:'
    """
    return QWEN3_QUERY_PROMPT.format(task=task)
