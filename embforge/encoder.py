"""Encoder: a Hugging Face backbone + pooling + optional L2 normalisation + prompts.

The on-disk layout is sentence-transformers' (``modules.json``, ``1_Pooling/``, ``2_Normalize/``), so a folder
saved here loads in sentence-transformers and a sentence-transformers folder loads here.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from embforge.modeling.packing import pack, packed_hidden, pool_packed, supports_packing
from embforge.modeling.padding import pad_ids, sort_by_length, token_budget_chunks
from embforge.modeling.pooling import POOLING_MODES, mode_from_st_config, pool, st_config_for_mode
from embforge.modeling.resolve import load_backbone, resolve_model_path
from embforge.modeling.tokenizing import PromptTokenizing

if TYPE_CHECKING:
    from embforge.modeling.onnx_runtime import OnnxEncoder

ST_TRANSFORMER = "sentence_transformers.models.Transformer"
ST_POOLING = "sentence_transformers.models.Pooling"
ST_NORMALIZE = "sentence_transformers.models.Normalize"


class Encoder(PromptTokenizing, nn.Module):
    """A bi-encoder: texts -> fixed-size vectors.

    Example:
        >>> enc = Encoder.load("all-MiniLM-L6-v2")  # doctest: +SKIP
        >>> enc.encode(["a cat", "a dog"]).shape  # doctest: +SKIP
        (2, 384)
    """

    def __init__(
        self,
        backbone: Any,
        tokenizer: Any,
        *,
        pooling: str = "mean",
        normalize: bool = False,
        max_seq_length: int = 256,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
    ) -> None:
        super().__init__()
        if pooling not in POOLING_MODES:
            raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLING_MODES)}")
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = normalize
        self.max_seq_length = max_seq_length
        self.prompts = dict(prompts or {})
        self.default_prompt_name = default_prompt_name

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    # ------------------------------------------------------------------ tokenisation and forward
    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Embed one padded batch: ``(batch, seq)`` ids and mask -> ``(batch, dim)`` float embeddings."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        emb = pool(hidden, attention_mask, self.pooling).float()
        return F.normalize(emb, p=2, dim=-1) if self.normalize else emb

    def embed_ids(self, ids: Sequence[list[int]], *, max_tokens: int = 4096) -> Tensor:
        """Embed many tokenised texts with gradients, in the input order.

        BERT-family backbones run padding-free (:mod:`embforge.modeling.packing`; ``max_tokens`` bounds each padded
        attention block). Others sort texts by length and forward chunks of at most ``max_tokens`` padded tokens.
        Either way each text's embedding is what a single padded forward would give (attention never crosses
        texts); only padding work is saved.
        """
        if supports_packing(self.backbone):  # padding-free: same values, less work (embforge/packing.py)
            batch = pack(ids, max_tokens=max_tokens, device=self.device)
            first_only = self.pooling == "cls"  # the last layer then skips what CLS pooling never reads
            hidden = packed_hidden(self.backbone, batch, first_tokens_only=first_only)
            emb = (hidden if first_only else pool_packed(hidden, batch, self.pooling)).float()
            emb = F.normalize(emb, p=2, dim=-1) if self.normalize else emb
            return emb[batch.inverse]
        order = sort_by_length(ids)
        pad_id = self.pad_token_id
        parts = []
        for chunk in token_budget_chunks([len(ids[i]) for i in order], max_tokens):
            batch_ids, mask = pad_ids([ids[order[i]] for i in chunk], pad_id, device=self.device)
            parts.append(self(batch_ids, mask))
        emb = torch.cat(parts)
        inverse = torch.empty(len(order), dtype=torch.long, device=emb.device)
        inverse[torch.as_tensor(order, device=emb.device)] = torch.arange(len(order), device=emb.device)
        return emb[inverse]

    def prepare_task(self, task: Any) -> Any:
        """Tokenise a training task once (see :mod:`embforge.training.tasks`)."""
        from embforge.training.tasks import PreparedEmbeddingTask

        return PreparedEmbeddingTask(task, self)

    # ------------------------------------------------------------------ inference
    @torch.inference_mode()
    def encode(
        self,
        texts: str | Sequence[str],
        *,
        batch_size: int = 32,
        normalize: bool | None = None,
        dim: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        show_progress: bool | None = None,
    ) -> np.ndarray:
        """Embed texts for inference.

        Args:
            texts: One text or a list of texts.
            batch_size: Texts per forward pass; texts are sorted by token length first so batches pad little.
            normalize: L2-normalise the output; ``None`` keeps the model's own setting.
            dim: Keep only the first ``dim`` dimensions (Matryoshka); re-normalised when normalising.
            prompt: A literal prefix for every text (overrides ``prompt_name``).
            prompt_name: The name of one of the model's prompts (e.g. ``"query"``).
            show_progress: Progress bar; ``None`` shows it for long inputs on a terminal.

        Returns:
            ``(n, dim)`` float32 array (or ``(dim,)`` for a single string).
        """
        single = isinstance(texts, str)
        batch: list[str] = [texts] if isinstance(texts, str) else list(texts)
        if dim is not None and not 0 < dim <= self.dim:
            raise ValueError(f"dim must be between 1 and the model's dimension {self.dim}, got {dim}")
        was_training = self.training
        self.eval()
        ids = self.tokenize_ids(batch, prefix=self.prompt_text(prompt, prompt_name))
        order = sort_by_length(ids)
        n_batches = (len(ids) + batch_size - 1) // batch_size
        if show_progress is None:
            show_progress = n_batches > 20 and sys.stderr.isatty()
        out = torch.empty((len(ids), self.dim), dtype=torch.float32)
        for start in tqdm(range(0, len(ids), batch_size), disable=not show_progress, desc="encode"):
            rows = order[start : start + batch_size]
            batch_ids, mask = pad_ids([ids[i] for i in rows], self.pad_token_id, device=self.device)
            out[rows] = self(batch_ids, mask).float().cpu()
        self.train(was_training)
        do_norm = self.normalize if normalize is None else normalize
        if dim is not None:
            out = out[:, :dim]
        if do_norm and (dim is not None or not self.normalize):
            out = F.normalize(out, p=2, dim=-1)
        if single:
            out = out[0]
        return out.numpy()

    # ------------------------------------------------------------------ persistence
    @overload
    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        device: str | torch.device | None = None,
        pooling: str | None = None,
        normalize: bool | None = None,
        max_seq_length: int | None = None,
        backend: Literal["torch"] = "torch",
    ) -> Encoder: ...

    @overload
    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        device: str | torch.device | None = None,
        pooling: str | None = None,
        normalize: bool | None = None,
        max_seq_length: int | None = None,
        backend: Literal["onnx"],
    ) -> OnnxEncoder: ...

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        device: str | torch.device | None = None,
        pooling: str | None = None,
        normalize: bool | None = None,
        max_seq_length: int | None = None,
        backend: str = "torch",
    ) -> Encoder | OnnxEncoder:
        """Load a sentence-transformers folder (honouring ``modules.json``) or any Hugging Face encoder folder.

        Options given here override what the folder says. A plain HF folder gets mean pooling, no
        normalisation and ``max_seq_length = min(512, tokenizer.model_max_length)`` unless told otherwise.
        ``backend="onnx"`` loads an ``embforge export onnx`` folder (or one ``.onnx`` file in it, e.g. the int8
        graph) as an :class:`~embforge.modeling.onnx_runtime.OnnxEncoder` with the same ``encode()`` (CPU only).
        """
        if backend == "onnx":
            from embforge.modeling.onnx_runtime import OnnxEncoder

            if device is not None and str(device) != "cpu":
                raise ValueError(f"the onnx backend runs on the CPU; device={device!r} is not supported")
            return OnnxEncoder.load(path, pooling=pooling, normalize=normalize, max_seq_length=max_seq_length)
        if backend != "torch":
            raise ValueError(f"backend must be 'torch' or 'onnx', got {backend!r}")
        root = resolve_model_path(path)
        settings = read_st_settings(root)
        backbone, tokenizer = load_backbone(root / settings.pop("transformer_path"))
        if pooling is not None:
            settings["pooling"] = pooling
        if normalize is not None:
            settings["normalize"] = normalize
        if max_seq_length is not None:
            settings["max_seq_length"] = max_seq_length
        if settings.get("max_seq_length") is None:
            settings["max_seq_length"] = min(512, int(getattr(tokenizer, "model_max_length", 512) or 512))
        model = cls(backbone, tokenizer, **settings)
        if device is not None:
            model.to(device)
        return model

    def save(self, path: str | os.PathLike) -> None:
        """Write safetensors weights, tokenizer and sentence-transformers configs to ``path``."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(root, safe_serialization=True)
        self.tokenizer.save_pretrained(root)
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": ST_TRANSFORMER},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": ST_POOLING},
        ]
        if self.normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": ST_NORMALIZE})
            (root / "2_Normalize").mkdir(exist_ok=True)
        _write_json(root / "modules.json", modules)
        _write_json(
            root / "sentence_bert_config.json",
            {"max_seq_length": self.max_seq_length, "do_lower_case": False},
        )
        (root / "1_Pooling").mkdir(exist_ok=True)
        _write_json(root / "1_Pooling" / "config.json", st_config_for_mode(self.pooling, self.dim))
        _write_json(
            root / "config_sentence_transformers.json",
            {
                "model_type": "SentenceTransformer",
                "prompts": self.prompts,
                "default_prompt_name": self.default_prompt_name,
                "similarity_fn_name": "cosine",
                "__version__": {"embforge": _version()},
            },
        )


