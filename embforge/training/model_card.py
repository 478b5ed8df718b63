"""A ``README.md`` model card for every saved model, in the sentence-transformers style, written through
``huggingface_hub.ModelCard``: Hub metadata (library, pipeline, base model, Hub data sets, tags, and the final
evaluation as a ``model-index``) that ``ModelCard.load`` reads back, above the card's Markdown body.

It says what the model is (base model, kind, dimension, pooling), what it was trained on (files and row counts,
losses), how (every hyper-parameter), how well (the evaluations, over steps when ``metrics.jsonl`` is there), at
what cost (training time and hardware), and how to reproduce it (the command line and the embforge version).

Everything comes in as plain data, so the trainer, a pipeline or a script can write one::

    write_model_card(
        "runs/stsb",
        base_model="all-MiniLM-L6-v2",
        tasks_info=[{"name": "stsb", "source": "stsb-en-train.csv", "rows": 5749, "loss": "cosent"}],
        config=TrainConfig(),
        eval_results={"spearman": 86.05},
        seconds=105.0,
    )
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embforge._version import __version__
from embforge.data.sources import row_count
from embforge.fields import flat_values
from embforge.modeling.pooling import mode_from_st_config
from embforge.training.report import read_json, read_jsonl

if TYPE_CHECKING:
    from huggingface_hub import ModelCardData

    from embforge.training.tasks import Task

CARD = "README.md"
# aliases embforge resolves locally -> their Hugging Face Hub ids (for the card's metadata and links)
HUB_IDS = {"all-minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_FILE_SUFFIXES = (".csv", ".tsv", ".txt", ".json", ".jsonl", ".parquet")
# the YAML keys in the order of the card's metadata block (huggingface_hub's own order puts base_model first)
_KEY_ORDER = ["library_name", "pipeline_tag", "base_model", "datasets", "tags", "model-index"]


def task_info(task: Task) -> dict[str, Any]:
    """Plain data about a training task for :func:`write_model_card`."""
    data, loss = task.data, task.loss
    options = {
        key: value
        for key, value in vars(loss).items()
        if not key.startswith("_") and key != "training" and isinstance(value, (bool, int, float, str))
    }
    return {
        "name": task.name,
        "source": str(data.path),
        "rows": row_count(data),
        "columns": list(data.columns),
        "loss": loss.name,
        "loss_options": options,
        "weight": task.weight,
    }


def write_model_card(
    model_dir: str | os.PathLike,
    *,
    base_model: str | None,
    tasks_info: Sequence[Mapping[str, Any]],
    config: Any,
    eval_results: Mapping[str, float] | None = None,
    best: Mapping[str, object] | None = None,
    seconds: float | None = None,
    steps: int | None = None,
    device: str | None = None,
    command: str | None = None,
) -> Path:
    """Write ``model_dir/README.md`` and return its path.

    Args:
        model_dir: The saved model's folder (sentence-transformers or cross-encoder layout).
        base_model: What training started from (an alias, a Hub id or a folder); ``None`` if unknown.
        tasks_info: One dict per training task: ``name``, ``source``, ``rows``, ``loss`` and optionally
            ``columns``, ``loss_options``, ``weight`` (see :func:`task_info`).
        config: The :class:`~embforge.training.config.TrainConfig` (or a mapping of hyper-parameters).
        eval_results: The final evaluation's metrics.
        best: ``{"step", "value"}`` of the best evaluation, if kept.
        seconds: Training time.
        steps: Optimiser steps taken.
        device: The device trained on (``"cpu"``, ``"cuda:0"``); described with its hardware.
        command: The command that reproduces the run; default: this process's command line.
    """
    root = Path(model_dir)
    is_instance = dataclasses.is_dataclass(config) and not isinstance(config, type)
    settings = flat_values(config) if is_instance else dict(config)  # a config of parts: its flat fields
    facts = _model_facts(root)
    lines = [
        *_heading(root, facts, base_model),
        "## Model details",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in facts["table"].items()],
        "",
        "## Usage",
        "",
        *(["```python", *facts["usage"], "```"] if "usage" in facts else _usage(root, _is_cross(facts))),
        "",
        *_training(tasks_info, settings),
        "## Evaluation",
        "",
        *_evaluation(root, eval_results, best, settings.get("metric")),
        "## Training time and hardware",
        "",
        *_cost(seconds, steps, device),
        "",
        "## Reproduce",
        "",
        "```bash",
        command or _command_line(),
        "```",
        "",
        "## Framework versions",
        "",
        *[f"- {k}: {v}" for k, v in _versions().items()],
        "",
    ]
    from huggingface_hub import ModelCard  # the Hub client's import is not for every import of this module

    metadata = _card_data(root, facts, base_model, tasks_info, eval_results).to_yaml(
        original_order=_KEY_ORDER
    )
    path = root / CARD
    ModelCard(f"---\n{metadata}\n---\n\n" + "\n".join(lines)).save(path)
    return path


def _is_cross(facts: Mapping[str, object]) -> bool:
    return bool(facts["kind"] == "cross-encoder")


def _hub_id(name: str | None) -> str | None:
    """``name`` (an alias resolved to its Hub id) when it names something on the Hub, not a local folder."""
    hub_id = HUB_IDS.get(str(name).lower(), name) if name else None
    on_hub = bool(hub_id) and _HUB_ID.match(str(hub_id)) is not None
    on_hub = on_hub and not str(hub_id).lower().endswith(_FILE_SUFFIXES)
    return hub_id if on_hub and not Path(str(hub_id)).expanduser().exists() else None


def _card_data(
    root: Path,
    facts: Mapping[str, Any],
    base_model: str | None,
    tasks_info: Sequence[Mapping[str, Any]],
    final: Mapping[str, float] | None,
) -> ModelCardData:
    """The card's metadata: library, pipeline, base model, the Hub data sets trained on, tags, and the final
    evaluation's figures as ``model-index`` results."""
    from huggingface_hub import EvalResult, ModelCardData

    cross = _is_cross(facts)
    pipeline = "text-ranking" if cross else "sentence-similarity"
    tags = ["sentence-transformers", "cross-encoder" if cross else "sentence-similarity", "embforge"]
    tags += [f"loss:{t['loss']}" for t in tasks_info]
    datasets = [str(t["source"]) for t in tasks_info if _hub_id(t.get("source"))]
    results = [
        EvalResult(
            task_type=pipeline,
            dataset_type="evaluation",
            dataset_name="evaluation during training",
            metric_type=name,
            metric_name=name,
            metric_value=float(value),
        )
        for name, value in (final or {}).items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ]
    return ModelCardData(
        library_name="sentence-transformers",
        pipeline_tag=pipeline,
        base_model=_hub_id(base_model),
        datasets=list(dict.fromkeys(datasets)) or None,
        tags=list(dict.fromkeys(tags)),
        model_name=root.resolve().name if results else None,
        eval_results=results or None,
    )


