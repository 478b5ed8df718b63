"""LoRA adapters (peft) for bi-encoders and cross-encoders: wrap, count, save, load, merge.

:func:`apply_lora` wraps the Hugging Face module of an :class:`~embforge.encoder.Encoder` (``backbone``) or a
:class:`~embforge.cross_encoder.CrossEncoder` (``model``, whose freshly initialised classification head stays fully
trainable) with peft's ``get_peft_model``: the base weights are frozen and only the low-rank matrices train. The
trainer needs no special case: the optimiser sees the parameters that require gradients.

On disk a LoRA model is its sentence-transformers / cross-encoder folder with the (frozen) base weights, plus the
adapter in ``adapter/`` (peft's ``save_pretrained``: ``adapter_config.json``, ``adapter_model.safetensors``) and a
note in ``config_sentence_transformers.json``. ``Encoder.load`` / ``CrossEncoder.load`` load base + adapter, so
checkpoints and ``--resume`` round-trip. sentence-transformers ignores ``adapter/``: :func:`merge_lora` folds the
adapter into the weights for a self-contained folder any library reads.

Task adapters (the jina-embeddings-v3 design): several *named* LoRA adapters on one frozen bi-encoder backbone,
one per task (``retrieval``, ``similarity`` ...), saved in ``adapters/<name>/`` (peft's layout, one
``save_pretrained`` folder per adapter) and listed under ``"tasks"`` in ``config_sentence_transformers.json``.
:func:`embforge.modeling.adapters.add_task_adapter` adds one (to a folder that already holds others: train one
task at a time); :mod:`embforge.modeling.adapters` loads them and chooses one per ``encode(task=...)``.

Padding-free forwards: BERT packing (:mod:`embforge.modeling.packing`) reads the projection weights directly and
would skip the adapters, so adapted BERT models take the padded path (:func:`uses_adapters`); the decoder packing
(:mod:`embforge.modeling.decoder_packing`) calls the wrapped modules and keeps working.

Example:
    >>> from embforge.encoder import Encoder
    >>> model = apply_lora(Encoder.load("all-MiniLM-L6-v2"), r=16)  # doctest: +SKIP
    >>> trainable_parameters(model)  # doctest: +SKIP
    (... trainable, ... total)
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor, nn

from embforge._optional import require
from embforge.modeling.module import TransformerModule
from embforge.modeling.resolve import hf_quiet
from embforge.ranges import POSITIVE, check

if TYPE_CHECKING:
    from peft import PeftModel

ADAPTER_DIR = "adapter"
TASKS_DIR = "adapters"  # task adapters: adapters/<name>/ (peft's layout of a named adapter)
DEFAULT_ADAPTER = "default"  # peft's name of the one unnamed adapter (adapter/)
TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
ALL_LINEAR = "all-linear"
M = TypeVar("M")  # an Encoder or a CrossEncoder (a TransformerModule: it declares peft_slot)


@dataclass
class LoraConfig:
    """LoRA settings of a training run (``r=0``: full fine-tuning).

    Attributes:
        r: Rank of the update matrices; 0 turns LoRA off.
        alpha: Scaling numerator (the update is ``alpha / r · B A``); ``None``: ``2 * r``.
        dropout: Dropout on the adapter's input during training.
        targets: Module names to adapt (suffixes such as ``query,value`` or ``q_proj,v_proj``), or
            ``"all-linear"`` (default): every linear layer except output heads.
        merge: Fold the adapter into the weights when saving the final model.
        adapter_name: Train a named task adapter (``retrieval`` ...), added beside those the model already has
            and saved in ``adapters/<name>/``; ``None``: one unnamed adapter in ``adapter/``.
    """

    r: int = 0
    alpha: float | None = None
    dropout: float = 0.0
    targets: str | list[str] = ALL_LINEAR
    merge: bool = False
    adapter_name: str | None = None

    def __post_init__(self) -> None:
        if self.adapter_name is not None:
            check_task_name(self.adapter_name)
            if self.merge:
                raise ValueError(
                    f"adapter name {self.adapter_name!r} with merge: a task adapter stays beside the others "
                    "(chosen per encode); drop --merge-lora"
                )
        if self.r < 0:
            raise ValueError(f"lora r must be >= 0, got {self.r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora dropout must be in [0, 1), got {self.dropout}")
        check("lora alpha", self.alpha, POSITIVE, optional=True)

    @property
    def enabled(self) -> bool:
        return self.r > 0

    @classmethod
    def from_fields(cls, config: object) -> LoraConfig:
        """Read ``lora_r``, ``lora_alpha``, ``lora_dropout``, ``lora_targets``, ``merge_lora`` and
        ``adapter_name`` off a ``TrainConfig``'s LoRA part (or any object); missing fields keep their defaults."""
        return cls(
            r=int(getattr(config, "lora_r", 0) or 0),
            alpha=getattr(config, "lora_alpha", None),
            dropout=float(getattr(config, "lora_dropout", 0.0) or 0.0),
            targets=getattr(config, "lora_targets", None) or ALL_LINEAR,
            merge=bool(getattr(config, "merge_lora", False)),
            adapter_name=getattr(config, "adapter_name", None),
        )


