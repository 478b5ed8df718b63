"""Tiny random decoder (LLM) backbones and word-level tokenizers built in memory, like conftest's tiny BERT."""

from __future__ import annotations

import torch

from tests.conftest import WORDS

PROMPT_WORDS = ["instruct", "query", "given", "retrieve", "passages", "that", "answer", "it", "question"]
PUNCTUATION = [":", ".", ",", "?", "!"]


def make_decoder_tokenizer(kind: str = "qwen", *, padding_side: str = "left", eos_in_template: bool = False):
    """A word-level tokenizer with a decoder's special tokens.

    ``kind="qwen"``: ``<|endoftext|>`` (pad) and ``<|im_end|>`` (eos), no BOS — Qwen3-Embedding's layout;
    ``eos_in_template`` makes the tokenizer itself append ``<|endoftext|>`` (recent Qwen3-Embedding tokenizers).
    ``kind="llama"``: ``<s>`` prepended, ``</s>`` as eos and pad.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_end|>", "<unk>"] if kind == "qwen" else ["<s>", "</s>", "<unk>"]
    vocab = {w: i for i, w in enumerate([*specials, *WORDS, *PROMPT_WORDS, *PUNCTUATION])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if kind == "qwen":
        if eos_in_template:
            end = ("<|endoftext|>", vocab["<|endoftext|>"])
            tok.post_processor = processors.TemplateProcessing(
                single="$A <|endoftext|>", special_tokens=[end]
            )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            unk_token="<unk>",
            pad_token="<|endoftext|>",
            eos_token="<|im_end|>",
            additional_special_tokens=["<|endoftext|>"],
            padding_side=padding_side,
            model_max_length=128,
        )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
        padding_side=padding_side,
        model_max_length=128,
    )


_COMMON = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # grouped-query attention, as in the real models
    "max_position_embeddings": 128,
}


def make_decoder(kind: str, vocab_size: int, *, seed: int = 0, **overrides):
    """A tiny random ``Qwen3Model`` / ``Qwen2Model`` / ``LlamaModel`` / ``MistralModel`` (fp32, 2 layers)."""
    import transformers

    config_class, model_class = {
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3Model),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2Model),
        "llama": (transformers.LlamaConfig, transformers.LlamaModel),
        "mistral": (transformers.MistralConfig, transformers.MistralModel),
    }[kind]
    settings = {**_COMMON, "head_dim": 8, **overrides}
    if kind == "mistral":
        settings.setdefault("sliding_window", None)
    torch.manual_seed(seed)
    return model_class(config_class(vocab_size=vocab_size, **settings))


def make_decoder_encoder(kind: str = "qwen3", *, padding_side: str = "left", seed: int = 0, **overrides):
    """An :class:`~embforge.encoder.Encoder` over a tiny decoder: last-token pooling, normalised, with the
    Qwen3-Embedding query prompt."""
    from embforge.encoder import Encoder
    from embforge.modeling.decoder import instruct_prompt

    tokenizer = make_decoder_tokenizer(
        "llama" if kind in ("llama", "mistral") else "qwen", padding_side=padding_side
    )
    backbone = make_decoder(kind, len(tokenizer), seed=seed, **overrides)
    return Encoder(
        backbone,
        tokenizer,
        pooling="lasttoken",
        normalize=True,
        max_seq_length=64,
        prompts={
            "query": instruct_prompt("given a question retrieve passages that answer it"),
            "document": "",
        },
    )