def _heading(root: Path, facts: Mapping[str, Any], base_model: str | None) -> list[str]:
    """The card's title and what the model does."""
    hub_id = _hub_id(base_model)
    cross = _is_cross(facts)
    started = f" from [{hub_id}](https://huggingface.co/{hub_id})" if hub_id else ""
    started = started or (f" from `{base_model}`" if base_model else "")
    does = (
        "It scores a pair of texts (reranking, pair classification)."
        if cross
        else f"It maps texts to {facts.get('dim', '?')}-dimensional vectors for semantic similarity, "
        "search, clustering and classification."
    )
    return [
        f"# {root.resolve().name}",
        "",
        f"A {facts['kind']} fine-tuned{started} with embforge {__version__}. " + does,
        "",
    ]


def _training(tasks_info: Sequence[Mapping[str, Any]], settings: Mapping[str, Any]) -> list[str]:
    """The training data (one row per task) and hyper-parameter sections."""
    return [
        "## Training data",
        "",
        "| task | file | rows | columns | loss | loss options | weight |",
        "|---|---|---:|---|---|---|---:|",
        *[_task_row(t) for t in tasks_info],
        "",
        f"{_rows(_total_rows(tasks_info))} training rows in all.",
        "",
        "## Training hyper-parameters",
        "",
        "| setting | value |",
        "|---|---|",
        *[f"| `{k}` | `{v}` |" for k, v in settings.items()],
        "",
    ]


def _kind_facts(root: Path) -> dict[str, Any] | None:
    """The facts and usage of a kind whose record names its own card section (sparse, static, multi-vector:
    :attr:`embforge.kinds.KindRecord.card`), else ``None``."""
    from embforge.kinds import folder_record, load_named

    record = folder_record(root)
    return None if record.card is None else load_named(record.card)(root)


def _model_facts(root: Path) -> dict[str, Any]:
    kind_facts = _kind_facts(root)
    if kind_facts is not None:
        return kind_facts
    st = read_json(root / "config_sentence_transformers.json")
    cross = st.get("model_type") == "CrossEncoder"
    table: dict[str, Any] = {
        "Model type": "cross-encoder (reranker)" if cross else "bi-encoder (Sentence Transformer)"
    }
    facts: dict[str, Any] = {"kind": "cross-encoder" if cross else "bi-encoder", "table": table}
    hf = read_json(root / "config.json")
    if hf.get("model_type"):
        table["Architecture"] = f"{hf['model_type']}, {hf.get('num_hidden_layers', '?')} layers"
    max_length = read_json(root / "sentence_bert_config.json").get("max_seq_length") or st.get(
        "max_seq_length"
    )
    if max_length:
        table["Maximum sequence length"] = f"{max_length} tokens"
    if not cross:
        pooling = read_json(root / "1_Pooling" / "config.json")
        mode = mode_from_st_config(pooling) if pooling else None
        dense = read_json(root / "2_Dense" / "config.json")
        dim = dense.get("out_features") or pooling.get("word_embedding_dimension") or hf.get("hidden_size")
        facts["dim"] = dim
        table["Output dimensionality"] = dim
        table["Pooling"] = mode or "?"
        table["Normalized"] = "yes" if (root / "2_Normalize").is_dir() else "no"
        table["Similarity"] = st.get("similarity_fn_name", "cosine")
    else:
        table["Activation"] = str(st.get("activation_fn", "?")).rsplit(".", 1)[-1]
    return facts