def check_task_name(name: str) -> str:
    """``name`` if it can name a task adapter (a folder name, not peft's ``default``), else a ``ValueError``."""
    if not TASK_NAME.fullmatch(name) or name == DEFAULT_ADAPTER:
        raise ValueError(
            f"adapter name {name!r}: use letters, digits, '_', '-' or '.' (e.g. retrieval), and not "
            f"{DEFAULT_ADAPTER!r} (peft's name of the unnamed adapter)"
        )
    return name


def task_names(module: object) -> list[str]:
    """The named task adapters of a peft-wrapped module, in the order they were added (``[]`` without)."""
    if not uses_adapters(module):
        return []
    config = getattr(module, "peft_config", {})  # a PeftModel's adapters by name (in-place injection: none)
    return [name for name in config if name != DEFAULT_ADAPTER]


def uses_adapters(module: object) -> bool:
    """Whether ``module`` holds peft adapter layers (LoRA ...), wrapped by ``get_peft_model`` or injected in place.

    peft is only imported when something already imported it: no adapters can exist otherwise.
    """
    if "peft" not in sys.modules or not isinstance(module, nn.Module):
        return False
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in module.modules())


def _slot(model: object) -> tuple[str, str | None]:
    """``(attribute holding the HF module, peft task type)``: the model's declared ``peft_slot``."""
    if isinstance(model, TransformerModule):
        return model.peft_slot
    raise TypeError(f"apply_lora needs an Encoder or a CrossEncoder, got {type(model).__name__}")


def _targets(targets: str | Sequence[str] | None) -> str | list[str]:
    if targets is None or targets == ALL_LINEAR:
        return ALL_LINEAR
    names = targets.split(",") if isinstance(targets, str) else list(targets)
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise ValueError(
            "lora targets: give module names such as 'query,value' or 'q_proj,v_proj', or all-linear"
        )
    return names


def apply_lora(
    model: M,
    *,
    r: int,
    alpha: float | None = None,
    dropout: float = 0.0,
    targets: str | Sequence[str] | None = ALL_LINEAR,
    seed: int | None = None,
) -> M:
    """Wrap ``model``'s Hugging Face module with LoRA adapters (in place) and return ``model``.

    Args:
        model: An :class:`~embforge.encoder.Encoder` or :class:`~embforge.cross_encoder.CrossEncoder`.
        r: Rank of the update (> 0).
        alpha: Scaling numerator; ``None`` gives ``2 * r``.
        dropout: Dropout on the adapters' input during training.
        targets: ``"all-linear"`` (every linear layer but output heads; a BERT bi-encoder's unused pooler is
            left out), or module-name suffixes, as a list or a comma-separated string.
        seed: Draw the adapters' random initial ``A`` matrices from this seed (torch's global generator is left
            as it was); ``None`` draws them from the global generator.
    """
    peft = require("peft")
    if r < 1:
        raise ValueError(f"lora r must be >= 1, got {r}")
    attr, task_type = _slot(model)
    module = getattr(model, attr)
    if uses_adapters(module):
        raise ValueError("this model already has adapters; merge them (merge_lora) before adding new ones")
    config = peft_config(module, task_type, r=r, alpha=alpha, dropout=dropout, targets=targets)
    with seeded(seed):
        setattr(model, attr, peft.get_peft_model(module, config))
    return model


def peft_config(
    module: nn.Module,
    task_type: str | None,
    *,
    r: int,
    alpha: float | None,
    dropout: float,
    targets: str | Sequence[str] | None,
) -> Any:
    """peft's ``LoraConfig`` of :func:`apply_lora`'s settings for ``module`` (a Hugging Face module, or one peft
    wrapped already: its base model's names, the adapters' own layers left out)."""
    peft = require("peft")
    target_modules = _targets(targets)
    base = module.get_base_model() if uses_adapters(module) else module  # type: ignore[operator]
    names = [
        name.removesuffix(".base_layer")
        for name, m in base.named_modules()
        if isinstance(m, nn.Linear) and ".lora_" not in name
    ]
    if task_type is None and target_modules == ALL_LINEAR and any(n.endswith("pooler.dense") for n in names):
        # a bi-encoder never reads BERT's pooler: every linear layer but that one, by full name
        target_modules = [n for n in names if not n.endswith("pooler.dense")]
    return peft.LoraConfig(
        r=r,
        lora_alpha=alpha if alpha is not None else 2 * r,
        lora_dropout=dropout,
        target_modules=target_modules,
        task_type=task_type,
    )


@contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Draws from torch's global generator seeded with ``seed`` and restored afterwards (``None``: as it is)."""
    if seed is None:
        yield
        return
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts of ``model``."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def has_adapter(folder: str | Path) -> bool:
    """Whether ``folder`` (a saved model) carries a peft adapter in ``adapter/``."""
    return (Path(folder) / ADAPTER_DIR / "adapter_config.json").is_file()


def base_state_dict(wrapped: PeftModel) -> dict[str, Tensor]:
    """The frozen base weights of a peft-wrapped model under the Hugging Face names (no adapter tensors)."""
    out = {}
    for key, value in wrapped.get_base_model().state_dict().items():
        if ".lora_" in key or ".modules_to_save." in key or "lora_embedding" in key:
            continue
        out[key.replace(".base_layer.", ".").replace(".original_module.", ".")] = value
    return out


def save_backbone(module: nn.Module, path: str | os.PathLike) -> Path:
    """``save_pretrained`` of a Hugging Face module into the folder ``path`` (created; returned as a ``Path``),
    without the "Writing model shards" bar; an adapted module writes its base weights there and its adapter to
    ``path/adapter`` (a stale ``adapter/`` from an earlier save is removed)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    with hf_quiet():
        _save_pretrained(module, root)
    _honour_umask(root)
    return root


def _honour_umask(root: Path) -> None:
    """Give the weight files the mode any new file gets (0644 under the usual umask 022): safetensors writes
    them through a private temporary file (mode 0600), which other users and containers then cannot read."""
    umask = _umask()
    for weights in root.rglob("*.safetensors"):
        if weights.stat().st_mode & 0o777 == 0o600:
            weights.chmod(0o666 & ~umask)


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (os.umask sets it to read it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _save_pretrained(module: Any, root: Path) -> None:
    tasks = task_names(module)
    for stale in (ADAPTER_DIR, TASKS_DIR):
        shutil.rmtree(root / stale, ignore_errors=True)
    if not uses_adapters(module):
        module.save_pretrained(root, safe_serialization=True)
        return
    base = module.get_base_model()
    base.save_pretrained(root, state_dict=base_state_dict(module), safe_serialization=True)
    if tasks:  # peft writes a named adapter to <folder>/<name>/
        module.save_pretrained(root / TASKS_DIR, selected_adapters=tasks)
    else:
        module.save_pretrained(root / ADAPTER_DIR)


def adapter_note(module: Any) -> dict[str, object]:
    """What ``config_sentence_transformers.json`` records about an adapted module's adapter under ``"lora"``
    (for people; loaders look for ``adapter/``); ``{}`` without adapters."""
    if not uses_adapters(module):
        return {}
    tasks = task_names(module)
    if tasks:
        return {"tasks": {name: f"{TASKS_DIR}/{name}" for name in tasks}}
    config = module.peft_config["default"]
    targets = config.target_modules
    note = {
        "adapter": ADAPTER_DIR,
        "peft_type": str(getattr(config.peft_type, "value", config.peft_type)),
        "r": int(config.r),
        "alpha": float(config.lora_alpha),
        "targets": targets if isinstance(targets, str) else sorted(targets),
        "note": "LoRA adapter over the base weights of this folder; embforge loads both. sentence-transformers "
        "ignores adapter/: save with merge_lora (--merge-lora) for a self-contained model.",
    }
    return {"lora": note}


def load_adapter(module: nn.Module, folder: str | Path, *, trainable: bool = True) -> PeftModel:
    """Wrap ``module`` (the base model loaded from ``folder``) with the adapter saved in ``folder/adapter``.

    ``trainable=True`` leaves the adapter weights trainable, so a checkpoint resumes as the run that wrote it.
    """
    peft = require("peft")
    return peft.PeftModel.from_pretrained(module, str(Path(folder) / ADAPTER_DIR), is_trainable=trainable)


def merge_lora(model: M) -> M:
    """Fold ``model``'s adapters into its weights (in place) and drop them; returns ``model``.

    Afterwards ``save`` writes a plain sentence-transformers (or cross-encoder) folder that any library loads.
    """
    attr, _ = _slot(model)
    module = getattr(model, attr)
    if not uses_adapters(module):
        raise ValueError("merge_lora: this model has no adapters")
    if task_names(module):
        raise ValueError(
            f"merge_lora: this model has task adapters ({', '.join(task_names(module))}), chosen per encode; "
            "merging would fold them all into the weights"
        )
    setattr(model, attr, module.merge_and_unload())
    return model
