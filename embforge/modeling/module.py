"""The PyTorch side that the model kinds share: a Hugging Face backbone, its device, checkpointing, and the two
input forms of a text model's forward."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from embforge.modeling.dropout import forward_keys
from embforge.modeling.padding import set_backbone_checkpointing

if TYPE_CHECKING:
    from transformers import PretrainedConfig
    from typing_extensions import Self

    from embforge.protocols import DeviceLike, ModelPath


class SavedModule(nn.Module):
    """Base of every model kind: a module on one device, loaded from a folder (or an alias or Hub id) by its
    class's ``load(path, **options)`` (:class:`~embforge.protocols.LoadOptions` and the kind's own) and saved as
    one folder by ``save``."""

    name_or_path: str | None = None  # set by load(): the path, alias or Hub id as given

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def loaded_from(self, path: ModelPath, *, device: DeviceLike) -> Self:
        """This model as ``load(path, device=device)`` returns it: named after ``path`` as given, moved to
        ``device`` when one is given."""
        self.name_or_path = str(path)
        if device is not None:
            self.to(device)
        return self

    @contextmanager
    def inference(self) -> Iterator[None]:
        """Eval mode (the previous mode restored afterwards) and no autograd: what ``encode``/``predict`` run
        their forward passes in."""
        was_training = self.training
        self.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            self.train(was_training)


class TransformerModule(SavedModule):
    """Base of :class:`~embforge.encoder.Encoder` and :class:`~embforge.cross_encoder.CrossEncoder`: a module
    around one Hugging Face ``backbone``, on one device, whose layers may be recomputed in the backward pass."""

    backbone: nn.Module  # the Hugging Face model (``.config`` and its modules)
    # where LoRA adapters go (embforge.modeling.lora): the attribute holding the HF model, and peft's task type
    peft_slot: tuple[str, str | None] = ("backbone", None)
    checkpointing: bool = False  # read by the padding-free forward: checkpoint each layer

    @property
    def backbone_config(self) -> PretrainedConfig:
        """The Hugging Face config of the backbone (``hidden_size``, ``vocab_size``, ``model_type`` ...)."""
        return cast("PretrainedConfig", self.backbone.config)

    def gradient_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each layer in the backward pass instead of keeping its activations (less memory, ~1/3 more
        compute): the padding-free forward checkpoints its layers, the Hugging Face forward uses the backbone's
        own ``gradient_checkpointing_enable``."""
        self.checkpointing = enabled
        set_backbone_checkpointing(self.backbone, enabled)


class TextModule(TransformerModule):
    """Base of the models that embed single texts (dense, sparse, multi-vector): one :meth:`forward` over token-id
    lists or a padded id tensor; each kind supplies :meth:`forward_ids` and :meth:`padded_forward`."""

    def forward(
        self,
        ids: Sequence[Sequence[int]] | Tensor,
        attention_mask: Tensor | None = None,
        *,
        max_tokens: int | None = None,
        dropout_seed: int | None = None,
        places: Sequence[int] | None = None,
    ) -> Tensor:
        """The model's output for each text, in the input order. Two input forms:

        - ``ids``: token-id lists (the training forward, :meth:`forward_ids`; ``max_tokens`` bounds each
          attention block or length chunk, ``None``: the model's default). Each text's output is what one padded
          forward would give. In training mode dropout is keyed by ``dropout_seed`` and each text's place in the
          whole batch (``places``, default ``0..n-1``; :mod:`embforge.modeling.dropout`), so the result does not
          depend on how the batch is cut; ``dropout_seed=None`` draws one from torch's generator.
        - a padded ``(batch, seq)`` id tensor and its ``attention_mask`` (inference and ONNX export,
          :meth:`padded_forward`).
        """
        if isinstance(ids, Tensor):
            assert attention_mask is not None, "a padded id tensor needs its attention_mask"
            return self.padded_forward(ids, attention_mask)
        seed, where = forward_keys(self.training, len(ids), dropout_seed, places)
        return self.forward_ids(ids, max_tokens=max_tokens, seed=seed, places=where)

    def forward_ids(
        self, ids: Sequence[Sequence[int]], *, max_tokens: int | None, seed: int | None, places: list[int]
    ) -> Tensor:
        """The training forward of token-id lists: dropout keyed by ``seed`` (``None``: no dropout) and
        ``places``, each text's place in the whole batch."""
        raise NotImplementedError

    def padded_forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """One forward over a padded ``(batch, seq)`` id tensor and its attention mask."""
        raise NotImplementedError
