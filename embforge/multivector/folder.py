"""pylate's ColBERT folder layout, read and written (a folder saved here loads in pylate and the other way round).

::

    modules.json                       Transformer (path ""), pylate.models.Dense.Dense (path "1_Dense")
    config.json, model.safetensors     the Hugging Face backbone (its vocabulary includes "[Q] " and "[D] ")
    tokenizer files
    sentence_bert_config.json          {"max_seq_length": document_length - 1, "do_lower_case": false}
    config_sentence_transformers.json  model_type "ColBERT", query/document prefix and length, skiplist_words,
                                       do_query_expansion, attend_to_expansion_tokens, similarity "MaxSim"
    1_Dense/config.json                in_features, out_features, bias, activation_function, use_residual
    1_Dense/model.safetensors          linear.weight (out, in)

Any other encoder folder (a plain Hugging Face model or a sentence-transformers bi-encoder) starts a new ColBERT
model as pylate does: its Transformer (pooling and normalisation dropped), the marker tokens added to the
vocabulary (the embedding matrix grows by two rows), and a new bias-free ``dim``-d projection.
"""

from __future__ import annotations

import os
import string
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embforge.modeling import st_folder
from embforge.modeling.dense import Dense
from embforge.modeling.lora import save_backbone
from embforge.modeling.resolve import load_backbone, resolve_model_path

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from embforge.protocols import ModelPath

PYLATE_DENSE = "pylate.models.Dense.Dense"
COLBERT_MODEL_TYPE = "ColBERT"


@dataclass
class ColBERTSettings:
    """What pylate writes in ``config_sentence_transformers.json`` besides the prompts (same keys, same defaults)."""

    query_prefix: str = "[Q] "
    document_prefix: str = "[D] "
    query_length: int = 32
    document_length: int = 180
    attend_to_expansion_tokens: bool = False
    skiplist_words: list[str] = field(default_factory=lambda: list(string.punctuation))
    do_query_expansion: bool = True

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ColBERTSettings:
        known = {k: config[k] for k in asdict(cls()) if config.get(k) is not None}
        settings = cls(**known)
        if not settings.query_prefix or not settings.document_prefix:
            raise ValueError(
                "embforge's multi-vector models need non-empty query and document prefixes (the marker tokens say "
                "which texts are queries); this folder sets an empty one"
            )
        if not settings.do_query_expansion:
            settings.attend_to_expansion_tokens = False
        return settings


@dataclass
class ColBERTParts:
    """What a ColBERT folder holds: read into and saved from
    :class:`~embforge.multivector.model.MultiVectorEncoder` (this module never sees the model)."""

    backbone: nn.Module
    tokenizer: PreTrainedTokenizerBase
    projection: Dense
    settings: ColBERTSettings
    prompts: dict[str, str]


def is_colbert_folder(root: Path) -> bool:
    """Whether ``root`` is a pylate ColBERT folder (its ``config_sentence_transformers.json`` says so)."""
    data = st_folder.read_st_config(root)
    return data.get("model_type") == COLBERT_MODEL_TYPE or "query_prefix" in data


def read_multivector(path: ModelPath, *, dim: int = 128, document_length: int | None = None) -> ColBERTParts:
    """The parts of a pylate folder, or of a new ColBERT model on any encoder folder (see above)."""
    root = resolve_model_path(path)
    if is_colbert_folder(root):
        config = st_folder.read_st_config(root)
        transformer, denses = _modules(root)
        if len(denses) != 1:
            raise ValueError(
                f"{root}: embforge reads pylate folders with exactly one Dense projection, found {len(denses)}"
            )
        backbone, tokenizer = load_backbone(root / transformer)
        settings = ColBERTSettings.from_config(config)
        projection = Dense.load(root / denses[0])
        prompts = config.get("prompts") or {}
    else:
        transformer, _ = _modules(root) if st_folder.has_modules(root) else ("", [])
        backbone, tokenizer = load_backbone(root / transformer)
        settings = ColBERTSettings()
        _add_markers(backbone, tokenizer, settings)
        projection = Dense(_hidden_size(backbone), dim, bias=False)
        prompts = {}
    if document_length is not None:
        settings.document_length = int(document_length)
    return ColBERTParts(backbone, tokenizer, projection, settings, prompts)


def _modules(root: Path) -> tuple[str, list[str]]:
    """The Transformer's path and the Dense modules' paths of a ``modules.json`` (pooling/normalise skipped)."""
    transformer, denses = "", []
    for module in st_folder.read_modules(root):
        if module.kind == "Transformer":
            transformer = module.path
        elif module.kind == "Dense":
            denses.append(module.path)
    return transformer, denses


def _hidden_size(backbone: Any) -> int:
    return int(backbone.config.hidden_size)


def _add_markers(backbone: Any, tokenizer: PreTrainedTokenizerBase, settings: ColBERTSettings) -> None:
    """Add the query/document marker tokens to the vocabulary and grow the embedding matrix to match."""
    tokenizer.add_tokens([settings.query_prefix, settings.document_prefix])
    backbone.resize_token_embeddings(len(tokenizer))


def save_multivector(model: ColBERTParts, path: str | os.PathLike) -> None:
    """Write ``model``'s parts in pylate's layout (see the module docstring)."""
    root = save_backbone(model.backbone, path)
    model.tokenizer.save_pretrained(root)
    st_folder.write_modules(root, [("", st_folder.ST_TRANSFORMER), ("1_Dense", PYLATE_DENSE)])
    st_folder.write_transformer_config(root, model.settings.document_length - 1)
    model.projection.save(root / "1_Dense")
    dense_config = st_folder.read_json(root / "1_Dense" / "config.json")
    st_folder.write_json(root / "1_Dense" / "config.json", {**dense_config, "use_residual": False})
    st_folder.write_model_config(
        root,
        COLBERT_MODEL_TYPE,
        prompts=model.prompts,
        default_prompt_name=None,
        similarity="MaxSim",
        **asdict(model.settings),
    )