def read_st_settings(root: Path) -> dict:
    """Read pooling, normalisation, max length and prompts from a sentence-transformers folder.

    A folder without ``modules.json`` is a plain HF encoder: mean pooling, no normalisation.
    """
    settings: dict = {"transformer_path": "", "pooling": "mean", "normalize": False, "max_seq_length": None}
    modules_file = root / "modules.json"
    if not modules_file.exists():
        return settings
    for module in json.loads(modules_file.read_text()):
        kind = module["type"].rsplit(".", 1)[-1]
        sub = root / module.get("path", "")
        if kind == "Transformer":
            settings["transformer_path"] = module.get("path", "")
            for name in ("sentence_bert_config.json", "config_sentence_transformers_transformer.json"):
                if (sub / name).exists():
                    settings["max_seq_length"] = json.loads((sub / name).read_text()).get("max_seq_length")
                    break
        elif kind == "Pooling":
            settings["pooling"] = mode_from_st_config(json.loads((sub / "config.json").read_text()))
        elif kind == "Normalize":
            settings["normalize"] = True
        else:
            raise ValueError(
                f"{modules_file}: module type {module['type']!r} is not supported by embforge "
                "(supported: Transformer, Pooling, Normalize)"
            )
    st_config = root / "config_sentence_transformers.json"
    if st_config.exists():
        config = json.loads(st_config.read_text())
        settings["prompts"] = config.get("prompts") or {}
        settings["default_prompt_name"] = config.get("default_prompt_name")
    return settings


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def _version() -> str:
    from embforge import __version__

    return __version__
