"""The PyTorch side that bi-encoders and cross-encoders share: a Hugging Face backbone, its device, checkpointing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from embforge.modeling.padding import set_backbone_checkpointing

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class TransformerModule(nn.Module):
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

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def gradient_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each layer in the backward pass instead of keeping its activations (less memory, ~1/3 more
        compute): the padding-free forward checkpoints its layers, the Hugging Face forward uses the backbone's
        own ``gradient_checkpointing_enable``."""
        self.checkpointing = enabled
        set_backbone_checkpointing(self.backbone, enabled)


@contextmanager
def inference_context(model: nn.Module) -> Iterator[None]:
    """Eval mode (the model's previous mode restored afterwards) and no autograd: every model's ``inference()``."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)
