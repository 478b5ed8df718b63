"""Encoder: a Hugging Face backbone + pooling + optional L2 normalisation + prompts.

The on-disk layout is sentence-transformers' (``modules.json``, ``1_Pooling/``, optional ``2_Dense/``,
``2_Normalize/``), so a folder saved here loads in sentence-transformers and a sentence-transformers folder loads here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Literal, overload

import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn

from embforge.kinds import ModelKind
from embforge.modeling.adapters import load_task_adapters, task_names, tasks_of, using_task
from embforge.modeling.decoder import backbone_hidden, eos_to_append, is_decoder_backbone
from embforge.modeling.decoder_packing import packed_decoder_hidden, supports_decoder_packing
from embforge.modeling.dense import ST_DENSE, Dense
from embforge.modeling.dropout import mix, text_keys
from embforge.modeling.encoding import BatchEncoding
from embforge.modeling.lora import adapter_note, has_adapter, load_adapter, save_backbone, uses_adapters
from embforge.modeling.module import TextModule
from embforge.modeling.packed_batch import pack
from embforge.modeling.packing import packed_hidden, pool_packed, supports_packing
from embforge.modeling.padding import BLOCK_TOKENS, CHUNK_TOKENS, in_length_chunks, pad_ids, token_chunks
from embforge.modeling.pooling import POOLING_MODES, pool, st_config_for_mode
from embforge.modeling.resolve import default_max_seq_length, load_backbone, resolve_model_path
from embforge.modeling.st_folder import (
    POOLING_DIR,
    ST_NORMALIZE,
    ST_POOLING,
    ST_TRANSFORMER,
    has_modules,
    read_st_settings,
    write_json,
    write_model_config,
    write_modules,
    write_transformer_config,
)
from embforge.onnx.runtime import OnnxEncoder
from embforge.protocols import LoadOptions

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from typing_extensions import Unpack

    from embforge.onnx.runtime import OnnxEncoder
    from embforge.protocols import DeviceLike, EncodeOptions, ModelPath

# Real tokens per padding-free inference forward (Encoder.batch_plan). On an accelerator each forward's fixed
# number of operations are kernel launches, so chunks are large; on a CPU an operation costs microseconds and a
# forward is fastest when its activations stay in cache (MiniLM on STS-B: 2048 tokens 636 sentences/s, 16384: 455-487).
ENCODE_TOKENS = 16384  # accelerators, at least (batch_size x max_seq_length if larger)
CPU_ENCODE_TOKENS = 2048


class EncoderOptions(LoadOptions, total=False):
    """The keyword options of :meth:`Encoder.load` besides ``backend`` (each overrides the folder's setting)."""

    pooling: str | None
    normalize: bool | None


class Encoder(TextModule, BatchEncoding):
    """A bi-encoder: texts -> fixed-size vectors.

    Example:
        >>> enc = Encoder.load("all-MiniLM-L6-v2")  # doctest: +SKIP
        >>> enc.encode(["a cat", "a dog"]).shape  # doctest: +SKIP
        (2, 384)
    """

    kind: ClassVar[ModelKind] = ModelKind.DENSE

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        pooling: str = "mean",
        normalize: bool = False,
        max_seq_length: int = 256,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
        dense: Dense | None = None,
    ) -> None:
        super().__init__()
        if pooling not in POOLING_MODES:
            raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLING_MODES)}")
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = normalize
        self.max_seq_length = max_seq_length
        self.encode_tokens: int | None = None  # real tokens per packed encode forward; None: by device
        self.prompts = dict(prompts or {})
        self.default_prompt_name = default_prompt_name
        # decoder (LLM) embedders pool the last token: every text ends with an end-of-text token (modeling/decoder.py)
        self.append_token_id = eos_to_append(tokenizer) if is_decoder_backbone(backbone) else None
        self.dense = dense  # a projection after pooling (sentence-transformers' Dense), e.g. for mse_distill

    # ------------------------------------------------------------------ properties
    @property
    def padding_side(self) -> str:
        """The tokenizer's padding side (Qwen3-Embedding's is ``left``); positions and pooling handle both."""
        return "left" if getattr(self.tokenizer, "padding_side", "right") == "left" else "right"

    @property
    def packs_tokens(self) -> bool:
        """Whether :meth:`forward` runs padding-free (BERT family: :mod:`~embforge.modeling.packing`; Qwen, Llama,
        Mistral: :mod:`~embforge.modeling.decoder_packing`); packing.py reads BERT's projection weights directly
        and would skip LoRA layers, so adapted BERT models go padded."""
        if supports_decoder_packing(self.backbone):
            return True
        return supports_packing(self.backbone) and not uses_adapters(self.backbone)

    @property
    def dim(self) -> int:
        return (
            int(self.dense.out_features) if self.dense is not None else int(self.backbone_config.hidden_size)
        )

    @property
    def tasks(self) -> list[str]:
        """The task adapters this model holds (:mod:`embforge.modeling.adapters`), ``[]`` for none."""
        return task_names(self.backbone)

    # ------------------------------------------------------------------ forward (TextModule.forward)
    def forward_ids(
        self, ids: Sequence[Sequence[int]], *, max_tokens: int | None, seed: int | None, places: list[int]
    ) -> Tensor:
        """``(n, dim)`` float embeddings of token-id lists, in the input order. BERT-family backbones run
        padding-free (:mod:`embforge.modeling.packing`; ``max_tokens`` bounds each padded attention block, default
        ``BLOCK_TOKENS``), Qwen, Llama and Mistral packed causal (:mod:`embforge.modeling.decoder_packing`),
        others in length-sorted padded chunks of at most ``max_tokens`` tokens (default ``CHUNK_TOKENS``)."""
        if supports_decoder_packing(self.backbone):  # Qwen/Llama/Mistral: packed causal (decoder_packing.py)
            batch = pack(ids, max_tokens=max_tokens or BLOCK_TOKENS, device=self.device)
            last_only = self.pooling == "lasttoken"
            hidden = packed_decoder_hidden(
                self.backbone,
                batch,
                last_tokens_only=last_only,
                seed=None if seed is None else mix(seed, places[0]),
                checkpoint_layers=self.checkpointing,
            )
            emb = (hidden if last_only else pool_packed(hidden, batch, self.pooling)).float()
            return self._head(emb)[batch.inverse]
        if self.packs_tokens:  # BERT family, padding-free (packing.py)
            keys = None if seed is None else text_keys(seed, places, device=self.device)
            batch = pack(ids, max_tokens=max_tokens or BLOCK_TOKENS, keys=keys, device=self.device)
            first_only = self.pooling == "cls"  # the last layer then skips what CLS pooling never reads
            hidden = packed_hidden(
                self.backbone, batch, first_tokens_only=first_only, checkpoint_layers=self.checkpointing
            )
            emb = (hidden if first_only else pool_packed(hidden, batch, self.pooling)).float()
            return self._head(emb)[batch.inverse]
        return in_length_chunks(
            ids,
            max_tokens or CHUNK_TOKENS,
            lambda chunk: self.padded_forward(
                *pad_ids(chunk, self.pad_token_id, device=self.device, side=self.padding_side)
            ),
            seed=seed,
            places=places,
        )

    def padded_forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        hidden = backbone_hidden(self.backbone, input_ids, attention_mask)  # decoders: real-token positions
        return self._head(pool(hidden, attention_mask, self.pooling).float())

    def _head(self, pooled: Tensor) -> Tensor:
        """What follows pooling: the optional Dense projection, then the optional L2 normalisation."""
        emb = self.dense(pooled) if self.dense is not None else pooled
        return F.normalize(emb, p=2, dim=-1) if self.normalize else emb

    def embed_ids(self, ids: Sequence[list[int]], *, max_tokens: int | None = None) -> Tensor:
        """Embed many tokenised texts with gradients, in the input order (``self(ids, max_tokens=...)``)."""
        return self(ids, max_tokens=max_tokens)

    # ------------------------------------------------------------------ inference (encode: modeling/encoding.py)
    def encode(
        self, texts: str | Sequence[str], *, task: str | None = None, **options: Unpack[EncodeOptions]
    ) -> np.ndarray:
        """:meth:`BatchEncoding.encode <embforge.modeling.encoding.BatchEncoding.encode>` with the task adapter
        ``task`` (one of :attr:`tasks`; ``None``: the model as it is, the base of a loaded task-adapter folder).

        Raises:
            ValueError: ``task`` is not one of the model's tasks (the message names them).
        """
        with using_task(self, task):
            return super().encode(texts, **options)

    def embed_batch(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """One forward pass (no gradients when run inside :meth:`inference`): ``(n, dim)`` float32 — the
        padding-free forward where the backbone has one, else one padded batch."""
        if self.packs_tokens:
            return self(ids).float().cpu().numpy()
        batch_ids, mask = pad_ids(ids, self.pad_token_id, device=self.device, side=self.padding_side)
        return self.padded_forward(batch_ids, mask).float().cpu().numpy()

    def batch_plan(self, lengths: Sequence[int], batch_size: int) -> list[range]:
        """Padding-free backbones: length-sorted chunks of up to :meth:`encode_budget` real tokens (nothing is
        padded but inside attention). Others: ``batch_size`` texts."""
        if not self.packs_tokens:
            return super().batch_plan(lengths, batch_size)
        return token_chunks(lengths, self.encode_budget(batch_size))

    def encode_budget(self, batch_size: int) -> int:
        """Real tokens per packed encode forward: :attr:`encode_tokens` when set; on a CPU ``CPU_ENCODE_TOKENS``
        (cache-sized); on an accelerator ``max(batch_size × max_seq_length, ENCODE_TOKENS)`` — at least what a
        padded batch could hold, so one forward (a fixed number of kernel launches) carries hundreds of texts."""
        if self.encode_tokens is not None:
            return self.encode_tokens
        if self.device.type == "cpu":
            return CPU_ENCODE_TOKENS
        return max(batch_size * self.max_seq_length, ENCODE_TOKENS)

    # ------------------------------------------------------------------ persistence
    @overload
    @classmethod
    def load(
        cls, path: ModelPath, *, backend: Literal["torch"] = "torch", **options: Unpack[EncoderOptions]
    ) -> Encoder: ...

    @overload
    @classmethod
    def load(
        cls, path: ModelPath, *, backend: Literal["onnx"], **options: Unpack[EncoderOptions]
    ) -> OnnxEncoder: ...

    @classmethod
    def load(
        cls,
        path: ModelPath,
        *,
        device: DeviceLike = None,
        pooling: str | None = None,
        normalize: bool | None = None,
        max_seq_length: int | None = None,
        backend: str = "torch",
    ) -> Encoder | OnnxEncoder:
        """Load a sentence-transformers folder (honouring ``modules.json``) or any Hugging Face encoder folder.

        Options given here override what the folder says. A plain HF folder gets mean pooling, no
        normalisation and ``max_seq_length = min(512, tokenizer.model_max_length)`` unless told otherwise.
        ``backend="onnx"`` loads an ``embforge export onnx`` folder (or one ``.onnx`` file in it, e.g. the int8
        graph) as an :class:`~embforge.onnx.runtime.OnnxEncoder` with the same ``encode()`` (CPU only).
        """
        if backend == "onnx":
            if device is not None and str(device) != "cpu":
                raise ValueError(f"the onnx backend runs on the CPU; device={device!r} is not supported")
            return OnnxEncoder.load(path, pooling=pooling, normalize=normalize, max_seq_length=max_seq_length)
        if backend != "torch":
            raise ValueError(f"backend must be 'torch' or 'onnx', got {backend!r}")
        root = resolve_model_path(path)
        settings = read_st_settings(root)
        backbone, tokenizer = load_backbone(root / settings.pop("transformer_path"))
        if has_adapter(root):  # LoRA: base weights in the folder, the adapter in adapter/ (modeling/lora.py)
            backbone = load_adapter(backbone, root)
        elif tasks_of(root):  # task adapters in adapters/<name>/, off until encode(task=...) (adapters.py)
            backbone = load_task_adapters(backbone, root)
        if not has_modules(root) and is_decoder_backbone(backbone):
            settings["pooling"] = "lasttoken"  # a plain HF decoder folder: its last token sees the whole text
        if pooling is not None:
            settings["pooling"] = pooling
        if normalize is not None:
            settings["normalize"] = normalize
        if max_seq_length is not None:
            settings["max_seq_length"] = max_seq_length
        if settings.get("max_seq_length") is None:
            settings["max_seq_length"] = default_max_seq_length(tokenizer)
        return cls(backbone, tokenizer, **settings).loaded_from(path, device=device)

    def load_weights(self, path: ModelPath) -> None:
        """Load the weights of the encoder saved at ``path`` into this one, in place (a pipeline resuming from its
        last finished stage): a ``2_Dense`` projection there that this model lacks is added first."""
        trained = Encoder.load(path)
        if trained.dense is not None and self.dense is None:
            self.dense = Dense(int(self.dim), int(trained.dim)).to(self.device)
        self.load_state_dict(trained.state_dict())

    def save(self, path: str | os.PathLike) -> None:
        """Write safetensors weights, tokenizer and sentence-transformers configs to ``path``."""
        root = save_backbone(self.backbone, path)  # with adapters: base weights + adapter/ (lora.py)
        self.tokenizer.save_pretrained(root)
        modules = [("", ST_TRANSFORMER), (POOLING_DIR, ST_POOLING)]
        if self.dense is not None:
            modules.append(("2_Dense", ST_DENSE))
            self.dense.save(root / "2_Dense")
        if self.normalize:
            modules.append((f"{len(modules)}_Normalize", ST_NORMALIZE))
            (root / modules[-1][0]).mkdir(exist_ok=True)
        write_modules(root, modules)
        write_transformer_config(root, self.max_seq_length)
        (root / POOLING_DIR).mkdir(exist_ok=True)
        write_json(
            root / POOLING_DIR / "config.json",
            st_config_for_mode(self.pooling, self.backbone_config.hidden_size),
        )
        write_model_config(
            root,
            "SentenceTransformer",
            prompts=self.prompts,
            default_prompt_name=self.default_prompt_name,
            similarity="cosine",
            **adapter_note(self.backbone),
        )