def _usage(root: Path, cross: bool) -> list[str]:
    name = root.resolve().name
    if cross:
        return [
            "```python",
            "from embforge import CrossEncoder",
            f'model = CrossEncoder.load("{name}")',
            'scores = model.predict([("how old is the sun", "The sun is 4.6 billion years old.")])',
            "# or: sentence_transformers.CrossEncoder(...) with the same scores",
            "```",
        ]
    return [
        "```python",
        "from embforge import Encoder",
        f'model = Encoder.load("{name}")',
        'embeddings = model.encode(["The weather is lovely today.", "It is sunny outside."])',
        "# or: sentence_transformers.SentenceTransformer(...).encode(...) with the same vectors",
        "```",
    ]


def _total_rows(tasks_info: Sequence[Mapping[str, Any]]) -> int | None:
    rows = [t.get("rows", 0) for t in tasks_info]
    return None if None in rows else sum(int(r) for r in rows)


def _rows(rows: int | None) -> str:
    return "streamed" if rows is None else f"{int(rows):,}"  # a stream's length is known once read through


def _task_row(task: Mapping[str, Any]) -> str:
    options = ", ".join(f"{k}={v}" for k, v in (task.get("loss_options") or {}).items()) or "–"
    columns = ", ".join(task.get("columns") or []) or "–"
    cells = [task.get("name", "?"), f"`{task.get('source', '')}`", _rows(task.get("rows", 0)), columns]
    cells += [f"`{task.get('loss', '?')}`", options, f"{float(task.get('weight', 1.0)):g}"]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _evaluation(
    root: Path, final: Mapping[str, float] | None, best: Mapping[str, object] | None, metric: object
) -> list[str]:
    history = [r for r in read_jsonl(root / "metrics.jsonl") if isinstance(r.get("eval"), dict)]
    if not final and not history:
        return ["No evaluation ran during training (pass `--eval FILE`).", ""]
    lines: list[str] = []
    if final:
        lines += ["Final evaluation:", "", "| metric | value |", "|---|---:|"]
        lines += [f"| {k} | {_number(v)} |" for k, v in final.items()]
        lines.append("")
    if best:
        lines += [f"Best {metric or 'metric'}: {_number(best.get('value'))} at step {best.get('step')}.", ""]
    if len(history) > 1:
        keys = list(dict.fromkeys(k for r in history for k in r["eval"]))[:6]
        lines += ["| step | " + " | ".join(keys) + " |", "|---:|" + "---:|" * len(keys)]
        lines += [
            f"| {r['step']} | " + " | ".join(_number(r["eval"].get(k)) for k in keys) + " |" for r in history
        ]
        lines.append("")
    return lines


def _cost(seconds: float | None, steps: int | None, device: str | None) -> list[str]:
    lines = []
    if seconds is not None:
        minutes, rest = divmod(round(seconds), 60)
        lines.append(
            f"- Training time: {minutes} min {rest} s" if minutes else f"- Training time: {seconds:.1f} s"
        )
    if steps is not None:
        lines.append(f"- Optimiser steps: {steps:,}")
    lines.append(f"- Hardware: {_hardware(device)}")
    return lines


def _hardware(device: str | None) -> str:
    cpu = _cpu_name()
    text = f"{cpu}, {os.cpu_count()} logical CPU cores available"
    if device and device.startswith("cuda"):
        try:
            import torch

            index = int(device.split(":")[1]) if ":" in device else 0
            return f"{torch.cuda.get_device_name(index)} (GPU); host CPU {text}"
        except (ImportError, RuntimeError, AssertionError, ValueError):
            return f"{device}; host CPU {text}"
    return text


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _command_line() -> str:
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program == "embforge":
        return shlex.join(["embforge", *sys.argv[1:]])
    return shlex.join(["python", *sys.argv])


def _versions() -> dict[str, str]:
    versions = {"embforge": __version__, "Python": platform.python_version()}
    for package in ("torch", "transformers", "tokenizers"):
        try:
            module = __import__(package)
            versions[package] = str(module.__version__)
        except ImportError:
            continue
    return versions


def _number(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)
