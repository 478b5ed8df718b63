"""Pooling: token embeddings + attention mask -> one vector per text."""

from __future__ import annotations

import torch
from torch import Tensor

POOLING_MODES = ("mean", "cls", "max", "lasttoken")


def pool(token_embeddings: Tensor, attention_mask: Tensor, mode: str) -> Tensor:
    """Pool ``(batch, seq, dim)`` token embeddings into ``(batch, dim)``.

    Args:
        token_embeddings: Last hidden state of the backbone.
        attention_mask: ``(batch, seq)`` with 1 for real tokens, 0 for padding.
        mode: One of ``mean``, ``cls``, ``max``, ``lasttoken``.
    """
    if mode == "mean":
        mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
        summed = (token_embeddings * mask).sum(dim=1)
        return summed / mask.sum(dim=1).clamp(min=1e-9)
    if mode == "cls":
        return token_embeddings[:, 0]
    if mode == "max":
        mask = attention_mask.unsqueeze(-1).bool()
        filled = token_embeddings.masked_fill(~mask, torch.finfo(token_embeddings.dtype).min)
        return filled.max(dim=1).values
    if mode == "lasttoken":
        # works for left and right padding: the last position whose mask is 1
        seq_len = attention_mask.shape[1]
        positions = torch.arange(seq_len, device=attention_mask.device).expand_as(attention_mask)
        last = (positions * attention_mask.long()).argmax(dim=1)
        return token_embeddings[torch.arange(token_embeddings.shape[0], device=last.device), last]
    raise ValueError(f"unknown pooling mode {mode!r}; choose one of {', '.join(POOLING_MODES)}")


# sentence-transformers' 1_Pooling/config.json keys <-> our mode names
ST_POOLING_KEYS = {
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


def mode_from_st_config(config: dict) -> str:
    """Read the pooling mode out of a sentence-transformers ``1_Pooling/config.json``."""
    if "pooling_mode" in config and isinstance(config["pooling_mode"], str):
        name = config["pooling_mode"].replace("_", "")
        return {"meantokens": "mean", "clstoken": "cls", "maxtokens": "max"}.get(name, name)
    active = [mode for mode, key in ST_POOLING_KEYS.items() if config.get(key)]
    if config.get("pooling_mode_mean_sqrt_len_tokens") or config.get("pooling_mode_weightedmean_tokens"):
        raise ValueError(
            "sqrt-length and weighted-mean pooling are not supported; use mean, cls, max or lasttoken"
        )
    if len(active) != 1:
        raise ValueError(f"expected exactly one pooling mode in the pooling config, found {active or 'none'}")
    return active[0]


def st_config_for_mode(mode: str, dim: int) -> dict:
    """Build a sentence-transformers ``1_Pooling/config.json`` for ``mode``."""
    config: dict = {"word_embedding_dimension": dim}
    for name, key in ST_POOLING_KEYS.items():
        config[key] = name == mode
    config["pooling_mode_mean_sqrt_len_tokens"] = False
    config["pooling_mode_weightedmean_tokens"] = False
    config["include_prompt"] = True
    return config
