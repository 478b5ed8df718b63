"""sentence-transformers ``SparseEncoder`` folders, read into and written from :class:`SparseParts` (the
pieces :class:`~embforge.sparse.model.SparseEncoder` is built from and saves; this module never sees the model).

Two layouts:

- plain SPLADE: the MLM weights and tokenizer at the root (``MLMTransformer``) and ``1_SpladePooling/config.json``;
- inference-free SPLADE: one ``Router`` module whose ``router_config.json`` sends queries to
  ``query_0_SparseStaticEmbedding/`` (a ``weight`` vector in ``model.safetensors``) and documents to
  ``document_0_MLMTransformer/`` + ``document_1_SpladePooling/``.

Module types are written with the names sentence-transformers 5 used (``sparse_encoder.models.MLMTransformer``,
``models.Router``), which sentence-transformers 6 still loads; both generations' names are read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import torch
from safetensors.torch import load_file, save_file

from embforge.modeling import st_folder
from embforge.modeling.lora import save_backbone
from embforge.modeling.resolve import default_max_seq_length, hf_quiet, resolve_model_path

if TYPE_CHECKING:
    from torch import Tensor, nn
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from embforge.protocols import ModelPath

ST_MLM = "sentence_transformers.sparse_encoder.models.MLMTransformer"
ST_SPLADE_POOLING = "sentence_transformers.sparse_encoder.models.SpladePooling"
ST_STATIC_QUERY = "sentence_transformers.sparse_encoder.models.SparseStaticEmbedding"
ST_ROUTER = "sentence_transformers.models.Router"
_ENCODERS = ("MLMTransformer", "Transformer")
QUERY_DIR, DOCUMENT_DIR, POOLING_DIR = (
    "query_0_SparseStaticEmbedding",
    "document_0_MLMTransformer",
    "document_1_SpladePooling",
)


@dataclass
class SparseParts:
    """What a sparse folder holds: the MLM backbone and tokenizer, SPLADE pooling settings, prompts, and the query
    weight table of an inference-free model (``None`` otherwise; ``frozen``: it is not trained)."""

    backbone: nn.Module
    tokenizer: PreTrainedTokenizerBase
    pooling: str = "max"
    activation: str = "relu"
    max_seq_length: int = 256
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    query_weights: Tensor | None = None
    frozen: bool = False

    @property
    def dim(self) -> int:
        """The vocabulary size (the length of every vector)."""
        return int(cast("PretrainedConfig", self.backbone.config).vocab_size)


class _Layout(TypedDict):
    document: Path  # the MLM encoder's folder
    query: Path | None  # the query table's (inference-free models)
    pooling: dict[str, Any]  # SpladePooling's config.json


def _layout(root: Path) -> _Layout:
    """Where the MLM encoder, pooling settings and query table of a folder are."""
    found: _Layout = {"document": root, "query": None, "pooling": {}}
    if not st_folder.has_modules(root):
        return found
    modules = [(module.kind, module.folder) for module in st_folder.read_modules(root)]
    if modules and modules[0][0] == "Router":
        router = modules[0][1] / "router_config.json"
        config = st_folder.read_json(router)
        structure = config.get("structure", {})
        modules = [
            (st_folder.module_kind(config["types"][name]), st_folder.inside(root, name, router))
            for name in structure.get("document", [])
        ]
        for name in structure.get("query", []):
            if st_folder.module_kind(config["types"][name]) != "SparseStaticEmbedding":
                raise ValueError(
                    f"{root}: query module {name!r} is not supported (only SparseStaticEmbedding)"
                )
            found["query"] = st_folder.inside(root, name, router)
    for kind, sub in modules:
        if kind in _ENCODERS:
            found["document"] = sub
        elif kind == "SpladePooling":
            found["pooling"] = st_folder.read_json(sub / "config.json")
        else:
            raise ValueError(
                f"{root / st_folder.MODULES_FILE}: module type {kind!r} is not supported by embforge's sparse models "
                "(supported: MLMTransformer, SpladePooling, a Router with a SparseStaticEmbedding query route)"
            )
    return found


def read_sparse_folder(
    path: ModelPath, *, max_seq_length: int | None, inference_free: bool | None
) -> SparseParts:
    """The parts of a folder (see the module doc); ``inference_free=True`` adds a query table (all weights 1)
    where the folder has none, ``False`` leaves a folder's table out."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    root = resolve_model_path(path)
    layout = _layout(root)
    document: Path = layout["document"]
    tokenizer = AutoTokenizer.from_pretrained(str(document), local_files_only=True)
    with hf_quiet():
        backbone = AutoModelForMaskedLM.from_pretrained(str(document), local_files_only=True)
    query_weights, frozen = None, False
    if layout["query"] is not None and inference_free is not False:
        query_weights = load_file(str(layout["query"] / "model.safetensors"))["weight"]
        frozen = bool(st_folder.read_json(layout["query"] / "config.json").get("frozen", False))
    elif inference_free:
        query_weights = torch.ones(int(backbone.config.vocab_size))
    st = st_folder.read_st_config(root)
    pooling = layout["pooling"]
    return SparseParts(
        backbone,
        tokenizer,
        pooling=pooling.get("pooling_strategy", "max"),
        activation=pooling.get("activation_function", "relu"),
        max_seq_length=max_seq_length
        or st_folder.read_max_seq_length(document)
        or default_max_seq_length(tokenizer),
        prompts={k: v for k, v in (st.get("prompts") or {}).items() if v},
        default_prompt_name=st.get("default_prompt_name"),
        query_weights=query_weights,
        frozen=frozen,
    )


def write_sparse_folder(model: SparseParts, path: str | os.PathLike) -> None:
    """Write ``model``'s parts as a sentence-transformers ``SparseEncoder`` folder (a ``Router`` with a query
    table)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    pooling = {
        "pooling_strategy": model.pooling,
        "activation_function": model.activation,
        "word_embedding_dimension": model.dim,
    }
    weights = model.query_weights  # inference-free: the query table
    document = root / DOCUMENT_DIR if weights is not None else root
    save_backbone(model.backbone, document)
    model.tokenizer.save_pretrained(document)
    st_folder.write_transformer_config(document, model.max_seq_length)
    if weights is not None:
        query = root / QUERY_DIR
        query.mkdir(exist_ok=True)
        save_file({"weight": weights.detach().float().cpu().contiguous()}, str(query / "model.safetensors"))
        st_folder.write_json(query / "config.json", {"frozen": model.frozen})
        model.tokenizer.save_pretrained(query)
        st_folder.write_json(root / POOLING_DIR / "config.json", pooling)
        st_folder.write_json(
            root / "router_config.json",
            {
                "types": {QUERY_DIR: ST_STATIC_QUERY, DOCUMENT_DIR: ST_MLM, POOLING_DIR: ST_SPLADE_POOLING},
                "structure": {"query": [QUERY_DIR], "document": [DOCUMENT_DIR, POOLING_DIR]},
                "parameters": {"default_route": "document", "allow_empty_key": True},
            },
        )
        modules = [("", ST_ROUTER)]
    else:
        st_folder.write_json(root / "1_SpladePooling" / "config.json", pooling)
        modules = [("", ST_MLM), ("1_SpladePooling", ST_SPLADE_POOLING)]
    st_folder.write_modules(root, modules)
    st_folder.write_model_config(
        root,
        "SparseEncoder",
        prompts={"query": "", "document": "", **model.prompts},
        default_prompt_name=model.default_prompt_name,
        similarity="dot",
    )
