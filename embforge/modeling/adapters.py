"""Task adapters: named LoRA adapters on one frozen bi-encoder backbone, one per task, chosen per ``encode``.

The jina-embeddings-v3 design: one backbone, and a small LoRA adapter per task (``retrieval``, ``similarity``,
``classification`` ...) trained on that task's data while the backbone and the other adapters stay frozen. On disk
a task-adapter model is a sentence-transformers folder with the base weights, each adapter in
``adapters/<name>/`` (peft's layout of a named adapter: ``adapter_config.json``, ``adapter_model.safetensors``) and
the tasks listed under ``"tasks"`` in ``config_sentence_transformers.json``; peft reads each folder directly
(``PeftModel.from_pretrained(base, "adapters/retrieval")``), which is what the tests compare against.

* :func:`add_task_adapter` adds one (``embforge train --lora-r 8 --adapter-name retrieval``, on a base model or
  a folder that already holds other tasks); it becomes the active, trainable adapter.
* :func:`load_task_adapters` wraps a loaded backbone with every listed adapter, frozen, the adapters *off*: the
  model encodes as its base until a task is chosen.
* :func:`using_task` is what ``Encoder.encode(texts, task="retrieval")`` and the server's ``task`` field run in: that
  adapter for the block, then the model as it was. ``task=None`` is the model as it is: the base after loading,
  the adapter being trained while training.

Example:
    >>> model = Encoder.load("folder-with-adapters")  # doctest: +SKIP
    >>> model.tasks  # doctest: +SKIP
    ['similarity', 'retrieval']
    >>> model.encode(["a query"], task="retrieval")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn

from embforge._optional import require
from embforge.kinds import is_single_vector, kind_record
from embforge.modeling.lora import (
    ALL_LINEAR,
    TASKS_DIR,
    check_task_name,
    peft_config,
    seeded,
    task_names,
    uses_adapters,
)
from embforge.modeling.st_folder import ST_CONFIG_FILE, read_st_config

if TYPE_CHECKING:
    from peft import PeftModel


class HasBackbone(Protocol):
    """A bi-encoder whose Hugging Face module is ``backbone`` (:class:`~embforge.encoder.Encoder`)."""

    backbone: nn.Module


def tasks_of(root: str | Path) -> list[str]:
    """The task adapters a saved folder lists (``"tasks"`` of ``config_sentence_transformers.json``; else the
    subfolders of ``adapters/`` holding an ``adapter_config.json``), ``[]`` for none."""
    root = Path(root)
    listed = read_st_config(root).get("tasks") if (root / ST_CONFIG_FILE).is_file() else None
    if listed:
        return list(listed)
    found = sorted(p.parent.name for p in (root / TASKS_DIR).glob("*/adapter_config.json"))
    return found


def load_task_adapters(module: nn.Module, root: str | Path) -> PeftModel:
    """``module`` (the base loaded from ``root``) wrapped with every task adapter of ``root``, frozen, with the
    adapters switched off (encoding gives the base's vectors until a task is chosen)."""
    peft = require("peft")
    root = Path(root)
    names = tasks_of(root)
    folders = {name: root / TASKS_DIR / check_task_name(name) for name in names}
    missing = [str(f) for f in folders.values() if not (f / "adapter_config.json").is_file()]
    if missing:
        raise FileNotFoundError(
            f"{root / ST_CONFIG_FILE} lists task adapters that are not there: {', '.join(missing)}"
        )
    first, *others = names
    wrapped = peft.PeftModel.from_pretrained(module, str(folders[first]), adapter_name=first)
    for name in others:
        wrapped.load_adapter(str(folders[name]), adapter_name=name)
    _switch(wrapped, None)
    return wrapped


def add_task_adapter(
    model: HasBackbone,
    name: str,
    *,
    r: int,
    alpha: float | None = None,
    dropout: float = 0.0,
    targets: str | Sequence[str] | None = ALL_LINEAR,
    seed: int | None = None,
) -> HasBackbone:
    """Add the task adapter ``name`` to ``model`` (in place; returned) beside the ones it has, which stay frozen,
    and make it the active, trainable adapter; one it already has is made trainable again (a run resumed or
    continued). Settings as :func:`~embforge.modeling.lora.apply_lora`'s."""
    peft = require("peft")
    check_task_name(name)
    if not is_single_vector(model):
        raise ValueError(f"task adapters are for dense bi-encoders, not {kind_record(model).description}")
    if r < 1:
        raise ValueError(f"lora r must be >= 1, got {r}")
    module: Any = model.backbone  # a PeftModel once it has adapters
    if uses_adapters(module) and not task_names(module):
        raise ValueError(
            "this model has an unnamed LoRA adapter (adapter/); merge it (--merge-lora) before adding task "
            "adapters"
        )
    if name not in task_names(module):
        config = peft_config(module, None, r=r, alpha=alpha, dropout=dropout, targets=targets)
        with seeded(seed):
            if uses_adapters(module):
                module.add_adapter(name, config)
            else:
                module = peft.get_peft_model(module, config, adapter_name=name)
    _switch(module, name, trainable=True)  # every other adapter frozen
    model.backbone = module
    return model


def active_task(module: nn.Module) -> str | None:
    """The task adapter ``module`` encodes with now; ``None`` when its adapters are off (the base) or it has
    none."""
    if not task_names(module):
        return None
    from peft.tuners.tuners_utils import BaseTunerLayer

    layer = next(m for m in module.modules() if isinstance(m, BaseTunerLayer))
    return None if layer.disable_adapters else str(layer.active_adapters[0])


def check_task(model: HasBackbone, task: str | None) -> None:
    """A ``ValueError`` naming the tasks ``model`` has when ``task`` is not one of them (``None`` always is)."""
    if task is None:
        return
    names = task_names(model.backbone)
    if task not in names:
        have = f"this model's tasks are {', '.join(names)}" if names else "this model has no task adapters"
        raise ValueError(f"unknown task {task!r}: {have} (task=None encodes with the base)")


@contextmanager
def using_task(model: HasBackbone, task: str | None) -> Iterator[None]:
    """The block runs with the task adapter ``task`` (``None``: the model as it is), then the model is as it was:
    the same adapter (or none) active, every parameter's ``requires_grad`` unchanged."""
    check_task(model, task)
    module = model.backbone
    before = active_task(module)
    if task is None or task == before:
        yield
        return
    grads = [(p, p.requires_grad) for p in module.parameters()]
    _switch(module, task)
    try:
        yield
    finally:
        _switch(module, before)
        for parameter, grad in grads:
            parameter.requires_grad_(grad)


def _switch(module: Any, task: str | None, *, trainable: bool = False) -> None:
    """Make ``task`` the active adapter of a peft model, frozen unless ``trainable`` (``None``: every adapter off,
    the base)."""
    if task is None:
        module.base_model.disable_adapter_layers()
        return
    module.base_model.enable_adapter_layers()
    module.set_adapter(task, inference_mode=not trainable)
