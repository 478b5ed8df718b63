"""One run's description: :class:`RunSpec` (model, training files, loss, data reading, retrieval training) and its
:class:`~embforge.training.config.TrainConfig`, each field declaring its range and flag (:mod:`embforge.fields`),
from which the CLI generates ``embforge train``'s flags. :mod:`embforge.training.run` runs a spec.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embforge.fields import about, setting
from embforge.modeling.resolve import DEFAULT_MODEL
from embforge.ranges import NON_NEGATIVE_INT, POSITIVE_INT, RATIO
from embforge.training.config import FLAT_FIELDS, TrainConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# why a field of one run cannot be given with a pipeline file (About.pipeline): the file says it per task
_TASK = "each [[stages.tasks]] of the file names its own data, loss, options and columns"
_EVAL = "each [[stages]] of the file names what it is evaluated on: eval = ..."
_MINE = "a retrieval task of the file names its folder and split, and mines with mine = {...}"


@dataclass
class RunSpec:
    """A single-stage run: model + training files + loss + :class:`TrainConfig`."""

    model: str = setting(
        DEFAULT_MODEL, "model folder or alias (default all-MiniLM-L6-v2)", group="model", metavar="MODEL"
    )
    train: list[str] = field(
        default_factory=list,
        metadata=about(
            "training file (repeat for several tasks)",
            value="data",
            repeat=True,
            metavar="FILE",
            pipeline=_TASK,
        ),
    )
    eval: str | None = setting(
        None,
        "STS file (sentence1, sentence2, score; with 0/1 labels a cross-encoder gets pair classification) "
        "evaluated during training; best kept",
        group="evaluation",
        value="data",
        metavar="FILE",
        pipeline=_EVAL,
    )
    loss: str | None = setting(  # None: the model kind's and run's default (resolved_loss)
        None,
        "loss (default cosent; infonce with --retrieval-train; infonce for multivector models, splade for "
        "sparse models)",
        group="loss",
        metavar="NAME",
        pipeline=_TASK,
    )
    loss_options: dict[str, Any] = field(
        default_factory=dict,
        metadata=about(
            "loss option, e.g. temperature=0.02, symmetric=true, scale=20 (repeatable)",
            group="loss",
            value="option",
            repeat=True,
            metavar="NAME=VALUE",
            name="--loss-option",
            pipeline=_TASK,
        ),
    )
    columns: str | dict[str, str] | None = field(
        default=None,
        metadata=about(
            "column mapping, e.g. '0=sentence1,1=sentence2,2=score'; columns not named keep their standard names "
            "(default: the file's column names)",
            metavar="MAPPING",
            pipeline=_TASK,
        ),
    )
    header: bool | None = setting(  # whether CSV/TSV training files have a header row (None: detected)
        None,
        "the CSV/TSV training files have (--header) or have no (--no-header) header row (default: detected from "
        "the content; names in --columns imply a header)",
        switch=True,
        negatable=True,
        pipeline=_TASK,
    )
    matryoshka_dims: list[int] | None = field(
        default=None,
        metadata=about(
            "train every prefix of these sizes too, e.g. 384,256,128,64 (default: none)",
            group="loss",
            value="int_list",
            metavar="DIMS",
        ),
    )
    matryoshka_weights: list[float] | None = None
    max_seq_length: int | None = setting(
        None,
        "truncate texts to this many tokens (default: the model's)",
        group="model",
        range=POSITIVE_INT,
        metavar="TOKENS",
    )
    # how training files are read (embforge.data.sources): memory, mmap (Arrow cache) or stream
    data_mode: str = setting(
        "memory",
        "memory (default), mmap (an Arrow cache written once, memory-mapped) or stream (read as training goes); "
        "--train may then be a folder of data files or a Hugging Face data set id",
        metavar="MODE",
    )
    max_bad_rows: int = setting(
        0,
        "mmap/stream: skip up to N bad rows (default 0: stop at the first)",
        range=NON_NEGATIVE_INT,
    )
    data_cache: str | None = setting(
        None,
        "mmap: folder for the Arrow cache (default: the datasets cache)",
        metavar="DIR",
    )
    data_split: str = setting("train", "split of a Hugging Face data set id (default train)", metavar="SPLIT")
    # a kind of embforge.kinds.ModelKind: "dense" (Encoder; "bi" also accepted), "cross" (CrossEncoder; losses
    # bce, ce, cosent, mse, listwise), "multivector", "sparse" or "static"
    model_type: str = setting(
        "dense",
        "dense (default; also 'bi'), cross (cross-encoder: a score per pair), multivector (ColBERT: a vector per "
        "token), sparse (SPLADE: an MLM head) or static (token-embedding table, e.g. from distill-static)",
        group="model",
        metavar="KIND",
    )
    # decoder (LLM) backbones: bidirectional instead of causal attention (LLM2Vec), saved in the model's config
    bidirectional: bool = setting(
        False,
        "decoder (LLM) backbones, dense models: attend both ways instead of causally (LLM2Vec), with mean or "
        "last-token pooling; saved with the model (default off: as the model folder says)",
        group="model",
        switch=True,
    )
    # retrieval training (BEIR or SciFact folder): mined negatives, optionally refreshed ANCE-style
    retrieval_train: str | None = setting(
        None,
        "BEIR or SciFact folder: train a retriever on its qrels (default: none)",
        metavar="FOLDER",
        pipeline=_MINE,
    )
    retrieval_split: str = setting(
        "train", "qrels split to train on (default train)", metavar="SPLIT", pipeline=_MINE
    )
    retrieval_eval_split: str | None = setting(
        None,
        "split evaluated (NDCG@10) during training (default: none)",
        group="evaluation",
        metavar="SPLIT",
        pipeline=_EVAL,
    )
    num_negatives: int = setting(
        1, "mined negatives per row, 0 = in-batch only (default 1)", range=NON_NEGATIVE_INT, pipeline=_MINE
    )
    mine_method: str = setting(
        "dense",
        "how negatives are mined (default dense)",
        choices=("dense", "bm25", "hybrid"),
        pipeline=_MINE,
    )
    refresh_negatives_every: int = setting(
        0,
        "re-mine with the current model every N steps (default 0: never)",
        range=NON_NEGATIVE_INT,
        pipeline=_MINE,
    )
    hard_ratio_start: float = setting(
        0.3, "hard-negative ratio at the start (default 0.3)", range=RATIO, metavar="FRACTION", pipeline=_MINE
    )
    hard_ratio_end: float = setting(
        0.9, "hard-negative ratio at the end (default 0.9)", range=RATIO, metavar="FRACTION", pipeline=_MINE
    )
    # a new run in a folder that is not empty: refused unless resumed (config.resume) or emptied first
    overwrite: bool = setting(
        False,
        "delete what an earlier run left in --output before starting (default off: a folder that is not empty is "
        "refused unless --resume continues it)",
        group="output",
        switch=True,
    )
    config: TrainConfig = field(default_factory=TrainConfig)


_SPEC_FIELDS = {f.name for f in dataclasses.fields(RunSpec)} - {"config"}
_CONFIG_FIELDS = set(FLAT_FIELDS)  # TrainConfig's flat fields (each in one of its parts)


def spec_from_dict(values: dict[str, Any], *, source: str = "config") -> RunSpec:
    """Build a :class:`RunSpec` from flat keys (RunSpec and TrainConfig fields); unknown keys are an error."""
    unknown = set(values) - _SPEC_FIELDS - _CONFIG_FIELDS
    if unknown:
        raise ValueError(
            f"{source}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"valid keys: {', '.join(sorted(_SPEC_FIELDS | _CONFIG_FIELDS))}"
        )
    spec_values = {k: v for k, v in values.items() if k in _SPEC_FIELDS}
    if isinstance(spec_values.get("train"), str):
        spec_values["train"] = [spec_values["train"]]
    try:
        config = TrainConfig(**{k: v for k, v in values.items() if k in _CONFIG_FIELDS})
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None
    return RunSpec(**spec_values, config=config)


def load_toml(path: str | Path) -> dict[str, Any]:
    with open(path, "rb") as handle:
        return tomllib.load(handle)
