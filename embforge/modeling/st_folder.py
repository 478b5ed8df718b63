"""The sentence-transformers folder format, read and written in one place.

A model folder as sentence-transformers saves it (and embforge too, so each loads the other's)::

    modules.json                        the module pipeline: [{"idx", "name", "path", "type"}, ...] in order
    config_sentence_transformers.json   {"model_type", "prompts", "default_prompt_name", "similarity_fn_name",
                                         "__version__", ...}; a cross-encoder's says "model_type": "CrossEncoder"
    sentence_bert_config.json           the Transformer module's {"max_seq_length", "do_lower_case"}
    1_Pooling/config.json               the pooling mode (:mod:`embforge.modeling.pooling`)
    2_Dense/, N_Normalize/              an optional projection, then L2 normalisation

A folder without ``modules.json`` is a plain Hugging Face model. Module paths in ``modules.json`` are confined to
the folder: a downloaded model cannot make embforge read files elsewhere on the machine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from embforge._version import __version__
from embforge.modeling.dense import Dense
from embforge.modeling.pooling import mode_from_st_config
from embforge.modeling.resolve import resolve_model_path

if TYPE_CHECKING:
    from embforge.protocols import ModelPath

MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "config_sentence_transformers.json"
TRANSFORMER_CONFIG_FILES = ("sentence_bert_config.json", "config_sentence_transformers_transformer.json")
POOLING_DIR = "1_Pooling"
ST_TRANSFORMER = "sentence_transformers.models.Transformer"
ST_POOLING = "sentence_transformers.models.Pooling"
ST_NORMALIZE = "sentence_transformers.models.Normalize"


def embforge_version() -> str:
    """The version stamped into ``config_sentence_transformers.json`` (``"__version__": {"embforge": ...}``)."""
    return __version__


def write_json(path: Path, obj: object) -> None:
    """One of the folder's JSON files, indented as sentence-transformers writes them (its folder made if new)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of the folder; ``{}`` when it does not exist."""
    return json.loads(path.read_text()) if path.exists() else {}


def has_modules(root: Path) -> bool:
    """Whether ``root`` is a sentence-transformers folder (it has ``modules.json``)."""
    return (root / MODULES_FILE).exists()


def read_st_config(root: Path) -> dict[str, Any]:
    """``config_sentence_transformers.json`` (``{}`` when the folder has none)."""
    return read_json(root / ST_CONFIG_FILE)


def write_st_config(root: Path, config: Mapping[str, object]) -> None:
    """``config_sentence_transformers.json``: ``config`` plus embforge's version stamp."""
    write_json(root / ST_CONFIG_FILE, {**config, "__version__": {"embforge": embforge_version()}})


def inside(root: Path, relative: str, source: Path) -> Path:
    """``root / relative``, refused when it resolves outside ``root`` (``source``: the file that named it)."""
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise ValueError(f"{source}: module path {relative!r} points outside the model folder {root}")
    return path


def module_kind(module_type: str) -> str:
    """``"sentence_transformers.models.Pooling"`` -> ``"Pooling"``."""
    return module_type.rsplit(".", 1)[-1]


class Module(NamedTuple):
    """One entry of ``modules.json``."""

    type: str  # as written, e.g. "sentence_transformers.models.Pooling"
    path: str  # the folder as written, relative to the model folder
    folder: Path  # that folder, resolved (never outside the model folder)

    @property
    def kind(self) -> str:
        """The module type's last name: ``"Pooling"``."""
        return module_kind(self.type)


def read_modules(root: Path) -> list[Module]:
    """The entries of ``modules.json``, in order; a path that leaves the folder is refused."""
    modules_file = root / MODULES_FILE
    out = []
    for module in json.loads(modules_file.read_text()):
        relative = module.get("path", "")
        out.append(Module(module["type"], relative, inside(root, relative, modules_file)))
    return out


def write_modules(root: Path, modules: Sequence[tuple[str, str]]) -> None:
    """``modules.json`` of the module pipeline ``[(path, type), ...]``, numbered in order."""
    numbered = [
        {"idx": i, "name": str(i), "path": path, "type": kind} for i, (path, kind) in enumerate(modules)
    ]
    write_json(root / MODULES_FILE, numbered)


def read_max_seq_length(folder: Path) -> int | None:
    """The token limit in a Transformer module's ``sentence_bert_config.json`` (or its older name), if any."""
    found = next((folder / name for name in TRANSFORMER_CONFIG_FILES if (folder / name).exists()), None)
    return None if found is None else read_json(found).get("max_seq_length")


def write_transformer_config(folder: Path, max_seq_length: int) -> None:
    """The Transformer module's ``sentence_bert_config.json`` (its token limit)."""
    write_json(
        folder / TRANSFORMER_CONFIG_FILES[0], {"max_seq_length": max_seq_length, "do_lower_case": False}
    )


def write_model_config(
    root: Path,
    model_type: str,
    *,
    prompts: Mapping[str, str],
    default_prompt_name: str | None,
    similarity: str,
    **extra: object,
) -> None:
    """``config_sentence_transformers.json`` of a text model: its type (``SentenceTransformer``,
    ``SparseEncoder``, ``ColBERT``), prompts, similarity function and ``extra`` settings."""
    config = {
        "model_type": model_type,
        "prompts": dict(prompts),
        "default_prompt_name": default_prompt_name,
        "similarity_fn_name": similarity,
    }
    write_st_config(root, {**config, **extra})


def read_st_settings(root: Path) -> dict:
    """Pooling, normalisation, projection, max length and prompts of a bi-encoder folder, as
    :class:`~embforge.encoder.Encoder` takes them (plus ``transformer_path``: where the backbone is).

    A folder without ``modules.json`` is a plain HF encoder: mean pooling, no normalisation.
    """
    settings: dict = {"transformer_path": "", "pooling": "mean", "normalize": False, "max_seq_length": None}
    if not has_modules(root):
        return settings
    for module_type, relative, sub in read_modules(root):
        kind = module_kind(module_type)
        if kind == "Transformer":
            settings["transformer_path"] = relative
            settings["max_seq_length"] = read_max_seq_length(sub)
        elif kind == "Pooling":
            settings["pooling"] = mode_from_st_config(read_json(sub / "config.json"))
        elif kind == "Normalize":
            settings["normalize"] = True
        elif kind == "Dense" and "dense" not in settings and not settings["normalize"]:
            settings["dense"] = Dense.load(sub)
        else:
            raise ValueError(
                f"{root / MODULES_FILE}: module type {module_type!r} is not supported by embforge "
                "(supported: Transformer, Pooling, one Dense before Normalize, Normalize)"
            )
    if (root / ST_CONFIG_FILE).exists():
        config = read_st_config(root)
        settings["prompts"] = config.get("prompts") or {}
        settings["default_prompt_name"] = config.get("default_prompt_name")
    return settings


def is_cross_encoder_folder(path: ModelPath) -> bool:
    """Whether ``path`` (a folder or alias) holds a cross-encoder rather than a bi-encoder: its
    ``config_sentence_transformers.json`` says so, or it is a plain HF folder of a ``...ForSequenceClassification``."""
    try:
        root = resolve_model_path(path)
    except FileNotFoundError:
        return False
    if read_st_config(root).get("model_type") == "CrossEncoder":
        return True
    if has_modules(root) or not (root / "config.json").exists():
        return False
    architectures = read_json(root / "config.json").get("architectures") or []
    return any(a.endswith("ForSequenceClassification") for a in architectures)
