"""A projection after pooling, saved as sentence-transformers' ``Dense`` module (``2_Dense/``).

Distilling a 384-d student into a 768-d teacher's space (``mse_distill``) needs a learned linear map from the
student's pooled vector to the teacher's dimension. It belongs to the model (it is part of what the student
outputs after training), so :class:`~embforge.encoder.Encoder` holds it as ``encoder.dense`` and writes it in the
layout sentence-transformers reads::

    2_Dense/config.json         {"in_features": 384, "out_features": 768, "bias": true,
                                 "activation_function": "torch.nn.modules.linear.Identity"}
    2_Dense/model.safetensors   linear.weight (out, in), linear.bias (out,)

Only parameter-free activations sentence-transformers writes by their torch name are accepted (identity, tanh,
relu, gelu, sigmoid).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import Tensor, nn

ST_DENSE = "sentence_transformers.models.Dense"
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "torch.nn.modules.linear.Identity": nn.Identity,
    "torch.nn.modules.activation.Tanh": nn.Tanh,
    "torch.nn.modules.activation.ReLU": nn.ReLU,
    "torch.nn.modules.activation.GELU": nn.GELU,
    "torch.nn.modules.activation.Sigmoid": nn.Sigmoid,
}
_SHORT = {name.rsplit(".", 1)[-1].lower(): name for name in ACTIVATIONS}


class Dense(nn.Module):
    """``activation(x W^T + b)``: a linear map (and activation) on pooled embeddings.

    Args:
        in_features: Size of the pooled embedding.
        out_features: Size of the output embedding (the encoder's new ``dim``).
        bias: Learn a bias vector.
        activation: ``identity`` (default, what distillation projections use), ``tanh``, ``relu``, ``gelu``,
            ``sigmoid``, or the full torch class name sentence-transformers writes.
    """

    def __init__(
        self, in_features: int, out_features: int, *, bias: bool = True, activation: str = "identity"
    ) -> None:
        super().__init__()
        full = _SHORT.get(activation.lower(), activation)
        if full not in ACTIVATIONS:
            raise ValueError(
                f"Dense activation {activation!r} is not supported; choose one of {', '.join(sorted(_SHORT))}"
            )
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.bias = bool(bias)
        self.activation_name = full
        self.linear = nn.Linear(self.in_features, self.out_features, bias=self.bias)
        self.activation = ACTIVATIONS[full]()

    def forward(self, embeddings: Tensor) -> Tensor:
        return self.activation(self.linear(embeddings.to(self.linear.weight.dtype)))

    def config(self) -> dict[str, object]:
        return {
            "in_features": self.in_features,
            "out_features": self.out_features,
            "bias": self.bias,
            "activation_function": self.activation_name,
        }

    def save(self, folder: str | os.PathLike) -> None:
        """Write ``config.json`` and ``model.safetensors`` (keys ``linear.weight``/``linear.bias``) to ``folder``."""
        from safetensors.torch import save_file

        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.config(), indent=2) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})

    @classmethod
    def load(cls, folder: str | os.PathLike) -> Dense:
        """Read a sentence-transformers ``Dense`` folder (safetensors or ``pytorch_model.bin`` weights)."""
        path = Path(folder)
        config = json.loads((path / "config.json").read_text())
        if config.get("use_residual"):
            raise ValueError(f"{path}: Dense with use_residual=true is not supported by embforge")
        dense = cls(
            config["in_features"],
            config["out_features"],
            bias=config.get("bias", True),
            activation=config.get("activation_function", "torch.nn.modules.activation.Tanh"),
        )
        if (path / "model.safetensors").exists():
            from safetensors.torch import load_file

            state = load_file(str(path / "model.safetensors"))
        elif (path / "pytorch_model.bin").exists():
            state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        else:
            raise FileNotFoundError(f"{path}: no model.safetensors or pytorch_model.bin for the Dense module")
        dense.load_state_dict(state)
        return dense
